"""Implementation of the quickstart task (see :mod:`rlzoo.tasks.quickstart`)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.tasks._stamp import build_task_folder

DATA_SOURCE = "rlzoo/quickstart"
OPS = ("first", "last")
LETTERS = ("a", "b", "c", "d", "e", "f")
WORDS = [str(d) for d in range(10)] + list(OPS) + list(LETTERS)
TASKS = ("find", "first_last")

Prompt = tuple[tuple[str, ...], str]  # (the prompt's words, the answer)


def answer(op: str, *digits: int) -> str:
    """The ``first_last`` task's answer: the first or the last digit."""
    return str(digits[0] if op == "first" else digits[-1])


def distinct_prompts(task: str, num_digits: int) -> list[Prompt]:
    """Every distinct prompt of ``task`` with its answer, in a fixed order.

    ``find``: ``num_digits`` words, all letters but one digit (the answer), anywhere.
    ``first_last``: ``first`` / ``last`` then ``num_digits`` different digits.
    """
    if task == "find":
        out: list[Prompt] = []
        for slot in range(num_digits):
            for d in range(10):
                for fill in itertools.product(LETTERS, repeat=num_digits - 1):
                    words = (*fill[:slot], str(d), *fill[slot:])
                    out.append((words, str(d)))
        return out
    if task == "first_last":
        return [
            ((op, *map(str, d)), answer(op, *d))
            for op in OPS
            for d in itertools.permutations(range(10), num_digits)
        ]
    raise ValueError(f"quickstart task must be one of {TASKS}, got {task!r}")


def build_tokenizer() -> Any:
    """The quickstart's word-level tokenizer: digits and the two operations (plus the specials)."""
    from rlzoo.models.tiny import build_tokenizer as build_word_tokenizer

    return build_word_tokenizer(WORDS)


def build_model(tokenizer: Any, hidden_size: int, num_layers: int, seed: int) -> Any:
    from rlzoo.models.tiny import build_tiny_llama

    model, _ = build_tiny_llama(
        tokenizer=tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_position_embeddings=64,
        seed=seed,
    )
    return model


def rows(prompts: list[Prompt], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": " ".join(words)}],
            "ability": "digits",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": i},
        }
        for i, (words, truth) in enumerate(prompts)
    ]


def prepare(out_dir: Path, params: Any) -> dict[str, Path]:
    def build() -> tuple[list[dict], list[dict], Any, Any]:
        distinct = distinct_prompts(params.task, params.num_digits)
        if params.val_size >= len(distinct):
            raise ValueError(
                f"val_size={params.val_size} leaves no training prompts ({len(distinct)} distinct)"
            )
        rng = random.Random(params.seed)
        rng.shuffle(distinct)
        val, pool = distinct[: params.val_size], distinct[params.val_size :]
        train = [pool[i % len(pool)] for i in range(params.train_size)]
        rng.shuffle(train)
        tok = build_tokenizer()
        model = build_model(tok, params.hidden_size, params.num_layers, params.seed)
        return rows(train, "train"), rows(val, "val"), tok, model

    # files built by other params, or with the tiny Qwen2 of earlier versions, are rebuilt
    return build_task_folder(out_dir, "quickstart", params, build, model="llama")


def score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
) -> dict[str, Any]:
    words = response.split()
    pred = words[0] if words else ""
    acc = float(pred == str(ground_truth))
    return {"score": acc, "acc": acc, "pred": pred}
