"""Fixtures of the recipe tests: tiny inputs built once per session, an offline HF cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _offline_hf_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep datasets' cache out of the home directory and never reach the hub."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty root for rlzoo.models.tiny (each test builds the recipes it needs)."""
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture
def tiny_env(tiny_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``RLZOO_TINY_DIR`` pointing at :func:`tiny_root` (what the tiny override sets read)."""
    monkeypatch.setenv("RLZOO_TINY_DIR", str(tiny_root))
    return tiny_root
