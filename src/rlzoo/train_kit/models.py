"""Train kit: loading the models a train backend trains, and the critic's value head.

Every train backend that loads Hugging Face models composes these: the ``from_pretrained``
keyword arguments, the actor (a causal LM, or an image-text-to-text model when the folder has a
vision config), the critic's backbone and its zero-initialised value head, the temperature rule,
the forward-only teacher, and which module ``compute_log_probs(model=...)`` runs.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.kernel.settings import TeacherModel, TrainSpec
from rlzoo.models.processor import has_vision_config
from rlzoo.train_kit.params import HFTrainParams

__all__ = [
    "DTYPES",
    "FUSED_LM_HEAD_MODEL_TYPES",
    "CriticModel",
    "critic_backbone",
    "fusable_lm_head",
    "hf_kwargs",
    "load_backbone",
    "load_causal_lm",
    "load_teacher",
    "resolve_temperature",
    "select_model",
    "takes_logits_to_keep",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``HFTrainParams.dtype`` -> the torch dtype."""

FUSED_LM_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})
"""HF model types whose causal-LM logits are exactly ``lm_head(decoder(...).last_hidden_state)``
(no logit scaling or soft-capping after the head)."""


def resolve_temperature(temperature: float | None, spec: TrainSpec) -> float:
    """A backend's ``temperature`` param when set, else the rollout's (``spec.temperature``)."""
    return float(temperature if temperature is not None else spec.temperature)


def hf_kwargs(params: HFTrainParams, spec: TrainSpec, dtype: torch.dtype) -> dict[str, Any]:
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
    if vision and has_vision_config(path, bool(kwargs.get("trust_remote_code", False))):
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText
    return auto.from_pretrained(path, **kwargs)


def load_backbone(path: str, kwargs: Mapping[str, Any]) -> Any:
    """``AutoModel`` (the base transformer, no LM head): the critic's backbone."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, **kwargs)


def critic_backbone(
    spec: TrainSpec, override: Any, actor: Any, *, given_model: bool, kwargs: Mapping[str, Any]
) -> Any:
    """The critic's backbone: ``override``, else loaded from ``spec.critic_model_path`` (or
    ``spec.model_path`` when the actor was loaded too), else a copy of the given actor's base model."""
    if override is not None:
        return override
    if spec.critic_model_path is not None or not given_model:
        return load_backbone(spec.critic_model_path or spec.model_path, kwargs)
    return copy.deepcopy(actor.base_model)


def select_model(
    model: str, actor: nn.Module, ref: nn.Module | None, teacher: nn.Module | None = None
) -> nn.Module:
    """The module ``compute_log_probs(model=...)`` runs: "actor", "ref" or "teacher" (an error when absent)."""
    if model == "actor":
        return actor
    if model == "ref":
        if ref is None:
            raise ValueError("compute_log_probs(model='ref'): no reference model (spec.need_reference=False)")
        return ref
    if model == "teacher":
        if teacher is None:
            raise ValueError("compute_log_probs(model='teacher'): no teacher (spec.teacher is None)")
        return teacher
    raise ValueError(f"compute_log_probs: model must be 'actor', 'ref' or 'teacher', got {model!r}")


def load_teacher(
    teacher: TeacherModel, params: HFTrainParams, spec: TrainSpec, default_dtype: torch.dtype
) -> Any:
    """The teacher's causal LM from ``teacher.path``, frozen and in eval mode (on the CPU: the backend
    places it as it places the reference)."""
    dtype = DTYPES[teacher.dtype] if teacher.dtype is not None else default_dtype
    kwargs = hf_kwargs(params, spec, dtype)
    kwargs["trust_remote_code"] = teacher.trust_remote_code
    try:
        model = load_causal_lm(teacher.path, kwargs, vision=False)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"algorithm.teacher.model: cannot load a causal LM from {teacher.path!r} ({exc}); give a model "
            "folder (Hugging Face, an rlzoo run's final/ or export/step_K) that shares the student's tokenizer"
        ) from exc
    return model.to(dtype=dtype).eval().requires_grad_(False)


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (only those positions reach the LM head)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def fusable_lm_head(module: nn.Module) -> nn.Linear | None:
    """The causal LM's head when its logits are exactly ``hidden @ head.weight.T`` (a bias-free
    ``nn.Linear`` of a :data:`FUSED_LM_HEAD_MODEL_TYPES` model), else None (use the logits)."""
    config: Any = getattr(module, "config", None)  # an HF PreTrainedModel has one; other modules: None
    if config is None or config.model_type not in FUSED_LM_HEAD_MODEL_TYPES:
        return None
    get_head: Any = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return head if type(head) is nn.Linear and head.bias is None else None


class CriticModel(nn.Module):
    """A transformer backbone (HF base model) + ``Linear(hidden, 1)`` value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        dtype = next(backbone.parameters()).dtype
        self.value_head = nn.Linear(hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)  # values start at 0: deterministic, seed-free
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        position_ids: Tensor,
        keep_last: int | None = None,
        keep_index: Tensor | None = None,
    ) -> Tensor:
        """Values (fp32) at the last ``keep_last`` positions ``[b, keep_last]``, or at the
        positions ``keep_index`` ``[b, len(keep_index)]`` (a packed row: ``attention_mask`` None).

        The result is a fresh tensor, not a view: FSDP2 hooks the root module's output for its
        pre-backward all-gather (so every forward must also enter through ``__call__``).
        """
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = out.last_hidden_state  # [b, L, H]
        hidden = hidden[:, keep_index] if keep_index is not None else hidden[:, -int(keep_last or 1) :]
        return self.value_head(hidden).float().squeeze(-1).clone()  # [b, keep]
