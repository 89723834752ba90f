"""AReaL's example agent workflows, one package per SDK (``workflow=areal.workflow.<sdk>.math_agent.MathAgent``)."""
