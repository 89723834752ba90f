"""Math agents written with the langchain SDK (see math_agent.py)."""
