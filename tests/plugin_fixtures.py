"""Plugin-manager fixtures shared by tests/kernel, recipe, report, loggers, system, testing, cli and meta
(each folder's conftest.py imports them): fresh plugin managers, fake plugins registered and unregistered."""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterator
from typing import Any

import pytest

import rlzoo
from rlzoo.kernel import plugins as plugins_mod
from rlzoo.kernel.plugins import ENV_ALLOW, ENV_NO_AUTOLOAD, PluginManager

#: A recipe that binds with the built-in parts (no file or model is touched by binding).
MINIMAL_RECIPE: dict[str, Any] = {
    "model": {"path": "tiny-model"},
    "data": {"train_files": ["train.parquet"]},
    "rollout": {"n": 2},
    "reward": {"scorer": "gsm8k"},
}

EXAMPLE_DIST = "rlzoo-example"
INSTALL_EXAMPLE = "pip install -c /tmp/constraints.txt --no-deps -e plugins/rlzoo-example"


def example_installed() -> bool:
    return any(ep.name == "example" for ep in md.entry_points(group="rlzoo"))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No env var of the caller leaks in; the process-wide manager is rebuilt around each test."""
    monkeypatch.delenv(ENV_ALLOW, raising=False)
    monkeypatch.delenv(ENV_NO_AUTOLOAD, raising=False)
    rlzoo.reset_plugin_manager()
    yield
    rlzoo.reset_plugin_manager()


@pytest.fixture
def pm() -> PluginManager:
    """A fresh manager: built-ins plus installed third-party plugins."""
    return PluginManager()


@pytest.fixture
def default_pm(pm: PluginManager, monkeypatch: pytest.MonkeyPatch) -> PluginManager:
    """``pm`` installed as the process-wide manager (what the CLI and build_run use)."""
    monkeypatch.setattr(plugins_mod, "_default", pm)
    return pm


@pytest.fixture
def example() -> None:
    if not example_installed():
        pytest.fail(f"the example plugin is not installed; run: {INSTALL_EXAMPLE}")
