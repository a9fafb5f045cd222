"""Train kit: the params every train backend over Hugging Face models shares. Import-light (no torch).

A backend's params class subclasses :class:`HFTrainParams` and adds its own fields; the optimizer,
LR schedule and micro-batch sizes are not here: they are the trainer's (``trainer.optim``,
``trainer.micro_batch``) and arrive in ``TrainSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlzoo.kernel.errors import raise_problems
from rlzoo.kernel.params import param

__all__ = ["HFTrainParams"]


@dataclass(frozen=True)
class HFTrainParams:
    """Device, dtypes, attention, padding-free forwards and temperature of a trainer of HF models
    (each backend's params class documents what they mean for it)."""

    kind: ClassVar[str] = "train backend"
    """The backend's name in error messages."""

    device: str = param("auto", help="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'")
    dtype: str = param("float32", help="weights dtype: 'float32' or 'bfloat16' (see the class doc)")
    autocast: str | None = param(
        None,
        help="'bfloat16': mixed precision, forwards and backwards under torch.autocast in bf16 while the "
        "weights and AdamW state stay in fp32 (needs dtype float32; fast on CPUs with avx512_bf16 / AMX); "
        "'auto': bfloat16 on CUDA and on such CPUs, none elsewhere (printed when the backend starts)",
    )
    attn_implementation: str | None = param(
        None, help="HF attention implementation ('sdpa', 'eager', 'flash_attention_2'); None: HF's default"
    )
    gradient_checkpointing: bool = param(False, help="recompute activations in backward (actor and critic)")
    fused_lm_head: bool = param(
        True,
        help="log-probs from the last hidden states, the LM head applied chunk by chunk inside the chunked "
        "log-softmax (no [rows, T, vocab] logits at all; trainer.micro_batch.log_prob_chunk > 0), for text "
        "models whose logits are exactly hidden @ lm_head.weight.T (llama, qwen2, qwen3, mistral families; "
        "others use the logits)",
    )
    use_remove_padding: bool = param(
        False,
        help="padding-free forwards: a micro-batch's real tokens packed end to end in one row, positions "
        "restarting per sequence (attention stays within each sequence; needs sdpa, eager or "
        "flash_attention_2 in transformers >= 5); text models (VL models keep the padded forward). On sdpa "
        "(llama, mistral, qwen2/3 families) each sequence's attention runs on its own and the samples of a "
        "group share one copy of their prompt (rlzoo.train_kit.attention)",
    )
    temperature: float | None = param(
        None,
        help="logits are divided by this before log-softmax (None: the rollout temperature, from the spec)",
    )

    def __post_init__(self) -> None:
        problems = []
        if self.dtype not in ("float32", "bfloat16"):
            problems.append(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.autocast not in (None, "bfloat16", "auto"):
            problems.append(f"autocast must be null, 'bfloat16' or 'auto', got {self.autocast!r}")
        elif self.autocast is not None and self.dtype != "float32":
            problems.append(
                f"autocast keeps fp32 master weights: it needs dtype 'float32', got {self.dtype!r}"
            )
        if self.temperature is not None and self.temperature <= 0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        raise_problems(f"invalid {self.kind} train params", problems)
