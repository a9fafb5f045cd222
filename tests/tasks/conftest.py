"""Fixtures of the task tests: SmolLM2's real tokenizer (tests/agents/conftest.py) and a tiny GGUF file
standing in for SmolLM2's (tests/models/gguf_files.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from agents.conftest import smollm2_tokenizer  # noqa: F401


@pytest.fixture(scope="session")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GGUF model file (skips without the gguf / accelerate packages the conversion needs)."""
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf accelerate)")
    pytest.importorskip(
        "accelerate", reason="the accelerate package is not installed (pip install accelerate)"
    )
    spec = importlib.util.spec_from_file_location(
        "gguf_files", Path(__file__).parents[1] / "models" / "gguf_files.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path_factory.mktemp("tiny_gguf") / "tiny.gguf"
    mod.write_tiny_gguf(path)
    return path
