"""The built-in ``command`` agent against the ``agent`` kind's conformance suite, running the shipped
calc agent (``python -m rlzoo.tasks.calc_agent``) against the suite's stub OpenAI server."""

from __future__ import annotations

import pytest

from rlzoo.testing import AgentConformance

pytest.importorskip("openai")


class TestCommandCalcAgent(AgentConformance):
    name = "command"
    params_overrides = {"argv": ["python", "-m", "rlzoo.tasks.calc_agent"]}
    row = {"prompt_text": "", "ground_truth": "579", "extra_info": {"a": 123, "b": 456}}
    replies = ("Answer: 5 7 9",)  # no tool call: the first reply is the answer
    expected_final_answer = "Answer: 5 7 9"


class TestCommandNoTool(AgentConformance):
    name = "command"
    params_overrides = {"argv": ["python", "-m", "rlzoo.tasks.calc_agent", "--no-tool"]}
    row = {"prompt_text": "", "ground_truth": "1100", "extra_info": {"a": 999, "b": 101}}
    replies = ("1 1 0 0",)
    expected_final_answer = "1 1 0 0"
