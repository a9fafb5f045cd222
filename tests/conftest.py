"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

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
