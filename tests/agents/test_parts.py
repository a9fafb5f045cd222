"""The built-in agent parts (calc, tool_arithmetic) against their kinds' conformance suites, and
the hooks that register them."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlzoo.kernel.plugins import PluginManager
from rlzoo.tasks._tools import evaluate
from rlzoo.testing import EnvironmentConformance, ToolConformance


class TestCalc(ToolConformance):
    name = "calc"
    # worked out by hand
    cases = (
        ({"expression": "123 + 456"}, "579"),
        ({"expression": "1 2 3 + 4 5 6"}, "579"),
        ({"expression": "(2 + 3) * -4"}, "-20"),
        ({"expression": "7 / 2"}, "7/2"),
    )
    bad_arguments = ({}, {"expression": "__import__('os')"}, {"expression": "1/0"}, {"expression": 5})


class TestCalcSpaced(ToolConformance):
    name = "calc"
    params_overrides = {"spaced_digits": True}
    cases = (({"expression": "9 9 9 + 1"}, "1 0 0 0"),)


class TestCalcEcho(ToolConformance):
    """echo: the expression as written (spaces normalized), then ``=`` and the result."""

    name = "calc"
    params_overrides = {"spaced_digits": True, "echo": True}
    cases = (
        ({"expression": "1 2 3 +4 5 6"}, "1 2 3 + 4 5 6 = 5 7 9"),
        ({"expression": "9 9 9+1 ="}, "9 9 9 + 1 = 1 0 0 0"),  # the equals key ends the expression
    )


class TestCalcEchoWords(ToolConformance):
    name = "calc"
    params_overrides = {"echo": True}
    cases = (({"expression": " 12 *  3"}, "12 * 3 = 36"),)


ROW1 = {"prompt_text": "", "ground_truth": "579", "extra_info": {"a": 123, "b": 456}}
ROW2 = {"prompt_text": "", "ground_truth": "1100", "extra_info": {"a": 999, "b": 101}}


class TestToolArithmetic(EnvironmentConformance):
    name = "tool_arithmetic"
    row = ROW1
    episodes = (
        (ROW1, ["Answer: 5 7 9"], 1.0),
        (ROW2, ["1 1 0 0"], 1.0),
        (ROW1, ["Answer: 5 7 8"], 0.0),
    )


class TestToolArithmeticEcho(EnvironmentConformance):
    """echo: an answer that repeats calc's line answers the number after its last ``=``."""

    name = "tool_arithmetic"
    row = ROW1
    params_overrides = {"echo": True}
    episodes = (
        (ROW1, ["Answer: 1 2 3 + 4 5 6 = 5 7 9"], 1.0),
        (ROW1, ["1 2 3 + 4 5 6 = 5 7 8"], 0.0),
        (ROW2, ["1 1 0 0"], 1.0),
    )


class TestToolArithmeticWithoutTool(EnvironmentConformance):
    name = "tool_arithmetic"
    row = ROW1
    params_overrides = {"with_tool": False}
    episodes = ((ROW1, ["5 7 9"], 1.0), (ROW2, ["1 1 0 1"], 0.0))

    def test_offers_no_tool(self) -> None:
        assert list(self.make_env().tools()) == []


@pytest.mark.parametrize("text", ["import os", "2 ** 10", "a + 1", "1 +", "", "(1"])
def test_calc_refuses_what_is_not_integer_arithmetic(text: str) -> None:
    with pytest.raises(ValueError):
        evaluate(text)


def test_calc_exact_division() -> None:
    assert evaluate("1 / 3 + 1 / 6") == Fraction(1, 2)


def test_hooks_register_agent_parts() -> None:
    """rlzoo_register_tools and rlzoo_register_environments bring the built-ins."""
    pm = PluginManager()
    assert "calc" in pm.registry("tool")
    assert "tool_arithmetic" in pm.registry("environment")
    assert pm.registry("environment").get("tool_arithmetic").caps.offers_tools


class _BadTool:
    name = "bad tool!"
    description = ""
    parameters = {"type": "object", "properties": {}, "required": ["x"]}
    timeout_s = 0.0

    def call(self, arguments):  # type: ignore[no-untyped-def]
        return 1


def test_tool_problems_name_each_broken_rule() -> None:
    from rlzoo.testing.conformance import tool_problems

    problems = "\n".join(tool_problems(_BadTool()))
    for what in ("must match", "description", "required ['x']", "timeout_s"):
        assert what in problems, problems
    assert "is not a Tool" in tool_problems(object())[0]


class _ToolsUndeclared:
    def reset(self, row):  # type: ignore[no-untyped-def]
        from rlzoo.kernel.protocols import EnvStep

        return EnvStep(messages=[{"role": "user", "content": "hi"}])

    def step(self, turn):  # type: ignore[no-untyped-def]
        from rlzoo.kernel.protocols import EnvStep

        return EnvStep(messages=[], reward=0.0, done=True)

    def tools(self):  # type: ignore[no-untyped-def]
        from rlzoo.tasks._tools import CalcTool
        from rlzoo.tasks.tools import CalcParams

        return [CalcTool(CalcParams())]


def test_environment_suite_catches_undeclared_tools() -> None:
    import rlzoo

    class Plugin:
        @rlzoo.hookimpl
        def rlzoo_register_environments(self, registry):  # type: ignore[no-untyped-def]
            registry.register("undeclared", lambda params: _ToolsUndeclared(), doc="Offers tools, says not.")

    pm = PluginManager(load_entrypoints=False)
    pm.register(Plugin(), name="bad-env")

    class Suite(EnvironmentConformance):
        name = "undeclared"

        def plugin_manager(self) -> PluginManager:
            return pm

    with pytest.raises(AssertionError, match="does not declare offers_tools"):
        Suite().test_tools_are_tools_with_unique_names()
    Suite().test_reset_gives_the_first_observation()  # the rest of it conforms


def test_validate_rules_of_agent_settings() -> None:
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.recipe.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config("quickstart", ["rollout.tools=[calc,calc]"])
    assert "set rollout.environment" in str(err.value) and "calc given more than once" in str(err.value)
    with pytest.raises(ConfigError, match="per_turn_max_tokens: 100 is more than the whole response budget"):
        load_config("quickstart_tools", ["rollout.multi_turn.per_turn_max_tokens=100"])
    with pytest.raises(ConfigError, match="tool_call_format must be one of hermes, plain"):
        load_config("quickstart_tools", ["rollout.multi_turn.tool_call_format=json"])
    load_config("quickstart_tools", [])


def test_validate_refuses_a_tool_named_like_the_environment_s_own() -> None:
    """``tool_arithmetic`` offers calc itself: ``rollout.tools=[calc]`` would replace it (before
    issue 39 validate passed it); without the environment's own, calc from rollout.tools is fine."""
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.recipe.config import load_config

    with pytest.raises(ConfigError, match=r"rollout.tools\[0\]: tool 'calc' is named 'calc', like a tool"):
        load_config("quickstart_tools", ["rollout.tools=[calc]"])
    load_config("quickstart_tools", ["rollout.tools=[calc]", "rollout.environment.with_tool=false"])


class _Quiet:
    description = "A tool."
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    timeout_s = 0.1

    def __init__(self, name: str, value: object, sleep: float = 0.0) -> None:
        self.name, self.value, self.sleep = name, value, sleep

    def call(self, arguments):  # type: ignore[no-untyped-def]
        import time

        if "x" not in arguments:
            raise ValueError("x is required")  # bad arguments are refused: that part conforms
        time.sleep(self.sleep)
        return self.value


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        (_Quiet("returns_int", 42), "returned int, not str"),
        (_Quiet("too_slow", "ok", sleep=0.5), "past its timeout_s of 0.1 s"),  # 5x its timeout
    ],
    ids=["non-string", "overrun"],
)
def test_the_tool_suite_catches_a_non_string_and_an_overrun_without_cases(tool: object, said: str) -> None:
    """Before issue 39 both passed the suite (no cases: nothing called them with valid arguments)."""
    import rlzoo

    class Plugin:
        @rlzoo.hookimpl
        def rlzoo_register_tools(self, registry):  # type: ignore[no-untyped-def]
            registry.register(tool.name, lambda params: tool, doc="A tool under test.")  # type: ignore[attr-defined]

    pm = PluginManager(load_entrypoints=False)
    pm.register(Plugin(), name="quiet-tools")

    class Suite(ToolConformance):
        name = tool.name  # type: ignore[attr-defined]

        def plugin_manager(self) -> PluginManager:
            return pm

    with pytest.raises(AssertionError, match=said):
        Suite().test_a_call_returns_text_within_timeout_s()
    Suite().test_bad_arguments_raise_an_exception_or_return_text()  # the rest of it conforms
