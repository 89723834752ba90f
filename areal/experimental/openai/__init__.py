"""``from areal.experimental.openai import ArealOpenAI``: AReaL's import path for the in-process client."""

from areal.experimental.openai.client import ArealOpenAI

__all__ = ["ArealOpenAI"]
