"""HF Qwen2 / Qwen2.5 ↔ megatron-core GPTModel: config mapping and weight conversion. Pure tensor code.

No megatron import: these functions take and return plain ``dict[str, Tensor]`` and are tested on
CPU (HF → megatron → TP shards → megatron → HF equals the original).

Megatron names (``layer_spec='local'``; with ``'te'`` the two layer norms live inside the linear
layers, as ``linear_qkv.layer_norm_weight`` and ``linear_fc1.layer_norm_weight``)::

    embedding.word_embeddings.weight                        [V_pad, H]   vocab-parallel (dim 0)
    decoder.layers.{i}.input_layernorm.weight               [H]          replicated
    decoder.layers.{i}.self_attention.linear_qkv.weight     [G*(q+2)*D, H] column-parallel (dim 0)
    decoder.layers.{i}.self_attention.linear_qkv.bias       [G*(q+2)*D]  column-parallel
    decoder.layers.{i}.self_attention.linear_proj.weight    [H, N*D]     row-parallel (dim 1)
    decoder.layers.{i}.pre_mlp_layernorm.weight             [H]          replicated
    decoder.layers.{i}.mlp.linear_fc1.weight                [2F, H]      column-parallel, gate|up per rank
    decoder.layers.{i}.mlp.linear_fc2.weight                [H, F]       row-parallel (dim 1)
    decoder.final_layernorm.weight                          [H]          replicated
    output_layer.weight                                     [V_pad, H]   vocab-parallel (absent when tied)

``G`` query groups (= KV heads), ``q = N / G`` query heads per group, ``D`` head dim. The fused QKV
is **interleaved by group**: for each group ``g``, its ``q`` query heads, then its key head, then
its value head. Column-parallel sharding splits dim 0 in ``tp`` equal blocks, so a rank holds
``G / tp`` whole groups. ``linear_fc1`` is ``[gate; up]``, but each rank holds ``[gate_r; up_r]``
(its slice of each), so it is sharded by halves. The vocabulary is padded to a multiple of
``make_vocab_size_divisible_by * tp`` (megatron's rule) with zero rows; unpadding drops them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ModelDims",
    "gpt_model_kwargs",
    "hf_to_mcore",
    "mcore_to_hf",
    "merge_pp",
    "merge_tp",
    "padded_vocab_size",
    "shard_tp",
    "split_pp",
    "transformer_config_kwargs",
]

LAYER_SPECS = ("local", "te")


@dataclass(frozen=True)
class ModelDims:
    """What the conversion needs to know about a Qwen2-family decoder."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = True  # Qwen2 / Qwen2.5: biases on q, k, v only

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @classmethod
    def from_hf(cls, config: Any) -> ModelDims:
        """From a ``transformers`` Qwen2 config (or the text config of a Qwen2.5-VL one)."""
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(c.num_attention_heads)
        groups = int(getattr(c, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        rope = getattr(c, "rope_theta", None)
        if rope is None:  # transformers >= 5 keeps it in rope_parameters
            rope = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        if heads % groups:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")
        return cls(
            num_layers=int(c.num_hidden_layers),
            hidden_size=int(c.hidden_size),
            ffn_hidden_size=int(c.intermediate_size),
            num_attention_heads=heads,
            num_query_groups=groups,
            head_dim=head_dim,
            vocab_size=int(c.vocab_size),
            rms_norm_eps=float(c.rms_norm_eps),
            rope_theta=float(rope),
            max_position_embeddings=int(getattr(c, "max_position_embeddings", 32768)),
            tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
            qkv_bias=bool(getattr(c, "attention_bias", True)) if c.model_type != "qwen2" else True,
        )


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary: the next multiple of ``divisible_by * tp``."""
    m = divisible_by * tp
    return (vocab_size + m - 1) // m * m


def transformer_config_kwargs(dims: ModelDims, **parallel: Any) -> dict[str, Any]:
    """``megatron.core.transformer.TransformerConfig`` fields for a Qwen2 decoder.

    SwiGLU (``gated_linear_unit`` + ``F.silu``), RMSNorm, biases on QKV only, no dropout, rotary
    with HF's (non-interleaved, rotate-half) layout. ``parallel``: extra fields (TP / PP sizes,
    ``params_dtype``, ``bf16``, ``sequence_parallel`` ...) passed through.
    """
    import torch.nn.functional as F

    kw: dict[str, Any] = {
        "num_layers": dims.num_layers,
        "hidden_size": dims.hidden_size,
        "ffn_hidden_size": dims.ffn_hidden_size,
        "num_attention_heads": dims.num_attention_heads,
        "num_query_groups": dims.num_query_groups,
        "kv_channels": dims.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": dims.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": dims.qkv_bias,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "gradient_accumulation_fusion": False,
        "attention_softmax_in_fp32": True,
        "variable_seq_lengths": True,
        # megatron-core refuses variable_seq_lengths with its default (allgather) MoE token
        # dispatcher, even for dense models: the all-to-all dispatcher accepts it (as verl sets).
        "moe_token_dispatcher_type": "alltoall",
    }
    kw.update(parallel)
    return kw


def gpt_model_kwargs(dims: ModelDims, tp: int, divisible_by: int = 128) -> dict[str, Any]:
    """``megatron.core.models.gpt.GPTModel`` arguments besides config and layer spec."""
    return {
        "vocab_size": padded_vocab_size(dims.vocab_size, tp, divisible_by),
        "max_sequence_length": dims.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": int(dims.rope_theta),
        "share_embeddings_and_output_weights": dims.tie_word_embeddings,
        "parallel_output": True,  # logits stay vocab-sharded: log-probs use vocab_parallel_log_probs
    }


# ---------------------------------------------------------------------------------------------
# HF <-> megatron (full tensors, TP=1)
# ---------------------------------------------------------------------------------------------
def _norm_names(spec: str) -> tuple[str, str]:
    if spec == "local":
        return "input_layernorm.weight", "pre_mlp_layernorm.weight"
    if spec == "te":
        return "self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"
    raise ValueError(f"layer_spec must be one of {LAYER_SPECS}, got {spec!r}")


def _pad_rows(t: Tensor, rows: int) -> Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))], 0)


def hf_to_mcore(
    hf: Mapping[str, Tensor], dims: ModelDims, *, layer_spec: str = "local", vocab_padded: int | None = None
) -> dict[str, Tensor]:
    """An HF Qwen2 ``state_dict`` (``model.…`` / ``lm_head.weight`` names) → full megatron tensors.

    QKV interleaving per group (``G`` groups, ``q`` heads each, head dim ``D``, hidden ``H``)::

        q_proj [G*q*D, H] → [G, q*D, H];  k_proj, v_proj [G*D, H] → [G, D, H]
        linear_qkv = cat([q, k, v], dim=1).reshape(G*(q+2)*D, H)
    """
    ln_attn, ln_mlp = _norm_names(layer_spec)
    G, q, D, H = dims.num_query_groups, dims.heads_per_group, dims.head_dim, dims.hidden_size
    V = vocab_padded or dims.vocab_size
    out: dict[str, Tensor] = {
        "embedding.word_embeddings.weight": _pad_rows(hf["model.embed_tokens.weight"], V)
    }
    for i in range(dims.num_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = p + "self_attn."
        qw = hf[a + "q_proj.weight"].reshape(G, q * D, H)  # [G, q*D, H]
        kw = hf[a + "k_proj.weight"].reshape(G, D, H)  # [G, D, H]
        vw = hf[a + "v_proj.weight"].reshape(G, D, H)  # [G, D, H]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([qw, kw, vw], 1).reshape(
            -1, H
        )  # [G(q+2)D, H]
        if dims.qkv_bias:
            qb = hf[a + "q_proj.bias"].reshape(G, q * D)  # [G, q*D]
            kb = hf[a + "k_proj.bias"].reshape(G, D)  # [G, D]
            vb = hf[a + "v_proj.bias"].reshape(G, D)  # [G, D]
            out[m + "self_attention.linear_qkv.bias"] = torch.cat([qb, kb, vb], 1).reshape(-1)  # [G(q+2)D]
        out[m + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]  # [H, N*D]
        out[m + ln_attn] = hf[p + "input_layernorm.weight"]  # [H]
        out[m + ln_mlp] = hf[p + "post_attention_layernorm.weight"]  # [H]
        gate, up = hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]  # [F, H] each
        out[m + "mlp.linear_fc1.weight"] = torch.cat([gate, up], 0)  # [2F, H]
        out[m + "mlp.linear_fc2.weight"] = hf[p + "mlp.down_proj.weight"]  # [H, F]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not dims.tie_word_embeddings:
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], V)
    return out


def mcore_to_hf(mc: Mapping[str, Tensor], dims: ModelDims, *, layer_spec: str = "local") -> dict[str, Tensor]:
    """Inverse of :func:`hf_to_mcore` (full tensors): HF names, vocabulary unpadded.

    Tied embeddings: ``lm_head.weight`` is emitted too (the same tensor as the embedding), as
    ``state_dict()`` of a tied HF model has it.
    """
    ln_attn, ln_mlp = _norm_names(layer_spec)
    G, q, D, H, F = (
        dims.num_query_groups,
        dims.heads_per_group,
        dims.head_dim,
        dims.hidden_size,
        dims.ffn_hidden_size,
    )
    V = dims.vocab_size
    emb = mc["embedding.word_embeddings.weight"][:V]
    out: dict[str, Tensor] = {"model.embed_tokens.weight": emb}
    for i in range(dims.num_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = p + "self_attn."
        qkv = mc[m + "self_attention.linear_qkv.weight"].reshape(G, (q + 2) * D, H)  # [G, (q+2)D, H]
        out[a + "q_proj.weight"] = qkv[:, : q * D].reshape(-1, H)  # [G*q*D, H]
        out[a + "k_proj.weight"] = qkv[:, q * D : (q + 1) * D].reshape(-1, H)  # [G*D, H]
        out[a + "v_proj.weight"] = qkv[:, (q + 1) * D :].reshape(-1, H)  # [G*D, H]
        if dims.qkv_bias:
            b = mc[m + "self_attention.linear_qkv.bias"].reshape(G, (q + 2) * D)  # [G, (q+2)D]
            out[a + "q_proj.bias"] = b[:, : q * D].reshape(-1)
            out[a + "k_proj.bias"] = b[:, q * D : (q + 1) * D].reshape(-1)
            out[a + "v_proj.bias"] = b[:, (q + 1) * D :].reshape(-1)
        out[a + "o_proj.weight"] = mc[m + "self_attention.linear_proj.weight"]
        out[p + "input_layernorm.weight"] = mc[m + ln_attn]
        out[p + "post_attention_layernorm.weight"] = mc[m + ln_mlp]
        fc1 = mc[m + "mlp.linear_fc1.weight"]  # [2F, H]
        out[p + "mlp.gate_proj.weight"] = fc1[:F]
        out[p + "mlp.up_proj.weight"] = fc1[F:]
        out[p + "mlp.down_proj.weight"] = mc[m + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = mc["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = emb if dims.tie_word_embeddings else mc["output_layer.weight"][:V]
    return out


# ---------------------------------------------------------------------------------------------
# tensor parallel sharding
# ---------------------------------------------------------------------------------------------
_COLUMN = re.compile(r"linear_qkv\.(weight|bias)$")
_ROW = re.compile(r"(linear_proj|linear_fc2)\.weight$")
_FC1 = re.compile(r"linear_fc1\.weight$")
_VOCAB = re.compile(r"^(embedding\.word_embeddings|output_layer)\.weight$")


def _kind(name: str) -> str:
    if _COLUMN.search(name) or _VOCAB.search(name):
        return "column"
    if _FC1.search(name):
        return "fc1"
    if _ROW.search(name):
        return "row"
    return "replicated"


def shard_tp(full: Mapping[str, Tensor], tp: int) -> list[dict[str, Tensor]]:
    """Full megatron tensors → ``tp`` per-rank state dicts (what each TP rank's module holds).

    Column-parallel (``linear_qkv``, vocab-parallel embedding / output layer): dim 0 in ``tp``
    blocks. ``linear_fc1``: gate and up each in ``tp`` blocks, rank r gets ``[gate_r; up_r]``.
    Row-parallel (``linear_proj``, ``linear_fc2``): dim 1 in ``tp`` blocks. Norms: replicated.
    """
    shards: list[dict[str, Tensor]] = [{} for _ in range(tp)]
    for name, t in full.items():
        kind = _kind(name)
        if kind == "column":
            if t.shape[0] % tp:
                raise ValueError(f"{name}: dim 0 ({t.shape[0]}) is not divisible by tp={tp}")
            parts = list(t.chunk(tp, 0))
        elif kind == "fc1":
            gate, up = t.chunk(2, 0)
            parts = [torch.cat([g, u], 0) for g, u in zip(gate.chunk(tp, 0), up.chunk(tp, 0))]
        elif kind == "row":
            if t.shape[1] % tp:
                raise ValueError(f"{name}: dim 1 ({t.shape[1]}) is not divisible by tp={tp}")
            parts = list(t.chunk(tp, 1))
        else:
            parts = [t] * tp
        for r in range(tp):
            shards[r][name] = parts[r].contiguous() if kind != "replicated" else parts[r]
    return shards


def merge_tp(shards: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Inverse of :func:`shard_tp`: the per-rank state dicts of one PP stage → full tensors."""
    tp = len(shards)
    out: dict[str, Tensor] = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        kind = _kind(name)
        if kind == "column":
            out[name] = torch.cat(parts, 0)
        elif kind == "fc1":
            halves = [p.chunk(2, 0) for p in parts]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
        elif kind == "row":
            out[name] = torch.cat(parts, 1)
        else:
            out[name] = parts[0]
    del tp
    return out


# ---------------------------------------------------------------------------------------------
# pipeline parallel (layer numbering is local to each stage in megatron's state dicts)
# ---------------------------------------------------------------------------------------------
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Global layer indices of each PP stage (equal split; megatron's default without a custom layout)."""
    if num_layers % pp:
        raise ValueError(f"num_layers {num_layers} is not divisible by pipeline size {pp}")
    n = num_layers // pp
    return [range(s * n, (s + 1) * n) for s in range(pp)]


def split_pp(full: Mapping[str, Tensor], num_layers: int, pp: int) -> list[dict[str, Tensor]]:
    """Full megatron tensors → per-stage state dicts: the embedding on the first stage, the final
    norm and output layer on the last, layers renumbered from 0 within each stage."""
    stages: list[dict[str, Tensor]] = [{} for _ in range(pp)]
    spans = stage_layers(num_layers, pp)
    for name, t in full.items():
        m = _LAYER.match(name)
        if m:
            g = int(m.group(1))
            s = next(i for i, r in enumerate(spans) if g in r)
            stages[s][f"decoder.layers.{g - spans[s].start}.{name[m.end() :]}"] = t
        elif name.startswith("embedding."):
            stages[0][name] = t
        else:  # final norm, output layer
            stages[-1][name] = t
    return stages


def merge_pp(stages: Sequence[Mapping[str, Tensor]], num_layers: int) -> dict[str, Tensor]:
    """Inverse of :func:`split_pp`."""
    spans = stage_layers(num_layers, len(stages))
    out: dict[str, Tensor] = {}
    for s, sd in enumerate(stages):
        for name, t in sd.items():
            m = _LAYER.match(name)
            if m:
                out[f"decoder.layers.{int(m.group(1)) + spans[s].start}.{name[m.end() :]}"] = t
            else:
                out[name] = t
    return out
