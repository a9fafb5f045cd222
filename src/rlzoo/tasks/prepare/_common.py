"""What every preparer shares: params binding, loading a source, picking splits, writing parquet."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from rlzoo.kernel.errors import ConfigError, RlzooError

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger("rlzoo.tasks.prepare")

P = TypeVar("P")

#: File suffix -> ``datasets`` packaged builder, for single files and globs.
BUILDERS: dict[str, str] = {
    ".parquet": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".arrow": "arrow",
}

# The split a file name stands for (as datasets infers it for folders): first match wins.
_SPLIT_WORDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("train", frozenset({"train", "training"})),
    ("validation", frozenset({"validation", "valid", "val", "dev"})),
    ("test", frozenset({"test", "testing", "eval", "evaluation"})),
)


class PrepareError(RlzooError, ValueError):
    """A dataset could not be prepared (a missing split, an unexpected column layout)."""


def qa_features(*, images: bool = False) -> Any:
    """``datasets`` features of rlzoo's schema for question / answer datasets (extra_info keeps both)."""
    from datasets import Features, Image, List, Value

    columns: dict[str, Any] = {
        "data_source": Value("string"),
        "prompt": List({"role": Value("string"), "content": Value("string")}),
    }
    if images:
        columns["images"] = List(Image())
    columns["ability"] = Value("string")
    columns["reward_model"] = {"style": Value("string"), "ground_truth": Value("string")}
    columns["extra_info"] = {
        "split": Value("string"),
        "index": Value("int64"),
        "answer": Value("string"),
        "question": Value("string"),
    }
    return Features(columns)


def write_qa_rows(
    ds: datasets.Dataset, convert: Any, out_dir: Path, split: str, name: str, *, images: bool = False
) -> Path:
    """``convert(row, index)`` over every row of a question / answer split (its upstream columns
    dropped, rows typed by :func:`qa_features`, no cache file: a row function may count what it
    fixed), written as ``split.parquet``."""
    ds = ds.map(
        convert,
        with_indices=True,
        remove_columns=ds.column_names,
        features=qa_features(images=images),
        keep_in_memory=True,
    )
    return write_split(ds, out_dir, split, name)


def bind_params(params: Any, cls: type[P], name: str) -> P:
    """``params`` as an instance of ``cls``: an instance, None (defaults) or a mapping."""
    if isinstance(params, cls):
        return params
    if params is None:
        return cls()
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        params = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    if not isinstance(params, Mapping):
        raise TypeError(f"dataset {name!r}: params must be {cls.__name__}, a mapping or None, got {params!r}")
    from rlzoo.kernel.binding import bind_dataclass

    problems: list[str] = []
    bound = bind_dataclass(cls, params, "", problems, what=f"dataset {name!r}")
    if problems:
        raise ConfigError(problems, header=f"cannot prepare {name!r}")
    return bound  # type: ignore[no-any-return]


def split_specs(splits: str | list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """``["train", "train:test"]`` or ``"train,test"`` -> ``[(upstream, written), ...]``."""
    items = splits.split(",") if isinstance(splits, str) else list(splits)
    out: list[tuple[str, str]] = []
    for raw in items:
        item = str(raw).strip()
        if not item:
            continue
        upstream, _, written = item.partition(":")
        out.append((upstream.strip(), (written or upstream).strip()))
    if not out:
        raise PrepareError(f"no splits to prepare (splits={splits!r})")
    targets = [w for _, w in out]
    if len(set(targets)) != len(targets):
        raise PrepareError(f"two splits would be written to the same file: {targets}")
    return out


def split_of_file(path: str | Path) -> str:
    """The split a data file's name stands for (``test-00000-of-00001.parquet`` -> ``test``)."""
    words = set(re.split(r"[^a-z0-9]+", Path(path).name.lower()))
    for split, names in _SPLIT_WORDS:
        if words & names:
            return split
    return "train"


def _builder(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in BUILDERS:
        raise PrepareError(
            f"{path}: cannot tell the file format from the suffix {suffix!r}; "
            f"supported: {', '.join(sorted(BUILDERS))}"
        )
    return BUILDERS[suffix]


def load_source(source: str, *, config: str | None = None) -> datasets.DatasetDict:
    """Load every split of ``source`` with ``datasets.load_dataset``.

    ``source`` is a hub dataset name, a local folder (a downloaded hub repository, or any folder
    of data files whose names say their split), a single local file (its name says its split,
    ``train`` otherwise) or a glob of local files. ``config`` selects a hub config (``main``); for
    a folder without config metadata, a sub-folder of that name is used when there is one.
    """
    import datasets

    path = Path(source).expanduser()
    if path.exists() or any(ch in source for ch in "*?["):
        try:
            return _load_local(source, path, config)
        except PrepareError:
            raise
        except Exception as exc:  # a file that is not what its suffix says: its reader's reason, no traceback
            raise PrepareError(
                f"{source}: cannot read it as a dataset ({_root_cause(exc)}); give the upstream dataset "
                "as a folder or a parquet / json / jsonl / csv file (see docs/data.md)"
            ) from None
    if source.startswith((".", "/", "~")) or Path(source).suffix.lower() in BUILDERS:
        raise PrepareError(f"{source}: no such file or folder")
    unreachable = hub_unreachable()
    if unreachable:  # before datasets' retries (~30 s of them) and its traceback
        raise PrepareError(_offline_message(source, unreachable))
    try:
        return datasets.load_dataset(source, config)  # a hub name
    except ConnectionError as exc:  # datasets' own: the hub went away, or offline without a cached copy
        raise PrepareError(_offline_message(source, str(exc))) from None


def _load_local(source: str, path: Path, config: str | None) -> datasets.DatasetDict:
    """:func:`load_source` of a local file, folder or glob."""
    import datasets

    if path.is_file():
        return datasets.load_dataset(_builder(path), data_files={split_of_file(path): str(path)})
    if any(ch in source for ch in "*?[") and not path.exists():
        files = sorted(glob.glob(str(path)))
        if not files:
            raise PrepareError(f"no file matches {source!r}")
        by_split: dict[str, list[str]] = {}
        for f in files:
            by_split.setdefault(split_of_file(f), []).append(f)
        return datasets.load_dataset(_builder(Path(files[0])), data_files=by_split)
    if path.is_dir():
        if config is None:
            return datasets.load_dataset(str(path))
        try:
            return datasets.load_dataset(str(path), config)
        except ValueError:  # no such config in a plain folder
            if (path / config).is_dir():
                return datasets.load_dataset(str(path), data_dir=config)
            return datasets.load_dataset(str(path))
    raise PrepareError(f"{source}: no such file or folder")


def _root_cause(exc: BaseException) -> str:
    """The innermost explicit cause of ``exc`` (datasets wraps the reader's own error in
    ``raise ... from``), as one line."""
    seen = {id(exc)}
    while (inner := exc.__cause__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _truthy_env(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub (``HF_ENDPOINT``, default huggingface.co) cannot be reached, from
    one TCP connection attempt; None when it can, or when the check does not apply (offline mode is
    on, so ``datasets`` reads its cache; a proxy is set, so a direct connection says nothing)."""
    if _truthy_env("HF_HUB_OFFLINE") or _truthy_env("HF_DATASETS_OFFLINE"):
        return None
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"{host}: {exc.strerror or exc}"
    return None


def _offline_message(source: str, why: str) -> str:
    return (
        f"cannot download {source!r}: the Hugging Face hub cannot be reached ({why}).\n"
        f"  Download it where the hub is reachable (huggingface-cli download {source} --repo-type dataset "
        "--local-dir DIR) and pass the copy: source=DIR (a folder, or a parquet / json file); a copy "
        "already in the Hugging Face cache loads with HF_HUB_OFFLINE=1"
    )


def pick_split(dd: Any, upstream: str, name: str, source: str) -> datasets.Dataset:
    if upstream not in dd:
        raise PrepareError(
            f"dataset {name!r}: split {upstream!r} is not in {source}; available splits: "
            f"{', '.join(dd)}. Choose with splits=[...] (e.g. splits=[{next(iter(dd), 'train')}])"
        )
    return dd[upstream]


def require_columns(ds: datasets.Dataset, columns: tuple[str, ...], name: str, source: str) -> None:
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise PrepareError(
            f"dataset {name!r}: {source} has no column(s) {', '.join(repr(c) for c in missing)}; "
            f"found {', '.join(ds.column_names)}. The {name} preparer expects the upstream layout "
            f"with columns {', '.join(columns)} (see docs/data.md)"
        )


def upstream_splits(
    dd: Any, p: Any, name: str, columns: tuple[str, ...]
) -> Iterator[tuple[str, datasets.Dataset]]:
    """``(written name, upstream split)`` for each of ``p.splits`` (:func:`split_specs`), one at a
    time: the split picked from ``dd`` and checked to have the upstream ``columns``."""
    for upstream, written in split_specs(p.splits):
        ds = pick_split(dd, upstream, name, p.source)
        require_columns(ds, columns, name, p.source)
        yield written, ds


def qa_splits(
    p: Any, name: str, columns: tuple[str, ...], **load_kw: Any
) -> Iterator[tuple[str, datasets.Dataset]]:
    """``(written name, split)`` for each of ``p.splits``: loaded from ``p.source`` (``load_kw``:
    :func:`load_source`'s), checked to have the upstream ``columns``, cut to ``p.limit`` rows."""
    dd = load_source(p.source, **load_kw)
    for written, ds in upstream_splits(dd, p, name, columns):
        yield written, head(ds, p.limit)


def head(ds: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    if limit is None or limit >= len(ds):
        return ds
    if limit < 0:
        raise PrepareError(f"limit must be >= 0, got {limit}")
    return ds.select(range(limit))


def prompt_key(prompt: Any) -> bytes:
    """A digest of a chat prompt (roles and contents) used to find repeated prompts."""
    if isinstance(prompt, list):
        prompt = [{"role": m.get("role"), "content": m.get("content")} for m in prompt]
    return hashlib.blake2b(json.dumps(prompt, sort_keys=True).encode(), digest_size=16).digest()


def first_of_each_prompt(ds: datasets.Dataset, column: str = "prompt") -> datasets.Dataset:
    """Keep the first row of each distinct prompt (order preserved)."""
    seen: set[bytes] = set()
    keep: list[int] = []
    i = 0
    for batch in ds.select_columns([column]).iter(batch_size=10_000):
        for prompt in batch[column]:
            k = prompt_key(prompt)
            if k not in seen:
                seen.add(k)
                keep.append(i)
            i += 1
    if len(keep) == len(ds):
        return ds
    logger.info(
        "dedup: kept %d of %d rows (%d repeated prompts dropped)", len(keep), len(ds), len(ds) - len(keep)
    )
    return ds.select(keep)


def write_split(ds: datasets.Dataset, out_dir: Path, split: str, name: str) -> Path:
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{split}.parquet"
    ds.to_parquet(str(path))
    logger.info("%s: wrote %d rows of split %r to %s", name, len(ds), split, path)
    return path
