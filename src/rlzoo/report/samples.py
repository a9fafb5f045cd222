"""The samples files of a run (written by :mod:`rlzoo.train.samples`): their columns, names and readers.

``RUN_DIR/samples/step_000007.parquet`` (training) and ``RUN_DIR/samples/val/step_000007.parquet``
(validation), one row per sample; :data:`FIELDS` lists the columns.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: the schema metadata key that marks a file as rlzoo's (value: the format version)
MARK = b"rlzoo.samples"
FORMAT = b"1"
#: a step's file, and the temporary name it is written under (the writer's pid at the end)
STEP_FILE = re.compile(r"^step_(\d+)\.parquet$")
TEMP_FILE = re.compile(r"^\.step_\d+\.parquet\.tmp-\d+$")


#: the columns of a samples file, in order, with their Parquet types ("[t]": a list of t)
FIELDS: tuple[tuple[str, str], ...] = (
    ("step", "int64"),
    ("split", "string"),  # "train" | "val"
    ("uid", "string"),  # request_id/index: samples of one prompt share the request_id
    ("request_id", "string"),
    ("data_source", "string"),
    ("prompt", "string"),
    ("response", "string"),
    ("reward", "float64"),  # the sample's reward (sum of its token rewards)
    ("score", "float64"),  # the scorer's score
    ("acc", "float64"),
    ("reward_info", "string"),  # JSON: what the scorer returned (its parts)
    ("failed", "bool"),  # scoring failed
    ("finish_reason", "string"),
    ("truncated", "bool"),  # cut by the length (or turn) limit
    ("response_length", "int32"),  # response tokens (model and environment)
    ("model_tokens", "int32"),
    ("advantage", "float64"),  # mean advantage over the model's tokens (train only)
    ("turns", "int32"),  # model turns (multi-turn; 1 for a single-turn sample)
    ("tool_calls", "int32"),
    ("agent", "string"),  # JSON: the trajectory's record (multi-turn), else null
    ("prompt_ids", "[int32]"),
    ("response_ids", "[int32]"),
    ("tokens", "[string]"),  # each response token's text
    ("model_mask", "[int8]"),  # 1: the model sampled it; 0: an environment or tool wrote it
    ("logprobs", "[float32]"),  # the rollout's log-prob of each response token
    ("versions", "[int32]"),  # the policy version that produced each token (train)
    ("advantages", "[float32]"),  # train
    ("token_rewards", "[float32]"),  # train: the reward on each token (KL penalty included)
)
COLUMNS: tuple[str, ...] = tuple(name for name, _ in FIELDS)


def schema() -> pa.Schema:
    import pyarrow as pa

    def typ(t: str) -> pa.DataType:
        return pa.list_(typ(t[1:-1])) if t.startswith("[") else pa.type_for_alias(t)

    return pa.schema([(name, typ(t)) for name, t in FIELDS], metadata={MARK: FORMAT})


def samples_dir(run_dir: Path, split: str = "train") -> Path:
    return Path(run_dir) / "samples" / ("val" if split == "val" else "")


def step_file(run_dir: Path, step: int, split: str = "train") -> Path:
    return samples_dir(run_dir, split) / f"step_{step:06d}.parquet"


def is_ours(path: Path) -> bool:
    """The file carries rlzoo's samples mark (a file rlzoo wrote)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:
        return False
    return meta.get(MARK) is not None


# ---------------------------------------------------------------------------------------------
# readers (rlzoo view, rlzoo eval, tests)
# ---------------------------------------------------------------------------------------------
def sample_steps(run_dir: Path, split: str = "train") -> list[int]:
    """The steps that have a samples file, ascending."""
    folder = samples_dir(Path(run_dir), split)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for f in folder.iterdir() if (m := STEP_FILE.match(f.name)))


def read_samples(run_dir: Path, step: int | None = None, split: str = "train") -> list[dict[str, Any]]:
    """The rows of one step's samples file (``step``), or of every step, as dicts."""
    import pyarrow.parquet as pq

    steps = [step] if step is not None else sample_steps(run_dir, split)
    rows: list[dict[str, Any]] = []
    for k in steps:
        path = step_file(Path(run_dir), k, split)
        if path.is_file():
            rows += pq.read_table(path).to_pylist()
    return rows
