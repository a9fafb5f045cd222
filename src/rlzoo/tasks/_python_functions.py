"""Implementation of the code tasks (see :mod:`rlzoo.tasks.python_functions`). Pure Python but for the
dataset's model (torch, inside ``prepare``); every piece of code runs in the sandbox."""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.algorithms.functional.scoring.code_tests import OUTCOMES, extract_code, parse_tests, run_tests
from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import AgentTurn, EnvStep, Tool
from rlzoo.sandbox import sandbox_for
from rlzoo.tasks._stamp import build_splits, build_task_folder, held_out_split
from rlzoo.tasks.python_functions import (
    PythonFunctionsDataParams,
    PythonFunctionsEnvParams,
    PythonToolParams,
    VerlCodeParams,
)

log = logging.getLogger(__name__)

DATA_SOURCE = "rlzoo/python_functions"
PREFIX = "def f(x):\n    return "
DIGITS = [str(d) for d in range(10)]
WORDS = [*DIGITS, "f", "(", "x", ")", "=", "+", "-", "*"]
Expression = tuple[str, ...]  # the body's words, e.g. ("x", "*", "3")


def expressions(level: int, ops: str) -> list[Expression]:
    """Every distinct body of ``level`` over ``ops``, in a fixed order."""
    if level == 1:
        return [(d,) for d in DIGITS]
    tails = list(itertools.product(ops, DIGITS))
    if level == 2:
        return [("x", op, d) for op, d in tails]
    return [("x", o1, d1, o2, d2) for (o1, d1), (o2, d2) in itertools.product(tails, tails)]


def value(expr: Expression, x: int) -> int:
    """``expr`` at ``x`` with Python's precedence (``*`` before ``+`` / ``-``), computed, never eval'd."""
    terms: list[int] = []  # signed terms of a sum, each a product
    sign, product = 1, None
    for word in expr:
        if word in "+-":
            terms.append(sign * (product if product is not None else 0))
            sign, product = (1 if word == "+" else -1), None
        elif word == "*":
            continue
        else:
            n = x if word == "x" else int(word)
            product = n if product is None else product * n
    terms.append(sign * (product if product is not None else 0))
    return sum(terms)


def row(expr: Expression, split: str, index: int, num_tests: int, rng: random.Random) -> dict[str, Any]:
    xs = rng.sample(range(-9, 10), num_tests)
    truth = {
        "fn_name": "f",
        "inputs": [json.dumps(x) for x in xs],  # prime_code: one JSON value per line per argument
        "outputs": [json.dumps(value(expr, x)) for x in xs],
        "prefix": PREFIX,
    }
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": "f ( x ) = " + " ".join(expr)}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
        "extra_info": {"split": split, "index": index, "expression": " ".join(expr)},
    }


def prepare(out_dir: Path, params: PythonFunctionsDataParams) -> dict[str, Path]:
    def build() -> tuple[list[dict], list[dict], Any, Any]:
        from rlzoo.models.tiny import build_tiny_llama, build_tokenizer

        distinct = expressions(params.level, params.ops)
        if params.level == 1:  # 10 functions: nothing to hold out, validation is all of them
            rng = random.Random(params.seed)
            train_exprs, val_exprs = [rng.choice(distinct) for _ in range(params.train_size)], distinct
        else:
            what = f"level={params.level}, ops={params.ops!r}"
            train_exprs, val_exprs = held_out_split(distinct, params, what)
        rng = random.Random(params.seed + 1)
        train = [row(e, "train", i, params.num_tests, rng) for i, e in enumerate(train_exprs)]
        val = [row(e, "val", i, params.num_tests, rng) for i, e in enumerate(val_exprs)]
        tok = build_tokenizer(WORDS)
        model, _ = build_tiny_llama(
            tokenizer=tok,
            hidden_size=params.hidden_size,
            num_layers=params.num_layers,
            max_position_embeddings=64,
            seed=params.seed,
        )
        return train, val, tok, model

    return build_task_folder(out_dir, "python_functions", params, build, model="llama")


# ---------------------------------------------------------------------------------------------
# a user's code dataset in verl's layout
# ---------------------------------------------------------------------------------------------
def _read_rows(files: Sequence[str], limit: int | None) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for name in files:
        if not Path(name).expanduser().exists():
            raise RlzooError(f"verl_code: no such parquet file {name!r}")
        rows += pq.read_table(Path(name).expanduser()).to_pylist()
    return rows[:limit] if limit is not None else rows


def _checked(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    kept, dropped = [], []
    for i, r in enumerate(rows):
        try:
            if not r.get("prompt"):
                raise ValueError("no prompt")
            parse_tests((r.get("reward_model") or {}).get("ground_truth"))
        except (ValueError, TypeError, AttributeError) as exc:
            dropped.append(f"row {i}: {exc}")
            continue
        info = dict(r.get("extra_info") or {})
        info["split"] = split
        kept.append({**r, "data_source": r.get("data_source") or "code", "extra_info": info})
    if dropped:
        log.warning(
            "verl_code: %d of %d %s rows dropped (tests not readable), e.g. %s",
            len(dropped),
            len(rows),
            split,
            dropped[0],
        )
    if not kept:
        raise RlzooError(f"verl_code: none of the {len(rows)} {split} rows has readable tests: {dropped[:3]}")
    return kept


def prepare_verl_code(out_dir: Path, params: VerlCodeParams) -> dict[str, Path]:
    if not params.train_files:
        raise RlzooError("verl_code needs train_files: parquet files in verl's layout (prompt, reward_model)")

    def build() -> tuple[list[dict], list[dict]]:
        train = _checked(_read_rows(params.train_files, params.limit), "train")
        if params.val_files:
            return train, _checked(_read_rows(params.val_files, params.limit), "val")
        if params.val_size >= len(train):
            raise RlzooError(
                f"verl_code: val_size={params.val_size} leaves nothing of {len(train)} rows to train on"
            )
        random.Random(params.seed).shuffle(train)
        cut = len(train) - params.val_size
        return train[:cut], train[cut:]

    return build_splits(out_dir, "verl_code", params, build)


# ---------------------------------------------------------------------------------------------
# the environment and the tool
# ---------------------------------------------------------------------------------------------
class PythonFunctions:
    """The ``python_functions`` environment (see :class:`PythonFunctionsEnvParams`)."""

    def __init__(self, params: PythonFunctionsEnvParams) -> None:
        self.params = params
        self.sandbox = sandbox_for(params.tests.sandbox)
        self.tests: dict[str, Any] = {}
        self.attempts = 0

    def tools(self) -> Sequence[Tool]:
        return []

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        self.tests = parse_tests((row.get("reward_model") or {}).get("ground_truth"))
        self.attempts = 0
        return EnvStep(messages=list(row["prompt"]))

    async def step(self, turn: AgentTurn) -> EnvStep:
        import asyncio

        self.attempts += 1
        code = self.tests.get("prefix", "") + extract_code(turn.text)
        # the tests run in the sandbox's pool: this episode waits, the event loop does not
        verdicts, _ = await asyncio.to_thread(run_tests, code, self.tests, self.params.tests, self.sandbox)
        counts = {o: float(verdicts.count(o)) for o in OUTCOMES}
        passed = counts["passed"] / len(verdicts)
        info = {"acc": float(passed == 1.0), "attempts": float(self.attempts), **counts}
        if passed == 1.0 or self.attempts >= self.params.max_attempts:
            return EnvStep(messages=[], reward=passed, done=True, info=info)
        first = next(v for v in verdicts if v != "passed")
        reply = f"{int(counts['passed'])} of {len(verdicts)} tests passed; first failure: {first}"
        return EnvStep(messages=[{"role": "user", "content": reply}], info=info)


def make_environment(params: PythonFunctionsEnvParams) -> PythonFunctions:
    return PythonFunctions(params)


@dataclass
class PythonTool:
    """The ``python`` tool (see :class:`rlzoo.tasks.python_functions.PythonToolParams`)."""

    params: PythonToolParams
    name: str = "python"
    description: str = (
        "Run Python code in a sandbox (no network, no files outside it) and read what it printed."
    )
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source; print what you want to read"}
            },
            "required": ["code"],
        }
    )
    timeout_s: float = field(init=False)

    def __post_init__(self) -> None:
        # the sandbox kills the code at its own timeout; the tool's allows for the start-up around it
        self.timeout_s = self.params.sandbox.timeout_s + 5.0
        self.sandbox = sandbox_for(self.params.sandbox)

    async def call(self, arguments: Mapping[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ValueError(f"python needs a string 'code', got {code!r}")
        ex = await self.sandbox.arun(code)
        reply = ex.stdout
        if not ex.ok:
            reply += ex.stderr[-500:]
            reply += f"\n[{ex.outcome.value}]"
        return reply[: self.params.max_chars]


def make_python_tool(params: PythonToolParams) -> PythonTool:
    return PythonTool(params)
