"""Implementation of the tool-use arithmetic task (see :mod:`rlzoo.tasks.tools`)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.algorithms.functional.agents import answered
from rlzoo.kernel.errors import RlzooError
from rlzoo.tasks._stamp import build_task_folder

DATA_SOURCE = "rlzoo/tool_arithmetic"
WORDS = (*(str(d) for d in range(10)), "+", "=", "?", "calc", "Answer:")
#: ``<|role|> content``; an assistant turn is closed by ``<eos>`` (the model's stop token), so a
#: tool result or a user reply appends after the sampled ids as the template's delta
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "{% if m['role'] == 'assistant' %}<eos> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def spaced(n: int) -> str:
    return " ".join(str(n))


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
            "prompt": [{"role": "user", "content": f"{spaced(a)} + {spaced(b)}"}],
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


def score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
) -> dict[str, Any]:
    pred = answered(response)
    acc = float(pred == str(ground_truth))
    return {"score": acc, "acc": acc, "pred": pred}
