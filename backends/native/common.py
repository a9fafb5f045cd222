"""Plain helpers shared by the native and fsdp2 train backends (no process-group code here).

Model loading, the temperature rule, sum_pi_squared from logits, the LR schedule and its checkpoint
record, checkpoint metadata checks, the tokenizer saved next to an HF export, and the optimizer step
that skips non-finite updates. Each backend keeps its own collectives around them.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.backends.native import checkpoint as ckpt
from rlzoo.protocols import TrainSpec

__all__ = [
    "check_checkpoint_lora",
    "checkpoint_meta",
    "clip_grad_norm",
    "critic_backbone",
    "critic_update",
    "hf_kwargs",
    "load_adapter_state",
    "load_backbone",
    "load_causal_lm",
    "optimizer_step",
    "policy_update",
    "read_checkpoint_meta",
    "resolve_temperature",
    "save_lora_export",
    "save_tokenizer",
    "scheduled_lr",
    "select_model",
    "step_metrics",
    "sum_pi_squared",
    "warmup_steps",
]

logger = logging.getLogger(__name__)


# -- configuration --------------------------------------------------------------------------------
def resolve_temperature(params: Any, spec: Any) -> float:
    """``params.temperature`` when set, else the rollout's (``spec.temperature``)."""
    return float(params.temperature if params.temperature is not None else spec.temperature)


def warmup_steps(spec: TrainSpec) -> int:
    """``spec.optim.warmup_steps``, else ``warmup_ratio`` of ``spec.total_steps`` (optimizer steps)."""
    optim = spec.optim
    return int(optim.warmup_steps or int(optim.warmup_ratio * max(1, spec.total_steps)))


def scheduled_lr(spec: TrainSpec, warmup: int, step: int, *, critic: bool = False) -> float:
    """The LR of optimizer step ``step`` (0-based) of the actor or the critic (see ``lr_multiplier``)."""
    from rlzoo.backends.native.train import lr_multiplier

    optim = spec.optim
    peak = optim.critic_lr if critic else optim.lr
    return float(
        peak
        * lr_multiplier(
            step,
            schedule=optim.lr_scheduler,
            warmup_steps=warmup,
            total_steps=max(1, spec.total_steps),
            min_lr_ratio=optim.min_lr_ratio,
        )
    )


# -- loading --------------------------------------------------------------------------------------
def hf_kwargs(params: Any, spec: Any, dtype: torch.dtype) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments: dtype, ``trust_remote_code``, attention implementation."""
    kw: dict[str, Any] = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    if params.attn_implementation is not None:
        kw["attn_implementation"] = params.attn_implementation
    return kw


def load_causal_lm(path: str, kwargs: Mapping[str, Any], *, vision: bool = True) -> Any:
    """``AutoModelForCausalLM``, or (``vision=True``) ``AutoModelForImageTextToText`` when the
    config at ``path`` has a vision part."""
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM
    if vision:
        from rlzoo.backends.native.multimodal import has_vision_config

        if has_vision_config(path, bool(kwargs.get("trust_remote_code", False))):
            from transformers import AutoModelForImageTextToText

            auto = AutoModelForImageTextToText
    return auto.from_pretrained(path, **kwargs)


def load_backbone(path: str, kwargs: Mapping[str, Any]) -> Any:
    """``AutoModel`` (the base transformer, no LM head): the critic's backbone."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, **kwargs)


def critic_backbone(
    spec: Any, override: Any, actor: Any, *, given_model: bool, kwargs: Mapping[str, Any]
) -> Any:
    """The critic's backbone: ``override``, else loaded from ``spec.critic_model_path`` (or
    ``spec.model_path`` when the actor was loaded too), else a copy of the given actor's base model."""
    if override is not None:
        return override
    if spec.critic_model_path is not None or not given_model:
        return load_backbone(spec.critic_model_path or spec.model_path, kwargs)
    return copy.deepcopy(actor.base_model)


def select_model(model: str, actor: nn.Module, ref: nn.Module | None) -> nn.Module:
    """The module ``compute_log_probs(model=...)`` runs: "actor" or "ref" (an error when absent)."""
    if model == "actor":
        return actor
    if model == "ref":
        if ref is None:
            raise ValueError("compute_log_probs(model='ref'): no reference model (spec.need_reference=False)")
        return ref
    raise ValueError(f"compute_log_probs: model must be 'actor' or 'ref', got {model!r}")


# -- forward outputs ------------------------------------------------------------------------------
def sum_pi_squared(logits: Tensor, *, temperature: float = 1.0, chunk_tokens: int = 1024) -> Tensor:
    """``sum_v pi_v^2`` ``[B, T]`` of ``pi = softmax(logits / temperature)`` (``logits`` ``[B, T, V]``).

    ``exp(logsumexp(2 z) - 2 logsumexp(z))`` with ``z = logits / temperature`` in fp32 (the form
    verl's ``calculate_sum_pi_squared_from_logits`` uses; no softmax is materialised), over at most
    ``chunk_tokens`` positions of one row at a time, so the extra memory is ``[chunk_tokens, V]``
    (``logits`` may be a strided slice; it is not copied whole).
    """
    rows, width = logits.shape[0], logits.shape[1]
    out = torch.empty((rows, width), dtype=torch.float32, device=logits.device)  # [B, T]
    step = max(1, chunk_tokens)
    for i in range(rows):
        for start in range(0, width, step):
            z = logits[i, start : start + step].float()  # [c, V]
            if temperature != 1.0:
                z = z / temperature
            out[i, start : start + step] = torch.exp(
                torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1)
            )
    return out


# -- updates --------------------------------------------------------------------------------------
def clip_grad_norm(module: nn.Module, grad_clip: float, device: torch.device) -> Tensor:
    """Clip the gradients of ``module`` to ``grad_clip`` (no clipping when <= 0); the total norm.

    A plain tensor also for sharded (DTensor) gradients; zero when no parameter has a gradient.
    """
    grads = [p for p in module.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    norm = torch.nn.utils.clip_grad_norm_(grads, grad_clip if grad_clip > 0 else math.inf)
    full = getattr(norm, "full_tensor", None)  # a DTensor (FSDP2): the global norm
    return full() if full is not None else norm  # type: ignore[no-any-return]


def optimizer_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    loss: Tensor,
    grad_clip: float,
    lr: float,
    device: torch.device,
    agree: Callable[[bool], bool] | None = None,
) -> tuple[float, float, bool]:
    """Clip, then step at ``lr`` unless the loss or grad norm is not finite; drop the gradients.

    ``agree(bad)`` turns this process's verdict into the one every rank acts on (default: as is).
    Returns ``(loss, grad_norm, skipped)``.
    """
    grad_norm = clip_grad_norm(module, grad_clip, device)
    loss_value, norm_value = float(loss), float(grad_norm)
    bad = not (math.isfinite(loss_value) and math.isfinite(norm_value))
    skipped = agree(bad) if agree is not None else bad
    if not skipped:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, norm_value, skipped


def policy_update(backend: Any, mini_batch: Any, objective: Any) -> dict[str, float]:
    """``backend.update_policy``: one actor step through ``backend._update`` at ``lr_at(version)``;
    ``version`` counts the steps not skipped."""
    needs_entropy = bool(getattr(objective, "needs_entropy", False))
    temp = backend.temperature

    def forward(mb: Any) -> tuple[Tensor, Tensor | None]:
        return backend._actor_forward(  # type: ignore[no-any-return]
            backend.actor, mb, with_entropy=needs_entropy, temperature=temp
        )

    metrics: dict[str, float] = backend._update(
        mini_batch,
        objective,
        forward,
        module=backend.actor,
        optimizer=backend.optimizer,
        lr=backend.lr_at(backend.version),
        grad_clip=backend.spec.optim.grad_clip,
        prefix="actor",
    )
    if not metrics["actor/skipped_steps"]:
        backend.version += 1
    return metrics


def critic_update(backend: Any, mini_batch: Any, objective: Any) -> dict[str, float]:
    """``backend.update_critic``: one critic step through ``backend._update`` (the objective gets
    ``(micro_batch, values, None)``); ``critic_steps`` counts the steps not skipped."""
    if backend.critic is None or backend.critic_optimizer is None:
        raise ValueError("update_critic: no critic (spec.need_critic=False)")

    def forward(mb: Any) -> tuple[Tensor, Tensor | None]:
        return backend._critic_forward(mb), None

    metrics: dict[str, float] = backend._update(
        mini_batch,
        objective,
        forward,
        module=backend.critic,
        optimizer=backend.critic_optimizer,
        lr=backend.lr_at(backend.critic_steps, critic=True),
        grad_clip=backend.spec.optim.critic_grad_clip,
        prefix="critic",
    )
    if not metrics["critic/skipped_steps"]:
        backend.critic_steps += 1
    return metrics


def step_metrics(
    prefix: str, *, loss: float, grad_norm: float, lr: float, skipped: bool, num_micro_batches: int
) -> dict[str, float]:
    """The ``{prefix}/...`` metrics every update returns."""
    return {
        f"{prefix}/loss": loss,
        f"{prefix}/grad_norm": grad_norm,
        f"{prefix}/lr": lr,
        f"{prefix}/skipped_steps": float(skipped),
        f"{prefix}/num_micro_batches": float(num_micro_batches),
    }


# -- checkpoints and exports ------------------------------------------------------------------------
def checkpoint_meta(backend: Any, fmt: str, extra_state: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """``meta.json`` of a train checkpoint: format, version, LR-schedule position, critic flag,
    ``more`` and ``extra_state`` (which must be JSON-serialisable)."""
    try:
        extra = json.loads(json.dumps(dict(extra_state)))
    except (TypeError, ValueError) as e:
        raise TypeError(f"save_checkpoint: extra_state must be JSON-serialisable: {e}") from e
    return {
        "format": fmt,
        "version": backend.version,
        "scheduler": {
            "actor": {"steps": backend.version, "next_lr": backend.lr_at(backend.version)},
            "critic": {
                "steps": backend.critic_steps,
                "next_lr": backend.lr_at(backend.critic_steps, critic=True),
            },
            "schedule": backend.spec.optim.lr_scheduler,
            "warmup_steps": backend.warmup_steps,
            "total_steps": backend.spec.total_steps,
        },
        "has_critic": backend.critic is not None,
        **more,
        "extra_state": extra,
    }


def read_checkpoint_meta(path: Path, fmt: str, what: str, *, has_critic: bool) -> dict[str, Any]:
    """``meta.json`` of the complete checkpoint ``path`` of format ``fmt`` (``what``: its name in
    the error, e.g. "a native train"); the critic flag must match ``has_critic``."""
    marker = ckpt.require_complete(path)
    if marker.get("format") != fmt:
        raise ckpt.IncompleteCheckpointError(
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
    from rlzoo import lora

    saved, mine = meta.get("lora"), lora.settings_record(settings)
    if saved != mine:
        raise ValueError(
            f"checkpoint {str(path)!r} was written with trainer.lora={saved}, this run has trainer.lora={mine}; "
            "resume with the same LoRA settings (a LoRA checkpoint holds the adapter only)"
        )


def load_adapter_state(module: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Load a LoRA checkpoint's adapter tensors into ``module``; every adapter tensor of the module
    must be there and nothing else (the base weights stay those loaded from ``model_path``)."""
    from rlzoo import lora

    own = {name for name, _ in lora.adapter_items(module.state_dict())}
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise ValueError(
            f"LoRA checkpoint does not match the model's adapters: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    module.load_state_dict(dict(state), strict=False)


def save_lora_export(
    state: Mapping[str, Tensor], model_cls: Any, config: Any, spec: Any, directory: Path
) -> None:
    """A LoRA actor's HF export into ``directory``: the merged model (``save_pretrained`` of a
    fresh ``model_cls(config)`` holding :func:`rlzoo.lora.merged_state_dict`) and the adapter
    alone in ``directory/adapter`` (:func:`rlzoo.lora.save_adapter`)."""
    from rlzoo import lora

    merged = {k: v.detach() for k, v in lora.merged_state_dict(state, spec.lora).items()}
    with torch.device("meta"):
        model: Any = model_cls(copy.deepcopy(config))
    model.load_state_dict(merged, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"export_hf: parameters missing from the merged LoRA state: {missing[:5]}")
    model.save_pretrained(str(directory))
    lora.save_adapter(lora.adapter_items(state), spec.lora, directory / "adapter", base_model=spec.model_path)


def save_tokenizer(tokenizer: Any, spec: Any, directory: Path) -> None:
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
