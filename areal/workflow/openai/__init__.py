"""Math agents written with the openai SDK (see math_agent.py)."""
