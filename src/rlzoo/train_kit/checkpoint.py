"""Train kit: checkpoint helpers every train backend composes (safetensors + JSON, written atomically).

No pickle anywhere: tensors go to ``.safetensors`` files, everything else to JSON.

- :func:`save_state_dict` / :func:`load_state_dict`: a model state dict; tensors that share
  storage (tied embeddings) are written once and the aliases recorded in the file's metadata.
- :func:`save_tree` / :func:`load_tree`: any nest of dicts / lists / tuples whose leaves are
  tensors, numpy arrays or JSON scalars (an optimizer ``state_dict()``, RNG states): tensor leaves
  go to ``NAME.safetensors``, the structure (with typed dict keys) to ``NAME.json``.
- :func:`rng_state` / :func:`set_rng_state`: torch CPU / CUDA, python ``random`` and numpy.
- :func:`atomic_dir`: write a checkpoint into ``PATH.tmp``, add the ``COMPLETE`` marker, then
  rename to ``PATH``; :func:`require_complete` rejects a directory without the marker.
- :func:`checkpoint_meta` / :func:`read_checkpoint_meta`: a train checkpoint's ``meta.json``
  (format, version, LR-schedule position, critic flag, the caller's ``extra_state``);
  :func:`check_checkpoint_lora` / :func:`load_adapter_state`: a LoRA checkpoint's settings and
  adapter tensors.
- :func:`save_lora_export` / :func:`save_tokenizer`: what an HF export holds besides the weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
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

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.settings import TrainSpec
from rlzoo.train_kit import lora
from rlzoo.train_kit.update import LRSchedule

__all__ = [
    "COMPLETE_MARKER",
    "IncompleteCheckpointError",
    "atomic_dir",
    "check_checkpoint_lora",
    "checkpoint_meta",
    "load_adapter_state",
    "load_state_dict",
    "load_tree",
    "read_checkpoint_meta",
    "require_complete",
    "rng_state",
    "save_hf_model",
    "save_lora_export",
    "save_state_dict",
    "save_tokenizer",
    "save_tree",
    "set_rng_state",
]

logger = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------
# train checkpoints and HF exports
# ---------------------------------------------------------------------------------------------
def checkpoint_meta(
    fmt: str,
    extra_state: Mapping[str, Any],
    *,
    version: int,
    critic_steps: int,
    schedule: LRSchedule,
    has_critic: bool,
    **more: Any,
) -> dict[str, Any]:
    """``meta.json`` of a train checkpoint: format, version (actor steps), the LR schedule's
    position, critic flag, ``more`` and ``extra_state`` (which must be JSON-serialisable)."""
    try:
        extra = json.loads(json.dumps(dict(extra_state)))
    except (TypeError, ValueError) as e:
        raise TypeError(f"save_checkpoint: extra_state must be JSON-serialisable: {e}") from e
    return {
        "format": fmt,
        "version": version,
        "scheduler": schedule.record(version, critic_steps),
        "has_critic": has_critic,
        **more,
        "extra_state": extra,
    }


def read_checkpoint_meta(path: Path, fmt: str, what: str, *, has_critic: bool) -> dict[str, Any]:
    """``meta.json`` of the complete checkpoint ``path`` of format ``fmt`` (``what``: its name in
    the error, e.g. "a native train"); the critic flag must match ``has_critic``."""
    marker = require_complete(path)
    if marker.get("format") != fmt:
        raise IncompleteCheckpointError(
            f"{str(path)!r} is not {what} checkpoint (format {marker.get('format')!r})"
        )
    meta: dict[str, Any] = json.loads((path / "meta.json").read_text())
    if meta["has_critic"] != has_critic:
        raise ValueError(
            f"checkpoint {str(path)!r} has_critic={meta['has_critic']} but this backend has_critic={has_critic}"
        )
    return meta


def check_checkpoint_lora(path: Path, meta: Mapping[str, Any], settings: Any) -> None:
    """Refuse a checkpoint whose ``trainer.lora`` (``meta["lora"]``) differs from this backend's."""
    saved, mine = meta.get("lora"), lora.settings_record(settings)
    if saved != mine:
        raise ValueError(
            f"checkpoint {str(path)!r} was written with trainer.lora={saved}, this run has trainer.lora={mine}; "
            "resume with the same LoRA settings (a LoRA checkpoint holds the adapter only)"
        )


def load_adapter_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a LoRA checkpoint's adapter tensors into ``module``; every adapter tensor of the module
    must be there and nothing else (the base weights stay those loaded from ``model_path``)."""
    own = {name for name, _ in lora.adapter_items(module.state_dict())}
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise ValueError(
            f"LoRA checkpoint does not match the model's adapters: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    module.load_state_dict(dict(state), strict=False)


def save_hf_model(
    state: Mapping[str, torch.Tensor], model_cls: Any, config: Any, directory: Path, *, what: str
) -> None:
    """``save_pretrained`` into ``directory`` of a fresh ``model_cls(config)`` (built on the meta
    device) holding ``state``; tied embeddings are tied again. Every parameter must be in ``state``
    (``what``: the state's name in the error)."""
    with torch.device("meta"):
        model: Any = model_cls(copy.deepcopy(config))
    model.load_state_dict(dict(state), strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"export_hf: parameters missing from {what}: {missing[:5]}")
    model.save_pretrained(str(directory))


def save_lora_export(
    state: Mapping[str, torch.Tensor], model_cls: Any, config: Any, spec: TrainSpec, directory: Path
) -> None:
    """A LoRA actor's HF export into ``directory``: the merged model (:func:`save_hf_model` of
    :func:`rlzoo.train_kit.lora.merged_state_dict`) and the adapter alone in ``directory/adapter``
    (:func:`rlzoo.train_kit.lora.save_adapter`)."""
    if spec.lora is None:
        raise ValueError("save_lora_export: the spec has no trainer.lora settings (not a LoRA actor)")
    merged = {k: v.detach() for k, v in lora.merged_state_dict(state, spec.lora).items()}
    save_hf_model(merged, model_cls, config, directory, what="the merged LoRA state")
    lora.save_adapter(lora.adapter_items(state), spec.lora, directory / "adapter", base_model=spec.model_path)


def save_tokenizer(tokenizer: Any, spec: TrainSpec, directory: Path) -> None:
    """Save ``tokenizer`` (default: the one at ``spec.model_path``, when it has one) into ``directory``."""
    tok = tokenizer
    if tok is None and spec.model_path:
        try:
            from rlzoo.data.tokenizer import load_tokenizer

            tok = load_tokenizer(spec.model_path, trust_remote_code=spec.trust_remote_code)
        except Exception as e:  # a model directory without tokenizer files
            logger.info("export_hf: no tokenizer saved (%s)", e)
    if tok is not None:
        tok.save_pretrained(str(directory))
