"""Fixtures of the task tests: SmolLM2's real tokenizer (tests/agents/conftest.py)."""

from agents.conftest import smollm2_tokenizer  # noqa: F401
