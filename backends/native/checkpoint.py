"""Safetensors checkpoint helpers, shared by the train backends (native now, fsdp2 later).

No pickle anywhere: tensors go to ``.safetensors`` files, everything else to JSON.

- :func:`save_state_dict` / :func:`load_state_dict`: a model state dict; tensors that share
  storage (tied embeddings) are written once and the aliases recorded in the file's metadata.
- :func:`save_tree` / :func:`load_tree`: any nest of dicts / lists / tuples whose leaves are
  tensors, numpy arrays or JSON scalars (an optimizer ``state_dict()``, RNG states): tensor leaves
  go to ``NAME.safetensors``, the structure (with typed dict keys) to ``NAME.json``.
- :func:`rng_state` / :func:`set_rng_state`: torch CPU / CUDA, python ``random`` and numpy.
- :func:`atomic_dir`: write a checkpoint into ``PATH.tmp``, add the ``COMPLETE`` marker, then
  rename to ``PATH``; :func:`require_complete` rejects a directory without the marker.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rlzoo.errors import RlzooError

__all__ = [
    "COMPLETE_MARKER",
    "IncompleteCheckpointError",
    "atomic_dir",
    "load_state_dict",
    "load_tree",
    "require_complete",
    "rng_state",
    "save_state_dict",
    "save_tree",
    "set_rng_state",
]

COMPLETE_MARKER = "COMPLETE"
_ALIASES_KEY = "rlzoo_aliases"


class IncompleteCheckpointError(RlzooError):
    """A checkpoint directory that is missing, half written, or not a checkpoint."""


# ---------------------------------------------------------------------------------------------
# model state dicts
# ---------------------------------------------------------------------------------------------
def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def save_state_dict(state_dict: Mapping[str, torch.Tensor], file: str | Path) -> None:
    """Write a state dict to one safetensors file (CPU copies; tied tensors stored once)."""
    seen: dict[tuple[Any, ...], str] = {}
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state_dict.items():
        key = _storage_key(t)
        if key in seen:  # the same view of the same storage: a tied weight
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().to("cpu").contiguous().clone()
    save_file(tensors, str(file), metadata={_ALIASES_KEY: json.dumps(aliases), "format": "pt"})


def load_state_dict(file: str | Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Read a file written by :func:`save_state_dict`; aliases come back under every name."""
    with safe_open(str(file), framework="pt", device=str(device)) as f:
        meta = f.metadata() or {}
        out = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a Mapping)
    for alias, target in json.loads(meta.get(_ALIASES_KEY, "{}")).items():
        out[alias] = out[target]
    return out


# ---------------------------------------------------------------------------------------------
# nests of tensors + JSON leaves (optimizer state, RNG)
# ---------------------------------------------------------------------------------------------
def _encode(obj: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError(f"cannot save a dict key of type {type(k).__name__} at {path!r}")
            items.append([k, _encode(v, tensors, f"{path}.{k}")])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        enc = [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
        return {"__tuple__": enc} if isinstance(obj, tuple) else {"__list__": enc}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot save a leaf of type {type(obj).__name__} at {path!r} (no pickle here)")


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        if "__dict__" in obj:
            return {k: _decode(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if "__list__" in obj:
            return [_decode(v, tensors) for v in obj["__list__"]]
        raise ValueError(f"unknown node in a saved tree: {sorted(obj)}")
    return obj


def save_tree(tree: Any, directory: str | Path, name: str) -> None:
    """Write ``tree`` as ``directory/name.safetensors`` (tensor leaves) + ``directory/name.json``."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(tree, tensors, name)
    save_file(tensors, str(Path(directory) / f"{name}.safetensors"))
    (Path(directory) / f"{name}.json").write_text(json.dumps(structure))


def load_tree(directory: str | Path, name: str) -> Any:
    """Read what :func:`save_tree` wrote (tensors on CPU)."""
    tensors = load_file(str(Path(directory) / f"{name}.safetensors"))
    structure = json.loads((Path(directory) / f"{name}.json").read_text())
    return _decode(structure, tensors)


# ---------------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from: torch CPU / CUDA, python ``random``, numpy."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA only where saved and available)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


# ---------------------------------------------------------------------------------------------
# atomic directories
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_dir(path: str | Path, marker: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """Yield a scratch directory ``PATH.tmp``; on success mark it complete and rename it to ``PATH``.

    The ``COMPLETE`` marker is written last, inside the scratch directory, and the directory is
    renamed only then: a crash at any point leaves either the previous ``PATH`` untouched or a
    ``PATH.tmp`` that :func:`require_complete` would reject. An existing ``PATH`` is replaced.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir_files(tmp)
    (tmp / COMPLETE_MARKER).write_text(json.dumps(dict(marker or {})))
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)


def _fsync_dir_files(directory: Path) -> None:
    for f in directory.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def require_complete(path: str | Path) -> dict[str, Any]:
    """The marker's content; raises :class:`IncompleteCheckpointError` unless ``path`` is complete."""
    path = Path(path)
    if not path.is_dir():
        raise IncompleteCheckpointError(f"checkpoint {str(path)!r} does not exist or is not a directory")
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        raise IncompleteCheckpointError(
            f"checkpoint {str(path)!r} has no {COMPLETE_MARKER} marker: it was not completely written "
            "(interrupted save?) or is not an rlzoo checkpoint; resume from an earlier one"
        )
    text = marker.read_text().strip()
    return dict(json.loads(text)) if text else {}
