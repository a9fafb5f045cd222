"""docs/examples/agent_plugin.py (the outside-package example of docs/agents.md) registers through
the hooks and passes the environment and tool conformance suites."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

from rlzoo.kernel.plugins import PluginManager
from rlzoo.testing import EnvironmentConformance, ToolConformance

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "agent_plugin.py"


def _pm() -> PluginManager:
    pm = PluginManager(load_entrypoints=False)
    pm.register(SimpleNamespace(**runpy.run_path(str(EXAMPLE))), name="my_agents")
    return pm


ROW = {"prompt_text": "", "ground_truth": "", "extra_info": {"index": 3}}


class TestHint(ToolConformance):
    name = "hint"
    cases = (({"guess": -1}, "too low"), ({"guess": 10**6}, "too high"))
    bad_arguments = ({}, {"guess": "x"})

    def plugin_manager(self) -> PluginManager:
        return _pm()


class TestGuessNumber(EnvironmentConformance):
    name = "guess_number"
    row = ROW
    params_overrides = {"high": 2, "max_guesses": 2}
    # by hand: the secret is 1 or 2, so guessing 1 then 2 finds it; guessing 7 twice never does
    episodes = ((ROW, ["1", "2"], 1.0), (ROW, ["7", "7"], 0.0))

    def plugin_manager(self) -> PluginManager:
        return _pm()
