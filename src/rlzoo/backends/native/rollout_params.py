"""Params of the native rollout engine (import-light: no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo import param


@dataclass(frozen=True)
class NativeRolloutParams:
    """Native rollout engine: KV-cache sampling with continuous batching on any HF causal LM.

    Plain PyTorch + transformers, no extra dependency. A fixed number of slots
    (``max_num_seqs``) decodes together; a finished sequence leaves its slot at once and a queued
    one is prefilled and joins the running batch, so one long response does not hold the slots of
    short ones. Supports temperature / top-k / top-p / greedy, ``n`` samples per prompt (the prompt
    is prefilled once), streaming of finished samples, pause / resume with the generated tokens
    kept, and in-place weight updates with per-token policy versions.

    Rollout log-probs are ``log_softmax(logits / temperature)`` of the sampled token under the
    model's full distribution: no top-k / top-p truncation (what a trainer recomputes with the same
    temperature). Greedy requests use ``temperature`` as given (1.0 when it is 0).
    """

    max_num_seqs: int = param(64, help="slots: sequences decoded together (continuous batching)")
    max_prefill_tokens: int = param(
        16384,
        help="padded tokens per prefill forward; larger joins are prefilled in several chunks",
    )
    recompute_kv_on_update: bool = param(
        True,
        help="after update_weights, re-prefill in-flight sequences (prompt + tokens so far) with the new "
        "weights; False keeps the KV computed by the old weights",
    )
    use_kv_cache: bool = param(
        True,
        help="decode with a KV cache; False (or a model without one) recomputes the whole sequence each step",
    )
    background_thread: bool = param(
        True,
        help="run the engine loop in a background thread (submit/stream from any thread); False: the "
        "caller drives it from generate()/stream()",
    )
    record_routes: bool = param(
        False,
        help="record a MoE model's top-k experts per token and layer in each sample (router replay: the "
        "megatron trainer's router_replay); refused for a dense model",
    )
    attn_implementation: str | None = param(
        None,
        help="attention kernel passed to from_pretrained ('sdpa', 'eager', ...); None: transformers' default",
    )
