"""What the task modules share: the build stamp of a task's prepared files (``NAME_params.json``:
the params the files were built with, so a cache written by other params, or an older task, is
rebuilt rather than reused); :func:`build_splits`, a task's stamped train / val files; and
:func:`build_task_folder`, the folder a synthetic task writes (its splits and its model)."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rlzoo.kernel.errors import RlzooError

T = TypeVar("T")


class BuildStamp:
    def __init__(self, out: Path, name: str, params: Any, **built: Any) -> None:
        """``built``: what the files are besides the params (``model="llama"``): a cache written
        before the task changed it is rebuilt too."""
        self.path = Path(out) / f"{name}_params.json"
        fields = dataclasses.asdict(params)
        key = {k: v for k, v in fields.items() if k != "overwrite"}
        key.update({f"_{k}": v for k, v in built.items()})
        self.key = json.dumps(key, sort_keys=True)
        self.overwrite = bool(fields.get("overwrite", False))

    def current(self, files: Iterable[Path]) -> bool:
        """The files exist, were built with these params, and no rebuild was asked for."""
        fresh = self.path.exists() and self.path.read_text() == self.key
        return not self.overwrite and fresh and all(p.exists() for p in files)

    def write(self) -> None:
        """Record the params, once the files are complete."""
        self.path.write_text(self.key)


def build_splits(
    out_dir: Path,
    name: str,
    params: Any,
    build: Callable[[], tuple[list[dict], list[dict]]],
    *,
    more: Sequence[str] = (),
    **built: Any,
) -> dict[str, Path]:
    """``train.parquet`` and ``val.parquet`` in ``out_dir``: ``build()`` returns ``(train rows, val
    rows)`` and runs only when the folder was not built with these params already (``built``: see
    :class:`BuildStamp`). ``more``: entries of the folder that ``build`` writes itself (returned
    with the splits, and a missing one means a rebuild)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    files = {"train": out / "train.parquet", "val": out / "val.parquet", **{m: out / m for m in more}}
    stamp = BuildStamp(out, name, params, **built)  # files built by other params are rebuilt
    if stamp.current(files.values()):
        return files
    out.mkdir(parents=True, exist_ok=True)
    train, val = build()
    pq.write_table(pa.Table.from_pylist(train), files["train"])
    pq.write_table(pa.Table.from_pylist(val), files["val"])
    stamp.write()
    return files


def build_task_folder(
    out_dir: Path,
    name: str,
    params: Any,
    build: Callable[[], tuple[list[dict], list[dict], Any, Any]],
    **built: Any,
) -> dict[str, Path]:
    """:func:`build_splits` and ``model/`` (weights, tokenizer, generation config) in ``out_dir``:
    ``build()`` returns ``(train rows, val rows, tokenizer, model)``."""
    model_dir = Path(out_dir) / "model"

    def splits_and_model() -> tuple[list[dict], list[dict]]:
        train, val, tok, model = build()
        model.save_pretrained(model_dir, safe_serialization=True)
        tok.save_pretrained(model_dir)
        model.generation_config.save_pretrained(model_dir)
        return train, val

    return build_splits(out_dir, name, params, splits_and_model, more=("model",), **built)


class SplitSizes(Protocol):
    """A dataset's split settings (its params class declares them)."""

    @property
    def train_size(self) -> int: ...
    @property
    def val_size(self) -> int: ...
    @property
    def seed(self) -> int: ...


def held_out_split(distinct: list[T], sizes: SplitSizes, what: str) -> tuple[list[T], list[T]]:
    """(train, val) from ``distinct`` items: ``sizes.val_size`` of them held out, ``train_size``
    training rows drawn (with repeats) from the rest, so no validation item is trained on. ``what``
    names the settings that made ``distinct`` in the error when nothing would be left to train on."""
    train_size, val_size, seed = sizes.train_size, sizes.val_size, sizes.seed
    if val_size >= len(distinct):
        raise RlzooError(
            f"val_size={val_size} leaves nothing to train on: only {len(distinct)} distinct items with {what}"
        )
    rng = random.Random(seed)
    shuffled = list(distinct)
    rng.shuffle(shuffled)
    val, pool = shuffled[:val_size], shuffled[val_size:]
    return [pool[rng.randrange(len(pool))] for _ in range(train_size)], val
