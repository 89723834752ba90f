"""Math agents written with the anthropic SDK (see math_agent.py)."""
