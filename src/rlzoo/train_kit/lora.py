"""LoRA adapters (``trainer.lora``): the train kit every backend that trains adapters composes.

``peft`` injects the adapters **in place**: the actor module keeps its class, its forward and its
HF names, and each targeted linear layer ``X`` becomes a LoRA layer whose tensors are named
``X.base_layer.weight`` (the frozen base), ``X.lora_A.default.weight`` ``[r, in]`` and
``X.lora_B.default.weight`` ``[out, r]``. Those model-relative names are what a train backend pushes
(:func:`adapter_items`) and what a rollout backend built with the same settings (:func:`apply_lora`
on its own copy of the base model) receives, so a push is an ordinary ``update_weights`` of a few
tensors. The reference policy is the actor with its adapters disabled (:class:`AdaptersOff`), not
a second copy of the weights.

Files: :func:`save_adapter` writes a PEFT folder (``adapter_model.safetensors`` +
``adapter_config.json``, loads with ``PeftModel.from_pretrained``); :func:`merged_state_dict` folds
the adapters into the base weights (``W + (alpha / r) B A``, peft's own merge arithmetic) for a
plain HF folder. ``peft`` is imported inside the functions that need it (``pip install rlzoo[lora]``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.kernel.errors import RlzooError, import_optional
from rlzoo.kernel.settings import LORA_ALL_LINEAR, LoraSettings, model_width
from rlzoo.system.digest import file_digest
from rlzoo.train_kit.modes import eval_mode

__all__ = [
    "ADAPTER_NAME",
    "AdaptersOff",
    "adapter_items",
    "apply_lora",
    "base_model_fingerprint",
    "check_target_modules",
    "is_adapter_name",
    "linear_module_names",
    "merged_state_dict",
    "peft_config",
    "save_adapter",
    "settings_record",
]

#: peft's name of the one adapter rlzoo trains (it appears in the in-memory tensor names)
ADAPTER_NAME = "default"
_PEFT_PREFIX = "base_model.model."  # how a PEFT folder prefixes the model-relative names


def _require_peft() -> Any:
    return import_optional("peft", "trainer.lora needs the 'peft' package: pip install rlzoo[lora]")


def settings_record(settings: LoraSettings | None) -> dict[str, Any] | None:
    """The settings as plain JSON (checkpoint metadata), or None for full fine-tuning."""
    if settings is None:
        return None
    out = dataclasses.asdict(settings)
    out["target_modules"] = list(settings.target_modules)
    return out


def peft_config(settings: LoraSettings) -> Any:
    """``peft.LoraConfig`` of ``settings`` (causal LM, no bias, adapters' B zero-initialised)."""
    peft = _require_peft()
    targets: Any = (
        LORA_ALL_LINEAR if settings.target_modules == (LORA_ALL_LINEAR,) else list(settings.target_modules)
    )
    return peft.LoraConfig(
        r=int(settings.rank),
        lora_alpha=float(settings.alpha),
        lora_dropout=float(settings.dropout),
        target_modules=targets,
        exclude_modules=settings.exclude_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def _output_embeddings(model: nn.Module) -> Any:
    get = getattr(model, "get_output_embeddings", None)  # an HF PreTrainedModel's LM head
    return get() if callable(get) else None


def linear_module_names(model: nn.Module) -> list[str]:
    """The last name component of every linear layer of ``model`` but its output embedding (LM
    head): what ``target_modules`` may name, sorted."""
    out_emb = _output_embeddings(model)
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module is not out_emb and name:
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def check_target_modules(model: nn.Module, settings: LoraSettings) -> None:
    """Refuse ``target_modules`` entries that name no linear module of ``model`` but its LM head
    (matched as peft does: a module whose full name is the entry or ends with ``"." + entry``); the
    error lists the model's linear modules; and a rank above the model's width
    (:meth:`~rlzoo.kernel.settings.LoraSettings.width_problem`). Cheap: it walks module names only."""
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    width = model_width(to_dict()) if callable(to_dict) else None
    if width is None:  # no HF config: the widest layer any adapter could sit on
        widths = [min(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
        width = max(widths, default=None)
    problem = None if width is None else settings.width_problem(width, type(model).__name__)
    if problem:
        raise RlzooError(problem)
    if settings.target_modules == (LORA_ALL_LINEAR,):
        if not linear_module_names(model):
            raise RlzooError(f"trainer.lora: {type(model).__name__} has no linear layers to adapt")
        return
    out_emb = _output_embeddings(model)
    names = [n for n, m in model.named_modules() if n and isinstance(m, nn.Linear) and m is not out_emb]
    unknown = [t for t in settings.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if unknown:
        raise RlzooError(
            f"trainer.lora.target_modules: {unknown} name no linear module of {type(model).__name__} (the LM "
            f"head is not adapted); its linear "
            f"modules are {linear_module_names(model)} (or use {LORA_ALL_LINEAR!r})"
        )


def apply_lora(model: nn.Module, settings: LoraSettings, *, seed: int = 0) -> Any:
    """Inject adapters into ``model`` in place and freeze everything else; returns the
    ``peft.PeftModel`` around it (its ``get_base_model()`` is ``model``). Target modules are
    checked first (:func:`check_target_modules`). The adapters' ``A`` are drawn from ``seed``
    alone (the global RNG streams are left as they were), so every backend built from the same
    settings and seed starts from the same adapters."""
    peft = _require_peft()
    check_target_modules(model, settings)
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        wrapped = peft.get_peft_model(model, peft_config(settings), adapter_name=ADAPTER_NAME)
    assert wrapped.get_base_model() is model  # injected in place: names and forward unchanged
    if settings.adapter_path is not None:
        load_adapter(model, settings.adapter_path)
    return wrapped


#: the files of a model folder whose bytes are the base model a LoRA adapter is trained on
_BASE_FILES = ("config.json",)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")


def _model_folder(model_path: str) -> Path | None:
    """The local folder of ``model_path``: itself, or a hub id's snapshot in the local HF cache."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_path, local_files_only=True))
    except Exception:  # not a hub id, or not cached: nothing to fingerprint
        return None


def base_model_fingerprint(model_path: str) -> dict[str, Any] | None:
    """What a LoRA checkpoint records of the base model it was trained on: ``{"path", "files":
    {name: digest}}`` over the folder's ``config.json`` and weights files; None when ``model_path``
    is no local folder nor a cached hub model.

    A file's digest is :func:`rlzoo.system.digest.file_digest`: sha256 of its size and bytes, all of
    them for ``config.json``, 16 evenly spaced 64 KiB chunks of a weights file. Cheap whatever the
    model's size and blind to mtimes (a copy or ``touch`` changes them, not the model); a fine-tune
    or another checkpoint written in place changes every tensor, so the sampled bytes change too.
    """
    folder = _model_folder(model_path)
    if folder is None:
        return None
    names = sorted(
        f.name
        for f in folder.iterdir()
        if f.is_file() and (f.name in _BASE_FILES or f.name.endswith(_WEIGHT_SUFFIXES))
    )
    return {"path": str(model_path), "files": {n: file_digest(folder / n) for n in names}}


def load_adapter(model: nn.Module, folder: str | Path) -> None:
    """Copy a PEFT folder's adapter tensors (``trainer.lora.adapter_path``) into ``model``'s injected
    adapters, which stay trainable; refuses a folder whose tensors do not match them one to one."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(folder).expanduser() / "adapter_model.safetensors"))
    own = {name: t for name, t in model.state_dict().items() if is_adapter_name(name)}
    tensors: dict[str, Tensor] = {}
    for key, t in saved.items():  # "base_model.model.X.lora_A.weight" -> "X.lora_A.default.weight"
        name = key.removeprefix(_PEFT_PREFIX)
        for ab in (".lora_A.", ".lora_B."):
            name = name.replace(ab, f"{ab}{ADAPTER_NAME}.") if f"{ab}{ADAPTER_NAME}." not in name else name
        tensors[name] = t
    extra = sorted(set(tensors) - set(own))
    missing = sorted(set(own) - set(tensors))
    wrong = sorted(n for n in set(own) & set(tensors) if own[n].shape != tensors[n].shape)
    if extra or missing or wrong:
        raise RlzooError(
            f"trainer.lora.adapter_path {str(folder)!r} does not fit this model's adapters: "
            f"{len(missing)} missing (e.g. {missing[:2]}), {len(extra)} unknown (e.g. {extra[:2]}), "
            f"{len(wrong)} of another shape (e.g. {wrong[:2]}); was it trained on this base model with "
            "these trainer.lora settings?"
        )
    model.load_state_dict(tensors, strict=False)


def is_adapter_name(name: str) -> bool:
    """Whether a model-relative tensor name is a LoRA adapter tensor (``...lora_A/B.default...``)."""
    return f".lora_A.{ADAPTER_NAME}." in name or f".lora_B.{ADAPTER_NAME}." in name


def adapter_items(state: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """The adapter tensors of a state dict (or of ``(name, tensor)`` pairs), in order."""
    items = state.items() if isinstance(state, Mapping) else state
    for name, t in items:
        if is_adapter_name(name):
            yield name, t


class AdaptersOff(nn.Module):
    """The reference policy of a LoRA actor: the same module, run with its adapters disabled.

    No weights of its own (the actor is held outside the module tree, so ``parameters()`` is
    empty and nothing here is trained or saved). Each call runs the actor in eval mode inside
    peft's ``disable_adapter()`` and restores the actor's mode afterwards.
    """

    def __init__(self, peft_model: Any) -> None:
        super().__init__()
        object.__setattr__(self, "_peft", peft_model)  # not a submodule

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        wrapped: Any = self.__dict__["_peft"]
        actor = wrapped.get_base_model()
        with eval_mode(actor), wrapped.disable_adapter():
            return actor(*args, **kwargs)


def merged_state_dict(state: Mapping[str, Tensor], settings: LoraSettings) -> dict[str, Tensor]:
    """A plain HF state dict from a LoRA actor's: ``X.weight = W + (B @ A) * alpha / r`` for every
    adapted ``X`` (peft's ``get_delta_weight`` arithmetic, in the base weight's dtype), base names
    without ``.base_layer``, adapter tensors dropped. ``state`` is not modified."""
    scaling = settings.scaling
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if is_adapter_name(name):
            continue
        if ".base_layer." in name:
            prefix, leaf = name.split(".base_layer.", 1)
            if leaf == "weight":
                a = state[f"{prefix}.lora_A.{ADAPTER_NAME}.weight"]  # [r, in]
                b = state[f"{prefix}.lora_B.{ADAPTER_NAME}.weight"]  # [out, r]
                delta = (b.to(t.dtype) @ a.to(t.dtype)) * scaling  # [out, in]
                out[f"{prefix}.weight"] = t + delta.to(t.device)
            else:
                out[f"{prefix}.{leaf}"] = t
            continue
        out[name] = t
    return out


def save_adapter(
    adapter: Iterable[tuple[str, Tensor]], settings: LoraSettings, out_dir: str | Path, *, base_model: str
) -> Path:
    """Write a PEFT adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``) from
    model-relative adapter tensors; ``base_model``: the base model's path or hub id (recorded in the
    config). Loads with ``PeftModel.from_pretrained(base, out_dir)``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        _PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", "."): t.detach().to("cpu").contiguous().clone()
        for name, t in adapter
    }
    if not tensors:
        raise RlzooError("save_adapter: no adapter tensors given")
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = peft_config(settings)
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(out))
    json.loads((out / "adapter_config.json").read_text())  # written and readable
    return out
