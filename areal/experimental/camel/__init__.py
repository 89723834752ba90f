"""CAMEL-AI integration: ``openai_model.AReaLOpenAICompatibleModel`` (the CAMEL guide's import path)."""
