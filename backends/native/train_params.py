"""Params of the native train backend (``train_backend: native``). Import-light: no torch here.

The implementation lives in :mod:`rlzoo.backends.native.train`; checkpoint helpers shared with
other backends in :mod:`rlzoo.backends.native.checkpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo.registry import param

__all__ = ["LR_SCHEDULES", "NativeTrainParams"]

#: Learning-rate schedules the native backend understands.
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class NativeTrainParams:
    """Single-process PyTorch trainer for any HF causal LM: AdamW, optional critic and reference.

    One process, one device. The actor is ``AutoModelForCausalLM.from_pretrained(model_path)``;
    the frozen reference (``need_reference``) is a copy of the initial actor weights; the critic
    (``need_critic``) is the base model of ``critic_model_path or model_path`` with a zero-initialised
    ``Linear(hidden, 1)`` value head. Updates accumulate gradients over micro-batches without
    rescaling (the objective normalises by global counts), skip the step when the loss or the
    gradient norm is not finite, clip, step AdamW and the LR schedule. Checkpoints are
    safetensors + JSON, written atomically.

    dtype: the model is loaded and trained in ``dtype`` (``bfloat16`` means pure-bf16 weights and
    optimizer state, no fp32 master copy); log-softmax always runs in fp32. Use ``float32`` for
    small models and exactness, the fsdp2 backend for mixed precision at scale.
    """

    device: str = param("auto", help="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'")
    dtype: str = param("float32", help="weights dtype: 'float32' or 'bfloat16' (see the class doc)")
    attn_implementation: str | None = param(
        None, help="HF attention implementation ('sdpa', 'eager', 'flash_attention_2'); None: HF's default"
    )
    gradient_checkpointing: bool = param(False, help="recompute activations in backward (actor and critic)")
    temperature: float | None = param(
        None,
        help="logits are divided by this before log-softmax (None: the rollout temperature, from the spec)",
    )
    # -- micro-batching --------------------------------------------------------------------------
    micro_batch_size: int = param(4, help="samples per forward/backward in updates")
    max_tokens_per_micro_batch: int | None = param(
        None,
        help="if set, updates pack consecutive samples into micro-batches of at most this many real "
        "tokens (prompt + response; a longer sample goes alone) instead of micro_batch_size",
    )
    log_prob_micro_batch_size: int = param(
        8, help="samples per forward in compute_log_probs / compute_values"
    )
    # -- actor optimizer -------------------------------------------------------------------------
    lr: float = param(1e-6, help="AdamW peak learning rate of the actor")
    weight_decay: float = param(0.01, help="AdamW decoupled weight decay")
    betas: tuple[float, float] = param((0.9, 0.999), help="AdamW betas")
    eps: float = param(1e-8, help="AdamW epsilon")
    grad_clip: float = param(
        1.0, help="max global grad norm; <= 0 disables clipping (the norm is still logged)"
    )
    # -- LR schedule (actor and critic) ----------------------------------------------------------
    lr_scheduler: str = param(
        "constant", help="'constant', 'linear' (to min_lr_ratio) or 'cosine' (to min_lr_ratio)"
    )
    warmup_steps: int = param(0, help="linear warmup steps; 0: use warmup_ratio")
    warmup_ratio: float = param(
        0.0, help="warmup steps as a fraction of spec.total_steps (when warmup_steps is 0)"
    )
    min_lr_ratio: float = param(0.0, help="final LR of linear / cosine decay, as a fraction of the peak LR")
    # -- critic ----------------------------------------------------------------------------------
    critic_lr: float = param(1e-5, help="AdamW peak learning rate of the critic")
    critic_weight_decay: float = param(0.01, help="AdamW weight decay of the critic")
    critic_grad_clip: float = param(1.0, help="max grad norm of the critic; <= 0 disables clipping")

    def __post_init__(self) -> None:
        problems = []
        if self.lr_scheduler not in LR_SCHEDULES:
            problems.append(f"lr_scheduler must be one of {LR_SCHEDULES}, got {self.lr_scheduler!r}")
        if self.dtype not in ("float32", "bfloat16"):
            problems.append(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.micro_batch_size < 1 or self.log_prob_micro_batch_size < 1:
            problems.append("micro_batch_size and log_prob_micro_batch_size must be >= 1")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            problems.append("max_tokens_per_micro_batch must be >= 1 or None")
        if self.warmup_steps < 0 or not 0.0 <= self.warmup_ratio < 1.0:
            problems.append("warmup_steps must be >= 0 and warmup_ratio in [0, 1)")
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            problems.append("set warmup_steps or warmup_ratio, not both")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.temperature is not None and self.temperature <= 0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        if problems:
            raise ValueError("invalid native train params: " + "; ".join(problems))
