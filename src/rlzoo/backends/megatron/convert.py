"""HF Qwen2 / Qwen2.5 / Qwen3 and the MoE Qwen2-MoE / Qwen3-MoE ↔ megatron-core GPTModel: config
mapping and weight conversion. Pure tensor code.

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

Qwen3 / Qwen3-MoE add per-head RMSNorms of queries and keys (``self_attention.q_layernorm.weight``,
``k_layernorm.weight``, ``[D]``, replicated). A MoE layer (every layer of a Qwen2-MoE / Qwen3-MoE;
megatron's ``SequentialMLP``, its experts one module each) has instead of ``mlp.linear_fc1/2``::

    decoder.layers.{i}.mlp.router.weight                                [E, H]    replicated
    decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight  [2F, H]   gate|up, like a dense fc1
    decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight  [H, F]    like a dense fc2
    decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight             [2S, H]   Qwen2-MoE only
    decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight             [H, S]
    decoder.layers.{i}.mlp.shared_experts.gate_weight                   [1, H]    sigmoid gate, replicated

``pre_mlp_layernorm`` stays a module of its own in a MoE layer in both specs. Expert parallelism
(:func:`shard_ep`) gives EP rank r the experts ``r*E/ep … (r+1)*E/ep - 1``, numbered from 0 there;
within an EP rank :func:`shard_tp` slices experts like dense MLPs over the expert tensor-parallel
size (megatron's default: the TP size).
On the HF side, transformers >= 5 holds the experts of a layer fused (``mlp.experts.gate_up_proj``
``[E, 2F, H]``, ``mlp.experts.down_proj`` ``[E, H, F]``, ``mlp.gate.weight`` the router) and writes
them per expert in its safetensors (``mlp.experts.{e}.gate_proj.weight`` ...): :func:`hf_to_mcore`
reads either, :func:`mcore_to_hf` gives the fused, in-memory names (what ``load_state_dict`` of the
HF model takes).

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
    "MOE_MODEL_TYPES",
    "ModelDims",
    "gpt_model_kwargs",
    "hf_to_mcore",
    "is_expert",
    "mcore_to_hf",
    "merge_ep",
    "merge_pp",
    "merge_tp",
    "padded_vocab_size",
    "shard_ep",
    "shard_tp",
    "split_pp",
    "transformer_config_kwargs",
]

LAYER_SPECS = ("local", "te")
#: HF model types whose experts this module converts (their router, experts and shared experts)
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class ModelDims:
    """What the conversion needs to know about a Qwen2-family decoder (dense or MoE).

    MoE (``num_experts > 0``): every layer's MLP is ``num_experts`` experts of width
    ``moe_ffn_hidden_size``, ``moe_topk`` of them per token, their weights renormalised to sum 1
    when ``norm_topk_prob``; ``shared_expert_size > 0`` adds a sigmoid-gated shared expert
    (Qwen2-MoE); ``moe_aux_loss_coeff > 0`` turns on the load-balancing loss.
    """

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
    qk_layernorm: bool = False  # Qwen3 / Qwen3-MoE: RMSNorm of each query / key head
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_topk: int = 0
    norm_topk_prob: bool = False
    shared_expert_size: int = 0
    moe_aux_loss_coeff: float = 0.0

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
        model_type = str(getattr(c, "model_type", ""))
        if model_type == "qwen2":
            qkv_bias = True
        else:  # Qwen2-MoE names it qkv_bias, Qwen3 (-MoE) attention_bias
            qkv_bias = bool(getattr(c, "qkv_bias", getattr(c, "attention_bias", True)))
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
            qkv_bias=qkv_bias,
            qk_layernorm=model_type.startswith("qwen3"),
            **_moe_fields(c, model_type),
        )


#: where HF configs keep their expert count (Qwen-MoE, Mixtral, DeepSeek-V2/V3 and Moonlight, others)
_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _moe_fields(c: Any, model_type: str) -> dict[str, Any]:
    """The MoE fields of :class:`ModelDims` from a HF config (none for a dense model).

    The load-balancing loss is on when the HF model adds it to its loss (``output_router_logits``),
    with its ``router_aux_loss_coef``; layers without experts (``mlp_only_layers``,
    ``decoder_sparse_step`` > 1) and other MoE families are refused by name.
    """
    counts = (getattr(c, k, None) for k in _EXPERT_COUNT_KEYS)
    experts = next((int(n) for n in counts if isinstance(n, int) and n > 0), 0)
    if not experts:
        return {}
    if model_type not in MOE_MODEL_TYPES:
        raise ValueError(
            f"the megatron backend converts the MoE families {', '.join(MOE_MODEL_TYPES)}; "
            f"model_type {model_type!r} (with {experts} experts) is not one of them"
        )
    dense = list(getattr(c, "mlp_only_layers", None) or [])
    step = int(getattr(c, "decoder_sparse_step", 1) or 1)
    if dense or step != 1:
        raise ValueError(
            f"{model_type}: layers without experts (mlp_only_layers={dense}, decoder_sparse_step={step}) "
            "are not supported by the megatron backend: it needs experts in every layer "
            "(mlp_only_layers [] and decoder_sparse_step 1)"
        )
    aux = float(getattr(c, "router_aux_loss_coef", 0.0) or 0.0)
    return {
        "num_experts": experts,
        "moe_ffn_hidden_size": int(c.moe_intermediate_size),
        "moe_topk": int(c.num_experts_per_tok),
        "norm_topk_prob": bool(getattr(c, "norm_topk_prob", False)),
        "shared_expert_size": int(getattr(c, "shared_expert_intermediate_size", 0) or 0),
        "moe_aux_loss_coeff": aux if getattr(c, "output_router_logits", False) else 0.0,
    }


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
        "qk_layernorm": dims.qk_layernorm,
    }
    if dims.num_experts:
        kw.update(
            num_moe_experts=dims.num_experts,
            moe_ffn_hidden_size=dims.moe_ffn_hidden_size,
            moe_router_topk=dims.moe_topk,
            moe_router_score_function="softmax",
            # HF: softmax over all experts, top-k, renormalised iff norm_topk_prob. megatron: softmax
            # over all then top-k (pre_softmax), or softmax over the top-k logits (= renormalised)
            moe_router_pre_softmax=not dims.norm_topk_prob,
            moe_router_load_balancing_type="aux_loss" if dims.moe_aux_loss_coeff > 0 else "none",
            moe_aux_loss_coeff=dims.moe_aux_loss_coeff,
            moe_grouped_gemm=False,  # SequentialMLP: one module per expert, runs anywhere
        )
        if dims.shared_expert_size:
            kw.update(
                moe_shared_expert_intermediate_size=dims.shared_expert_size,
                moe_shared_expert_gate=True,  # Qwen2-MoE: sigmoid(x · w) scales the shared expert
            )
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


#: a MoE layer's norm before its MLP, a module of its own in both specs (TE fuses it into a dense fc1 only)
_MOE_LN = "pre_mlp_layernorm.weight"


def _mlp_to_mcore(hf: Mapping[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
    """A SwiGLU MLP's HF ``gate_proj`` / ``up_proj`` / ``down_proj`` under ``src`` → megatron's
    ``linear_fc1 = [gate; up]`` / ``linear_fc2`` under ``dst``."""
    gate, up = hf[src + "gate_proj.weight"], hf[src + "up_proj.weight"]  # [F, H] each
    return {
        dst + "linear_fc1.weight": torch.cat([gate, up], 0),  # [2F, H]
        dst + "linear_fc2.weight": hf[src + "down_proj.weight"],  # [H, F]
    }


def _mlp_to_hf(mc: Mapping[str, Tensor], src: str, dst: str, F: int) -> dict[str, Tensor]:
    """Inverse of :func:`_mlp_to_mcore` (``F``: the MLP's width)."""
    fc1 = mc[src + "linear_fc1.weight"]  # [2F, H]
    return {
        dst + "gate_proj.weight": fc1[:F],
        dst + "up_proj.weight": fc1[F:],
        dst + "down_proj.weight": mc[src + "linear_fc2.weight"],
    }


def _experts_to_mcore(hf: Mapping[str, Tensor], src: str, dst: str, dims: ModelDims) -> dict[str, Tensor]:
    """One HF MoE block under ``src`` (``…mlp.``) → megatron's router, local experts and shared
    experts under ``dst``. The experts may be fused (transformers >= 5 in memory:
    ``experts.gate_up_proj [E, 2F, H]`` = per expert ``[gate; up]``, ``experts.down_proj [E, H, F]``)
    or per expert (its safetensors: ``experts.{e}.gate_proj.weight`` ...)."""
    out = {dst + "router.weight": hf[src + "gate.weight"]}  # [E, H]
    fused = src + "experts.gate_up_proj" in hf
    for e in range(dims.num_experts):
        x = f"{dst}experts.local_experts.{e}."
        if fused:
            out[x + "linear_fc1.weight"] = hf[src + "experts.gate_up_proj"][e]  # [2F, H]
            out[x + "linear_fc2.weight"] = hf[src + "experts.down_proj"][e]  # [H, F]
        else:
            out.update(_mlp_to_mcore(hf, f"{src}experts.{e}.", x))
    if dims.shared_expert_size:
        out.update(_mlp_to_mcore(hf, src + "shared_expert.", dst + "shared_experts."))
        out[dst + "shared_experts.gate_weight"] = hf[src + "shared_expert_gate.weight"]  # [1, H]
    return out


def _experts_to_hf(mc: Mapping[str, Tensor], src: str, dst: str, dims: ModelDims) -> dict[str, Tensor]:
    """Inverse of :func:`_experts_to_mcore`, to the fused names of transformers >= 5."""
    experts = [f"{src}experts.local_experts.{e}." for e in range(dims.num_experts)]
    out = {
        dst + "gate.weight": mc[src + "router.weight"],
        dst + "experts.gate_up_proj": torch.stack(
            [mc[x + "linear_fc1.weight"] for x in experts]
        ),  # [E, 2F, H]
        dst + "experts.down_proj": torch.stack([mc[x + "linear_fc2.weight"] for x in experts]),  # [E, H, F]
    }
    if dims.shared_expert_size:
        out.update(_mlp_to_hf(mc, src + "shared_experts.", dst + "shared_expert.", dims.shared_expert_size))
        out[dst + "shared_expert_gate.weight"] = mc[src + "shared_experts.gate_weight"]
    return out


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
        if dims.qk_layernorm:
            out[m + "self_attention.q_layernorm.weight"] = hf[a + "q_norm.weight"]  # [D]
            out[m + "self_attention.k_layernorm.weight"] = hf[a + "k_norm.weight"]  # [D]
        out[m + ln_attn] = hf[p + "input_layernorm.weight"]  # [H]
        out[m + (_MOE_LN if dims.num_experts else ln_mlp)] = hf[p + "post_attention_layernorm.weight"]  # [H]
        if dims.num_experts:
            out.update(_experts_to_mcore(hf, p + "mlp.", m + "mlp.", dims))
        else:
            out.update(_mlp_to_mcore(hf, p + "mlp.", m + "mlp."))
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
        if dims.qk_layernorm:
            out[a + "q_norm.weight"] = mc[m + "self_attention.q_layernorm.weight"]
            out[a + "k_norm.weight"] = mc[m + "self_attention.k_layernorm.weight"]
        out[p + "input_layernorm.weight"] = mc[m + ln_attn]
        out[p + "post_attention_layernorm.weight"] = mc[m + (_MOE_LN if dims.num_experts else ln_mlp)]
        if dims.num_experts:
            out.update(_experts_to_hf(mc, m + "mlp.", p + "mlp.", dims))
        else:
            out.update(_mlp_to_hf(mc, m + "mlp.", p + "mlp.", F))
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
# expert parallel (expert numbering is local to each EP rank in megatron's state dicts)
# ---------------------------------------------------------------------------------------------
_EXPERT = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")


def is_expert(name: str) -> bool:
    """Whether ``name`` is a routed expert's tensor (split over EP, and over ETP within a rank)."""
    return _EXPERT.match(name) is not None


def shard_ep(full: Mapping[str, Tensor], num_experts: int, ep: int) -> list[dict[str, Tensor]]:
    """Megatron tensors → ``ep`` per-rank state dicts: EP rank ``r`` holds experts
    ``r*E/ep … (r+1)*E/ep - 1`` (numbered from 0 there, megatron's placement); the rest (attention,
    norms, router, shared experts) on every rank."""
    if ep < 1 or num_experts % ep:
        raise ValueError(f"the expert count ({num_experts}) is not divisible by expert_parallel_size {ep}")
    per = num_experts // ep
    shards: list[dict[str, Tensor]] = [{} for _ in range(ep)]
    for name, t in full.items():
        m = _EXPERT.match(name)
        if m is None:
            for sd in shards:
                sd[name] = t
            continue
        e = int(m.group(2))
        shards[e // per][f"{m.group(1)}{e % per}{m.group(3)}"] = t
    return shards


def merge_ep(shards: Sequence[Mapping[str, Tensor]], num_experts: int) -> dict[str, Tensor]:
    """Inverse of :func:`shard_ep`: local expert ``i`` of EP rank ``r`` is expert ``r*E/ep + i``."""
    per = num_experts // len(shards)
    out: dict[str, Tensor] = {}
    for r, sd in enumerate(shards):
        for name, t in sd.items():
            m = _EXPERT.match(name)
            out[name if m is None else f"{m.group(1)}{r * per + int(m.group(2))}{m.group(3)}"] = t
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
