"""Implementation of the quickstart task (see :mod:`rlzoo.tasks.quickstart`)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA_SOURCE = "rlzoo/quickstart"
OPS = ("first", "last")
WORDS = [str(d) for d in range(10)] + list(OPS)


def answer(op: str, a: int, b: int) -> str:
    return str(a if op == "first" else b)


def build_tokenizer() -> Any:
    """The quickstart's word-level tokenizer: digits and the two operations (plus the specials)."""
    from rlzoo.models.tiny import build_tokenizer as build_word_tokenizer

    return build_word_tokenizer(WORDS)


def build_model(tokenizer: Any, hidden_size: int, num_layers: int, seed: int) -> Any:
    from rlzoo.models.tiny import build_tiny_qwen2

    model, _ = build_tiny_qwen2(
        tokenizer=tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_position_embeddings=64,
        seed=seed,
    )
    return model


def rows(prompts: list[tuple[str, int, int]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{op} {a} {b}"}],
            "ability": "digits",
            "reward_model": {"style": "rule", "ground_truth": answer(op, a, b)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (op, a, b) in enumerate(prompts)
    ]


def prepare(out_dir: Path, params: Any) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    files = {"train": out / "train.parquet", "val": out / "val.parquet", "model": out / "model"}
    if not params.overwrite and all(p.exists() for p in files.values()):
        return files
    out.mkdir(parents=True, exist_ok=True)
    distinct = [(op, a, b) for op in OPS for a in range(10) for b in range(10) if a != b]
    rng = random.Random(params.seed)
    rng.shuffle(distinct)
    val, pool = distinct[: params.val_size], distinct[params.val_size :]
    train = [pool[i % len(pool)] for i in range(params.train_size)]
    rng.shuffle(train)
    pq.write_table(pa.Table.from_pylist(rows(train, "train")), files["train"])
    pq.write_table(pa.Table.from_pylist(rows(val, "val")), files["val"])
    tok = build_tokenizer()
    model = build_model(tok, params.hidden_size, params.num_layers, params.seed)
    model.save_pretrained(files["model"], safe_serialization=True)
    tok.save_pretrained(files["model"])
    model.generation_config.save_pretrained(files["model"])
    return files


def score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
) -> dict[str, Any]:
    words = response.split()
    pred = words[0] if words else ""
    acc = float(pred == str(ground_truth))
    return {"score": acc, "acc": acc, "pred": pred}
