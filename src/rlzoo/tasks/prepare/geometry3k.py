"""Geometry3K (``hiyouga/geometry3k``) -> rlzoo's schema, as verl's ``examples/data_preprocess/geo3k.py``.

Upstream layout: ``images`` (list of images, one diagram), ``problem`` (text that marks the diagram
with ``<image>``), ``answer`` (string); splits train / validation / test (2,101 / 300 / 601).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlzoo.data.schema import IMAGE_PLACEHOLDER, reward_model
from rlzoo.tasks.datasets import Geometry3kParams
from rlzoo.tasks.prepare._common import (
    PrepareError,
    bind_params,
    qa_splits,
    write_qa_rows,
)

logger = logging.getLogger("rlzoo.tasks.prepare")

NAME = "geometry3k"
DATA_SOURCE = "hiyouga/geometry3k"
UPSTREAM_COLUMNS = ("images", "problem", "answer")
#: verl's geo3k instruction, appended to each problem after one space.
INSTRUCTION = (
    r"You FIRST think about the reasoning process as an internal monologue and then provide the "
    r"final answer. The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)


def with_placeholders(problem: str, num_images: int) -> tuple[str, bool]:
    """``problem`` with exactly one ``<image>`` per image (prepended when missing); and whether it changed.

    Upstream problems already start with ``<image>``; a problem whose placeholders do not match its
    images has them removed and ``num_images`` placeholders put in front.
    """
    if problem.count(IMAGE_PLACEHOLDER) == num_images:
        return problem, False
    text = problem.replace(IMAGE_PLACEHOLDER, "").lstrip()
    return IMAGE_PLACEHOLDER * num_images + text, True


def _image_cell(img: Any) -> dict[str, Any]:
    if isinstance(img, dict):
        return {"bytes": img.get("bytes"), "path": img.get("path")}
    if isinstance(img, (bytes, bytearray)):
        return {"bytes": bytes(img), "path": None}
    if isinstance(img, str):
        return {"bytes": None, "path": img}
    raise PrepareError(f"{NAME}: cannot store an image of type {type(img).__name__}")


def prepare(out_dir: Path, params: Any = None) -> dict[str, Path]:
    """Write Geometry3K's splits in rlzoo's schema; returns ``{split: parquet path}``."""
    from datasets import Image, List

    p = bind_params(params, Geometry3kParams, NAME)
    instruction = INSTRUCTION if p.instruction is None else p.instruction
    out: dict[str, Path] = {}
    for written, ds in qa_splits(p, NAME, UPSTREAM_COLUMNS):
        # keep the encoded bytes: no decoding to PIL and back
        ds = ds.cast_column("images", List(Image(decode=False)))
        fixed = [0]

        def convert(
            row: dict[str, Any], idx: int, split: str = written, fixed: list[int] = fixed
        ) -> dict[str, Any]:
            images = [_image_cell(img) for img in row["images"] or []]
            problem, changed = with_placeholders(row["problem"], len(images))
            fixed[0] += changed
            prompt = f"{problem} {instruction}" if instruction else problem
            answer = str(row["answer"])
            return {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": prompt}],
                "images": images,
                "ability": "math",
                "reward_model": reward_model(answer),
                "extra_info": {"split": split, "index": idx, "answer": answer, "question": row["problem"]},
            }

        path = write_qa_rows(ds, convert, out_dir, written, NAME, images=True)  # convert counts what it fixed
        if fixed[0]:
            logger.warning(
                "%s %s: %d problem(s) had no or mismatched %s placeholders; one per image was put in front",
                NAME,
                written,
                fixed[0],
                IMAGE_PLACEHOLDER,
            )
        out[written] = path
    return out
