"""The ``smollm2_calc`` dataset and environment (see :mod:`rlzoo.tasks.smollm2_calc`)."""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlzoo.kernel.protocols import AgentResult, AgentTurn, ClientConfig, EnvStep, Message, Tool
from rlzoo.tasks._stamp import BuildStamp, held_out_split

DATA_SOURCE = "rlzoo/smollm2_calc"
SYSTEM = "You can use a calculator: write calc and the expression. Then reply with only the number."
#: the worked example's operands (never a training or validation pair)
EXAMPLE = (12, 34)
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def messages(a: int, op: str, b: int, example: bool = True) -> list[Message]:
    """The first observation: the system prompt, the worked example's turns, the question."""
    out: list[Message] = [{"role": "system", "content": SYSTEM}]
    if example:
        ea, eb = EXAMPLE
        result = str(_OPS[op](ea, eb))
        out += [
            {"role": "user", "content": question(ea, op, eb)},
            {"role": "assistant", "content": f"calc {ea} {op} {eb}"},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": result},
        ]
    out.append({"role": "user", "content": question(a, op, b)})
    return out


def split_pairs(params: Any) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, val) operand pairs: val distinct, neither holds the other's pairs nor the example's."""
    distinct = [
        (a, b)
        for a in range(params.lo, params.hi + 1)
        for b in range(params.lo, params.hi + 1)
        if (a, b) != EXAMPLE
    ]
    return held_out_split(distinct, params, f"lo={params.lo}, hi={params.hi}")


def rows(pairs: Sequence[tuple[int, int]], op: str, split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": messages(a, op, b),
            "ability": "tool_use",
            "reward_model": {"style": "rule", "ground_truth": str(_OPS[op](a, b))},
            "extra_info": {"split": split, "index": i, "a": a, "op": op, "b": b},
        }
        for i, (a, b) in enumerate(pairs)
    ]


def prepare(out_dir: Path, params: Any) -> dict[str, Path]:
    """``train.parquet``, ``val.parquet`` (held-out pairs) and ``model/`` (SmolLM2)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlzoo.tasks._smollm2 import prepare_model

    out = Path(out_dir)
    files = prepare_model(out, params)  # the model first: a missing package fails before any file
    data = {"train": out / "train.parquet", "val": out / "val.parquet"}
    stamp = BuildStamp(out, "smollm2_calc", params)
    if not stamp.current(data.values()):
        out.mkdir(parents=True, exist_ok=True)
        train, val = split_pairs(params)
        pq.write_table(pa.Table.from_pylist(rows(train, params.op, "train")), data["train"])
        pq.write_table(pa.Table.from_pylist(rows(val, params.op, "val")), data["val"])
        stamp.write()
    return {**data, **files}


def last_integer(text: str) -> str | None:
    """The last integer written in ``text`` (thousands commas dropped), as written; None if none."""
    found = re.findall(r"-?\d+", re.sub(r"(?<=\d),(?=\d{3})", "", text))
    return found[-1] if found else None


class SmolLM2Calc:
    """The ``smollm2_calc`` environment (see :class:`rlzoo.tasks.smollm2_calc.SmolLM2CalcEnvParams`)."""

    def __init__(self, params: Any) -> None:
        self.params = params
        self.answer: int | None = None

    def tools(self) -> Sequence[Tool]:
        return []  # calc comes from the recipe's rollout.tools

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        info = row.get("extra_info") or {}
        missing = [k for k in ("a", "op", "b") if k not in info]
        if missing:
            raise ValueError(
                f"smollm2_calc needs the row's extra_info to hold 'a', 'op' and 'b' (the smollm2_calc "
                f"dataset writes them); missing {missing}, got keys {sorted(info)}"
            )
        a, op, b = int(info["a"]), str(info["op"]), int(info["b"])
        if op not in _OPS:
            raise ValueError(f"smollm2_calc: op must be one of {sorted(_OPS)}, got {op!r}")
        self.answer = _OPS[op](a, b)
        return EnvStep(messages=messages(a, op, b, self.params.example))

    def step(self, turn: AgentTurn) -> EnvStep:
        said = last_integer(turn.text)
        ok = self.answer is not None and said is not None and int(said) == self.answer
        calls = [
            r
            for c, r in zip(turn.tool_calls, turn.tool_results, strict=False)
            if c.name == "calc" and c.malformed is None
        ]
        info = {
            "acc": float(ok),
            "called": float(bool(calls)),
            "call_exact": float(bool(calls) and calls[-1].strip() == str(self.answer)),
        }
        return EnvStep(messages=[], reward=1.0 if ok else 0.0, done=True, info=info)


def make_env(params: Any) -> SmolLM2Calc:
    return SmolLM2Calc(params)


class SmolCalcAgent:
    """Plays one episode with :func:`rlzoo.tasks.smol_calc_agent.play` (params:
    :class:`rlzoo.tasks.smollm2_calc.SmolCalcAgentParams`); the recipe's scorer judges its answer."""

    def __init__(self, params: Any) -> None:
        self.params = params

    def run(self, client: ClientConfig, row: Mapping[str, Any]) -> AgentResult:
        from rlzoo.tasks._agents import _client
        from rlzoo.tasks.smol_calc_agent import play

        p = self.params
        answer, info = play(_client(client), client.model, row, tool=p.tool, example=p.example, turns=p.turns)
        return AgentResult(final_answer=answer, info=info)


def make_agent(params: Any) -> SmolCalcAgent:
    return SmolCalcAgent(params)
