"""DAPO-Math-17k (``BytedTsinghua-SIA/DAPO-Math-17k``) -> rlzoo's schema.

The upstream dataset is already in verl's layout: ``data_source`` (``math_dapo``), ``prompt`` (one
user message: ``Solve the following math problem step by step. The last line of your response
should be of the form Answer: $Answer ...``), ``ability`` (``MATH``), ``reward_model``
(``{ground_truth, style}``) and ``extra_info`` (``{index}``, a uuid). Every column is kept as is;
``extra_info.split`` is added. The hub copy repeats each prompt ~100 times; ``dedup`` (default)
keeps the first row of each. :mod:`rlzoo.tasks.prepare.aime2024` reuses :func:`prepare_verl_layout`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlzoo.data.schema import schema_problems
from rlzoo.kernel.errors import raise_problems
from rlzoo.tasks.datasets import DapoMathParams
from rlzoo.tasks.prepare._common import (
    PrepareError,
    bind_params,
    first_of_each_prompt,
    head,
    load_source,
    upstream_splits,
    write_split,
)

NAME = "dapo_math"
UPSTREAM_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def _with_split(row: dict[str, Any], split: str) -> dict[str, Any]:
    extra = dict(row.get("extra_info") or {})
    extra["split"] = split
    return {"extra_info": extra}


def prepare_verl_layout(out_dir: Path, p: Any, name: str) -> dict[str, Path]:
    """Copy a dataset already in verl's layout (prompt, reward_model, ...) into rlzoo's files."""
    dd = load_source(p.source)
    out: dict[str, Path] = {}
    for written, ds in upstream_splits(dd, p, name, UPSTREAM_COLUMNS):
        problems = schema_problems(p.source, ds.features.arrow_schema)
        raise_problems(f"dataset {name!r}", problems, PrepareError)
        if p.dedup:
            ds = first_of_each_prompt(ds)
        ds = head(ds, p.limit)
        ds = ds.map(_with_split, fn_kwargs={"split": written}, keep_in_memory=True)
        out[written] = write_split(ds, out_dir, written, name)
    return out


def prepare(out_dir: Path, params: Any = None) -> dict[str, Path]:
    """Write DAPO-Math-17k in rlzoo's schema; returns ``{split: parquet path}``."""
    return prepare_verl_layout(out_dir, bind_params(params, DapoMathParams, NAME), NAME)
