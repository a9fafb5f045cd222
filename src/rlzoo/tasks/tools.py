"""The tool-use arithmetic task: add two 3-digit numbers, with a ``calc`` tool or without.

Its four parts, each named ``tool_arithmetic`` but the tool:

- dataset ``tool_arithmetic`` writes ``train.parquet`` / ``val.parquet`` (rlzoo's schema, data
  source ``rlzoo/tool_arithmetic``; ``extra_info`` holds ``a`` and ``b``, which the environment
  reads) and ``model/``: a tiny Qwen2 with a word-level tokenizer of digits, ``+``, ``calc`` and
  ``Answer:`` whose chat template closes each assistant turn with ``<eos>`` and renders tool
  results as ``<|tool|> ...`` (so an observation appends as the template's delta after the model's
  stop token; see :mod:`rlzoo.agents.chat`). Numbers are written digit by digit.
- environment ``tool_arithmetic`` asks ``a + b``, offers ``calc`` and rewards the answer turn.
- tool ``calc`` evaluates an integer arithmetic expression (other recipes offer it too:
  ``smollm2_calc_agent``).
- scorer ``tool_arithmetic``: 1.0 when the digits of the final turn (after ``Answer:`` if present)
  equal the ground truth.

Import-light: the params and the registration only; the code is in :mod:`rlzoo.tasks._tools`
(pure Python but for the dataset's model, which imports torch inside ``prepare``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import EnvironmentFactory, ScorerFn, ToolFactory
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._tools"


@dataclass(frozen=True)
class ToolArithmeticDataParams:
    """Tool-use arithmetic: ``a + b`` with ``a``, ``b`` of ``digits`` digits, plus a tiny model.

    Validation pairs are held out from training (no pair appears in both).
    """

    train_size: int = param(4096, ge=1, help="training prompts")
    val_size: int = param(64, ge=1, help="held-out validation prompts")
    digits: int = param(3, ge=1, le=6, help="digits of each number")
    sum_digits: int = param(
        0, ge=0, help="only pairs whose sum has this many digits (digits or digits + 1; 0: any)"
    )
    hidden_size: int = param(64, ge=8, help="hidden size of the tiny model")
    num_layers: int = param(2, ge=1, help="transformer layers of the tiny model")
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the model's initialisation and the data")
    overwrite: bool = param(False, help="rebuild even when the files exist")


@dataclass(frozen=True)
class ToolArithmeticScorerParams:
    """Tool arithmetic scorer: 1.0 when the final turn's digits (after ``Answer:``) equal the sum."""


@dataclass(frozen=True)
class CalcParams:
    """Calculator: evaluates an arithmetic expression (integers, + - * / and parentheses).

    The expression is parsed, never ``eval``'d: anything but integer literals, the four operators,
    unary minus and parentheses is refused with an error the model reads; a trailing ``=`` (the
    equals key) is allowed. Whitespace between
    digits is ignored, so a word-level tokenizer's ``1 2 3 + 4`` is ``123+4``. Division is exact
    (a fraction prints as ``a/b``).
    """

    spaced_digits: bool = param(
        False,
        help="write the result digit by digit ('5 7 9'): for word-level tokenizers that know only digits",
    )
    echo: bool = param(
        False,
        help="reply 'expression = result' (as a calculator's tape prints it) instead of the result alone",
    )
    max_chars: int = param(200, ge=1, help="longest expression accepted (longer: an error the model reads)")
    timeout_s: float = param(2.0, gt=0, help="per-call timeout in seconds")


@dataclass(frozen=True)
class ToolArithmeticParams:
    """Tool-use arithmetic: add two numbers, with or without the ``calc`` tool; one answer ends it.

    ``reset(row)`` reads the row's ``extra_info`` (``a``, ``b``; written by the ``tool_arithmetic``
    dataset) and asks for ``a + b``. With ``with_tool`` it offers ``calc`` (built with
    ``spaced_digits`` as here), and says how to call it in the tool-call format of the recipe
    (``plain``: a turn ``calc <expression>``). The first turn without a tool call is the answer:
    reward 1.0 when its number (the digits after ``Answer:``, or in the whole turn; after the last
    ``=`` when there is one) equals ``a + b``,
    else 0.0 (plus the ``call_credit`` and ``answer_credit`` shaping; the ``acc`` info, which
    the held-out metric reads, stays the exact answer); the episode ends.
    """

    with_tool: bool = param(True, help="offer the calc tool (False: the same task without it)")
    spaced_digits: bool = param(
        True, help="numbers written digit by digit ('1 2 3'), for word-level tokenizers"
    )
    echo: bool = param(
        False,
        help="calc replies 'expression = result' and an answer may repeat that line (the number after its "
        "last '=' is the answer; answer_credit then scores 'Answer: <the reply>' in place). A tiny "
        "model under RL learns to repeat calc's whole line, not a 4-digit sum alone (docs/agents.md)",
    )
    blanks: bool = param(
        False,
        help="ask 'a + b = ? ? ? ?' (one ? per digit of the sum): with echo the question is as long as "
        "calc's line, so the call ('calc a + b') and the answer ('Answer:' and calc's line) repeat the "
        "line before them at one distance, one copy for a tiny model (docs/agents.md)",
    )
    instructions: bool = param(
        False, help="prepend a system message that explains the task and the tool (for instruct models)"
    )
    call_credit: float = param(
        0.0,
        ge=0,
        help="shaping: reward of the answer turn plus call_credit x the share of the question's words "
        "that the first calc call before it repeats in place (0: the answer alone is rewarded)",
    )
    answer_credit: float = param(
        0.0,
        ge=0,
        help="shaping: the answer turn also earns answer_credit x the share of the calc result's digits "
        "it repeats in place x the share of the question the call repeated (0: off; 'acc' stays exact)",
    )
    dense: bool = param(
        False,
        help="pay call_credit and answer_credit per token, each on its own token (EnvStep.token_rewards: "
        "the call's words and stop token in place against 'calc <question>', the answer's against the "
        "calc result; a first turn that is no call is scored as the "
        "call), for a per-token estimator (token_grpo); assumes one token per word (the task's "
        "word-level tokenizer)",
    )


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    registry.register("tool_arithmetic", f"{_IMPL}:prepare", params=ToolArithmeticDataParams)


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    registry.register("tool_arithmetic", f"{_IMPL}:score", params=ToolArithmeticScorerParams)


@hookimpl
def rlzoo_register_environments(registry: Registrar[EnvironmentFactory]) -> None:
    tools = {"offers_tools": True}
    make = f"{_IMPL}:make_tool_arithmetic"
    registry.register("tool_arithmetic", make, params=ToolArithmeticParams, capabilities=tools)


@hookimpl
def rlzoo_register_tools(registry: Registrar[ToolFactory]) -> None:
    registry.register("calc", f"{_IMPL}:make_calc", params=CalcParams)
