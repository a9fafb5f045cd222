"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def quickstart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart task's data, word-level tokenizer and tiny Llama model (offline), prepared once
    per session; tests read it (``data.dir``) and write their runs elsewhere."""
    from rlzoo.tasks._quickstart import prepare
    from rlzoo.tasks.quickstart import QuickstartDataParams

    out = tmp_path_factory.mktemp("quickstart")
    prepare(out, QuickstartDataParams())
    return out


@pytest.fixture
def hide_distribution(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``hide_distribution("wandb")``: ``importlib.metadata.distribution`` says the package is not
    installed (the way rlzoo checks for an optional package); every other name is looked up."""
    real = md.distribution
    hidden: set[str] = set()

    def distribution(name: str) -> Any:
        if name in hidden:
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "distribution", distribution)
    return hidden.add
