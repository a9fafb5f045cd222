"""GSM8K (``openai/gsm8k``, config ``main``) -> rlzoo's schema, as verl's ``examples/data_preprocess/gsm8k.py``.

Upstream layout: ``question`` and ``answer`` (a worked solution whose last line is ``#### <number>``);
splits train (7,473) / test (1,319).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlzoo.data.schema import reward_model
from rlzoo.tasks.datasets import GSM8KParams
from rlzoo.tasks.prepare._common import (
    bind_params,
    qa_splits,
    write_qa_rows,
)

logger = logging.getLogger("rlzoo.tasks.prepare")

NAME = "gsm8k"
DATA_SOURCE = "openai/gsm8k"
UPSTREAM_COLUMNS = ("question", "answer")
#: verl's gsm8k instruction, appended to each question after one space.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MARKER = "####"


def final_answer(solution: Any) -> str | None:
    """The text after the last ``####`` of a GSM8K solution, without thousands separators.

    ``"... so 72.\\n#### 1,072"`` -> ``"1072"``; None when there is no ``####`` or nothing after it,
    or no solution at all (a null / non-string cell).
    """
    if not isinstance(solution, str) or MARKER not in solution:
        return None
    answer = solution.rsplit(MARKER, 1)[1].strip().replace(",", "")
    return answer or None


def prepare(out_dir: Path, params: Any = None) -> dict[str, Path]:
    """Write GSM8K's splits in rlzoo's schema; returns ``{split: parquet path}``."""
    p = bind_params(params, GSM8KParams, NAME)
    instruction = INSTRUCTION if p.instruction is None else p.instruction
    out: dict[str, Path] = {}
    for written, ds in qa_splits(p, NAME, UPSTREAM_COLUMNS, config=p.config):
        n = len(ds)
        ds = ds.filter(
            lambda row: (
                final_answer(row["answer"]) is not None
                and isinstance(row["question"], str)
                and bool(row["question"].strip())
            ),
            keep_in_memory=True,
        )
        if len(ds) < n:
            logger.warning(
                "%s %s: dropped %d of %d row(s) with no question or no answer with a final '%s <answer>' line",
                NAME,
                written,
                n - len(ds),
                n,
                MARKER,
            )

        def convert(row: dict[str, Any], idx: int, split: str = written) -> dict[str, Any]:
            question = row["question"]
            return {
                "data_source": DATA_SOURCE,
                "prompt": [
                    {"role": "user", "content": f"{question} {instruction}" if instruction else question}
                ],
                "ability": "math",
                "reward_model": reward_model(final_answer(row["answer"]) or ""),
                "extra_info": {"split": split, "index": idx, "answer": row["answer"], "question": question},
            }

        out[written] = write_qa_rows(ds, convert, out_dir, written, NAME)
    return out
