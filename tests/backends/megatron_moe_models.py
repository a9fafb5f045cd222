"""Tiny HF MoE models for the megatron backend's MoE tests (built here from configs, never downloaded).

:func:`save_tiny_moe` writes a Qwen3-MoE (query / key norms, 4 experts, top-2, renormalised) or a
Qwen2-MoE (biases on q / k / v, a sigmoid-gated shared expert, top-2 not renormalised) with
``save_pretrained`` (safetensors hold one tensor per expert) and the contract suite's word-level
tokenizer. Every weight is drawn at random (HF leaves the router at zero and biases at zero, which
would hide a wrong mapping).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlzoo.testing.backends import PAD, VOCAB, save_tiny_qwen2

__all__ = ["EXPERTS", "moe_config", "save_tiny_moe"]

EXPERTS = 4


def moe_config(family: str, **overrides: Any) -> Any:
    """A tiny ``Qwen3MoeConfig`` (``family='qwen3_moe'``) or ``Qwen2MoeConfig`` (``'qwen2_moe'``)."""
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    common: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "pad_token_id": PAD,
        "tie_word_embeddings": False,
    }
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**{**common, "head_dim": 8, "norm_topk_prob": True, **overrides})
    if family == "qwen2_moe":
        return Qwen2MoeConfig(
            **{**common, "shared_expert_intermediate_size": 40, "norm_topk_prob": False, **overrides}
        )
    raise ValueError(f"family must be 'qwen3_moe' or 'qwen2_moe', got {family!r}")


def save_tiny_moe(path: str | Path, family: str = "qwen3_moe", *, seed: int = 0, **overrides: Any) -> Path:
    """The tiny MoE of ``family`` (:func:`moe_config`) with random weights, saved to ``path``."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    save_tiny_qwen2(path)  # the contract suite's tokenizer (the model files are overwritten below)
    for f in path.glob("*.safetensors"):
        f.unlink()
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_config(family, **overrides)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.2 * noise)
    model.save_pretrained(str(path))
    return path
