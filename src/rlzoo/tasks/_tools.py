"""Implementation of the tool-use arithmetic task (see :mod:`rlzoo.tasks.tools`): the ``calc`` tool,
the ``tool_arithmetic`` environment, its dataset and its scorer. Pure Python; ``prepare`` imports
the tiny model's builder (torch) when it runs."""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import AgentTurn, EnvStep, Message, Tool
from rlzoo.tasks._stamp import build_task_folder
from rlzoo.tasks.tools import CalcParams, ToolArithmeticParams

# ---------------------------------------------------------------------------------------------
# the calc tool
# ---------------------------------------------------------------------------------------------
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _eval_node(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Div):
            if b == 0:
                raise ValueError("division by zero")
            return a / b
        op = _OPS.get(type(node.op))
        if op is not None:
            return op(a, b)
    raise ValueError(f"not allowed in an expression: {ast.dump(node)[:60]}")


def evaluate(expression: str) -> Fraction:
    """The value of an integer arithmetic expression; ValueError for anything else (never ``eval``)."""
    text = re.sub(r"(?<=\d)\s+(?=\d)", "", expression.strip())  # "1 2 3" -> "123"
    if not text:
        raise ValueError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression!r}: {exc.msg}") from None
    return _eval_node(tree)


def spaced(text: str) -> str:
    """``'579'`` -> ``'5 7 9'`` (digits as separate words; other characters kept)."""
    return " ".join(text.replace(" ", ""))


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


@dataclass
class CalcTool:
    """The ``calc`` tool (see :class:`rlzoo.tasks.tools.CalcParams`)."""

    params: CalcParams
    name: str = "calc"
    description: str = "Evaluate an integer arithmetic expression (+, -, *, /, parentheses)."
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 123 + 456"}},
            "required": ["expression"],
        }
    )
    timeout_s: float = field(init=False)  # from params (the Tool protocol declares it an attribute)

    def __post_init__(self) -> None:
        self.timeout_s = self.params.timeout_s

    def call(self, arguments: Mapping[str, Any]) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ValueError(f"calc needs a string 'expression', got {expression!r}")
        if len(expression) > self.params.max_chars:
            raise ValueError(f"expression longer than {self.params.max_chars} characters")
        expression = expression.strip().removesuffix("=")  # the equals key ends an expression
        out = _show(evaluate(expression))
        if self.params.spaced_digits:
            out, expression = spaced(out), spaced(expression)
        return f"{' '.join(expression.split())} = {out}" if self.params.echo else out


def make_calc(params: CalcParams) -> CalcTool:
    return CalcTool(params)


# ---------------------------------------------------------------------------------------------
# the environment
# ---------------------------------------------------------------------------------------------
def _matched(said: Sequence[str], want: Sequence[str]) -> float:
    """Share of ``want`` that ``said`` repeats in place, over the longer of the two (extra words cost)."""
    return sum(1 for x, y in zip(said, want) if x == y) / max(len(want), len(said), 1)


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def answered(text: str) -> str:
    """The number a turn answers, as digits: those after its last ``Answer:``, and after their last
    ``=`` if any (a repeated ``expression = result`` line answers its result). The environment and
    the ``tool_arithmetic`` scorer both read an answer with it."""
    return _digits(text.split("Answer:")[-1].split("=")[-1])


#: a calc reply that is a number (``5 7 9``), or an echoed line (``1 2 3 + 4 5 6 = 5 7 9``)
_RESULT = re.compile(r"(?:[^=]*=)?[\d\s]+")


class ToolArithmetic:
    """The ``tool_arithmetic`` environment (see :class:`rlzoo.tasks.tools.ToolArithmeticParams`)."""

    def __init__(self, params: ToolArithmeticParams) -> None:
        self.params = params
        self._tools: list[Tool] = (
            [CalcTool(CalcParams(spaced_digits=params.spaced_digits, echo=params.echo))]
            if params.with_tool
            else []
        )
        self.answer: int | None = None
        self.question = ""

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def _number(self, n: int) -> str:
        return spaced(str(n)) if self.params.spaced_digits else str(n)

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        info = row.get("extra_info") or {}
        if "a" not in info or "b" not in info:
            raise ValueError(
                "tool_arithmetic needs the row's extra_info to hold 'a' and 'b' (the tool_arithmetic "
                f"dataset writes them); got extra_info keys {sorted(info)}"
            )
        a, b = int(info["a"]), int(info["b"])
        self.answer = a + b
        messages: list[dict[str, Any]] = []
        if self.params.instructions:
            how = (
                " You may call the calc tool; then give the result as 'Answer: N'."
                if self.params.with_tool
                else " Give the result as 'Answer: N'."
            )
            messages.append({"role": "system", "content": "Add the two numbers." + how})
        self.question = f"{self._number(a)} + {self._number(b)}"
        blanks = " = " + " ".join("?" * len(str(a + b))) if self.params.blanks else ""
        messages.append({"role": "user", "content": self.question + blanks})
        return EnvStep(messages=messages)

    def step(self, turn: AgentTurn) -> EnvStep:
        text = turn.text.split("Answer:")[-1]
        ok = self.answer is not None and answered(turn.text) == str(self.answer)
        reward = 1.0 if ok else 0.0
        info = {"acc": float(ok)}
        calls = [c for c in turn.tool_calls if c.name == "calc" and c.malformed is None]
        call_share = 0.0
        if self.params.call_credit > 0 or self.params.answer_credit > 0:
            said = str(calls[0].arguments.get("expression", "")).split() if calls else []
            call_share = _matched(said, self._call_words()[1:])
            if not self.params.dense:
                reward += self.params.call_credit * call_share
            info["call_match"] = call_share
        results = [  # the calc results the model read (an error message is no result to repeat)
            r
            for c, r in zip(turn.tool_calls, turn.tool_results, strict=False)
            if c.name == "calc" and c.malformed is None and _RESULT.fullmatch(r)
        ]
        if self.params.answer_credit > 0:
            share = _matched(self._words(text), self._words(results[-1]) if results else [])
            info["answer_match"] = share
            if not self.params.dense:
                # x call_share: repeating the result of a call that is not the question earns nothing
                reward += self.params.answer_credit * call_share * share
        if self.params.dense:
            dense = self._dense(turn, results) if turn.turn_tokens else None
            return EnvStep(messages=[], reward=float(ok), done=True, info=info, token_rewards=dense)
        return EnvStep(messages=[], reward=reward, done=True, info=info)

    def solve(self, row: Mapping[str, Any]) -> list[Message]:
        """The task's own solution of ``row`` (:class:`rlzoo.kernel.protocols.Demonstrates`): the
        question, ``calc <question>`` (the plain tool-call format), calc's reply, then the answer as
        the dense shaping wants it (``Answer:`` and calc's line with ``echo``, else the sum); without
        the tool, the answer at once."""
        messages: list[Message] = list(self.reset(row).messages)
        assert self.answer is not None
        if not self._tools:
            return [*messages, {"role": "assistant", "content": f"Answer: {self._number(self.answer)}"}]
        reply = self._tools[0].call({"expression": self.question})
        answer = reply if self.params.echo else self._number(self.answer)
        return [
            *messages,
            {"role": "assistant", "content": f"calc {self.question}"},
            {"role": "tool", "name": "calc", "content": reply},
            {"role": "assistant", "content": f"Answer: {answer}"},
        ]

    def _dense(self, turn: AgentTurn, results: list[str]) -> list[list[float]]:
        """Per-token shaping: the calc turn's words (and its stop token) scored in place against
        ``calc <question>``, the answer's digits (and stop token) against the calc result, each
        token worth credit / (words + 1) (the first turn is the call when no call was made)."""
        p = self.params
        out = [[0.0] * len(t) for t in turn.turn_tokens]

        def score(k: int, want: list[str], credit: float, skip: tuple[str, ...] = ()) -> None:
            words = [w.strip() for w in turn.turn_tokens[k][:-1]]  # the last token is the stop token
            first = next((j for j, w in enumerate(words) if w not in skip), len(words))
            unit = credit / (len(want) + 1)
            for j, w in enumerate(words[first:]):
                out[k][first + j] = unit * float(j < len(want) and w == want[j])
            out[k][-1] = unit * float(len(words) - first == len(want))

        calls = [k for k, t in enumerate(turn.turn_tokens[:-1]) if "".join(t).strip().startswith("calc")]
        # the first turn is scored against the call even when it was no call (an answer given at
        # once), so every finished trajectory teaches the copy from the first step on
        first = calls[0] if calls else 0 if self.params.with_tool and turn.turn == 0 else None
        if first is not None and p.call_credit > 0:
            score(first, self._call_words(), p.call_credit)
        if results and p.answer_credit > 0:
            # echo: "Answer:" and calc's line, as the call is "calc" and the question; else the
            # result's digits, after an "Answer:" the answer may or may not write
            want = ["Answer:", *results[-1].split()] if p.echo else self._words(results[-1])
            score(len(turn.turn_tokens) - 1, want, p.answer_credit, () if p.echo else ("Answer:",))
        return out

    def _call_words(self) -> list[str]:
        """The call asked for: ``calc`` and the question (``a + b``, without the blanks)."""
        return ["calc", *self.question.split()]

    def _words(self, text: str) -> list[str]:
        """What an answer repeats of a calc reply, and what the reply offers: the digits, or every
        word of an echoed ``expression = result`` line."""
        return text.split() if self.params.echo else list(_digits(text))


def make_tool_arithmetic(params: ToolArithmeticParams) -> ToolArithmetic:
    return ToolArithmetic(params)


# ---------------------------------------------------------------------------------------------
# the dataset
# ---------------------------------------------------------------------------------------------
DATA_SOURCE = "rlzoo/tool_arithmetic"
WORDS = (*(str(d) for d in range(10)), "+", "=", "?", "calc", "Answer:")
#: ``<|role|> content``; an assistant turn is closed by ``<eos>`` (the model's stop token), so a
#: tool result or a user reply appends after the sampled ids as the template's delta
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "{% if m['role'] == 'assistant' %}<eos> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> Any:
    """Word-level tokenizer: digits, ``+``, ``calc``, ``Answer:``; roles incl. ``<|tool|>``."""
    from rlzoo.models.tiny import build_tokenizer as build_word_tokenizer

    return build_word_tokenizer(WORDS, CHAT_TEMPLATE, extra_special=("<|tool|>",))


def pairs(
    n: int, digits: int, rng: random.Random, exclude: set[tuple[int, int]], sum_digits: int = 0
) -> list[tuple[int, int]]:
    """``n`` pairs of ``digits``-digit numbers not in ``exclude`` (``sum_digits``: only pairs whose
    sum has that many digits; 0: any)."""
    if sum_digits not in (0, digits, digits + 1):
        raise RlzooError(
            f"tool_arithmetic: sum_digits={sum_digits} is impossible for two {digits}-digit numbers: "
            f"use {digits}, {digits + 1} or 0 (any)"
        )
    lo, hi = 10 ** (digits - 1), 10**digits - 1

    def fits(p: tuple[int, int]) -> bool:
        return p not in exclude and sum_digits in (0, len(str(sum(p))))

    span = range(lo, hi + 1)
    # a small space: refuse one the held-out pairs use up, rather than draw forever
    if n and digits <= 2 and not any(fits((a, b)) for a in span for b in span):
        raise RlzooError(
            f"tool_arithmetic: no {digits}-digit pair is left to draw (sum_digits={sum_digits}, "
            f"{len(exclude)} held out): lower val_size"
        )
    out: list[tuple[int, int]] = []
    while len(out) < n:
        p = (rng.randint(lo, hi), rng.randint(lo, hi))
        if fits(p):
            out.append(p)
    return out


def rows(ps: list[tuple[int, int]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{spaced(str(a))} + {spaced(str(b))}"}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i, "a": a, "b": b},
        }
        for i, (a, b) in enumerate(ps)
    ]


def prepare(out_dir: Path, params: Any) -> dict[str, Path]:
    from rlzoo.models.tiny import build_tiny_qwen2

    def build() -> tuple[list[dict], list[dict], Any, Any]:
        rng = random.Random(params.seed)
        val = pairs(params.val_size, params.digits, rng, set(), params.sum_digits)
        train = pairs(params.train_size, params.digits, rng, set(val), params.sum_digits)
        tok = build_tokenizer()
        model, _ = build_tiny_qwen2(
            tokenizer=tok,
            hidden_size=params.hidden_size,
            num_layers=params.num_layers,
            max_position_embeddings=128,
            seed=params.seed,
        )
        return rows(train, "train"), rows(val, "val"), tok, model

    return build_task_folder(out_dir, "tool_arithmetic", params, build, words=" ".join(WORDS))


# ---------------------------------------------------------------------------------------------
# the scorer
# ---------------------------------------------------------------------------------------------
def score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
) -> dict[str, Any]:
    pred = answered(response)
    acc = float(pred == str(ground_truth))
    return {"score": acc, "acc": acc, "pred": pred}
