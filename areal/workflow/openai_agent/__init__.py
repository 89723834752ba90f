"""Math agents written with the openai_agent SDK (see math_agent.py)."""
