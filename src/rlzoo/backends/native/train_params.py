"""Params of the native train backend (``train_backend: native``). Import-light: no torch here.

The implementation lives in :mod:`rlzoo.backends.native.train`; the fields every HF trainer shares
in :class:`rlzoo.train_kit.params.HFTrainParams`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlzoo.kernel.params import param
from rlzoo.train_kit.params import HFTrainParams

__all__ = ["NativeTrainParams"]


@dataclass(frozen=True)
class NativeTrainParams(HFTrainParams):
    """Single-process PyTorch trainer for any HF causal LM: AdamW, optional critic and reference.

    The optimizer, LR schedule and micro-batch sizes are trainer settings shared by every train
    backend (``trainer.optim``, ``trainer.micro_batch``; they arrive in ``TrainSpec``); these params
    hold only what is specific to this backend.

    One process, one device. The actor is ``AutoModelForCausalLM.from_pretrained(model_path)``;
    the frozen reference (``need_reference``) is a copy of the initial actor weights; the critic
    (``need_critic``) is the base model of ``critic_model_path or model_path`` with a zero-initialised
    ``Linear(hidden, 1)`` value head. Updates accumulate gradients over micro-batches without
    rescaling (the objective normalises by global counts), skip the step when the loss or the
    gradient norm is not finite, clip, step AdamW and the LR schedule. Checkpoints are
    safetensors + JSON, written atomically.

    dtype: the model is loaded and trained in ``dtype`` (``bfloat16`` means pure-bf16 weights and
    optimizer state, no fp32 master copy); log-softmax always runs in fp32. Use ``float32`` for
    small models and exactness. ``autocast: bfloat16`` is mixed precision on one device: fp32
    weights, gradients and optimizer state, matmuls in bf16 under ``torch.autocast`` (on CPUs with
    avx512_bf16 / AMX several times faster than fp32; see docs/recipes.md, SmolLM2).
    """

    kind: ClassVar[str] = "native"

    freeze_vision_tower: bool = param(
        False,
        help="vision-language models: keep the vision tower's weights fixed (no gradients, not in the "
        "optimizer); the language model and the projector train (verl's actor.freeze_vision_tower)",
    )
