"""The fastest settings that fit: micro-batch sizes from the memory the machine has, bf16 where the CPU has it.

On a CPU the update's speed grows with the micro-batch (fewer, larger kernels: SmolLM2-135M at 16
new tokens took 11.4 s per batch at micro-batches of 64 against 19.6 s at 16, docs/performance.md)
until memory runs out. :func:`choose_micro_batch` is a pure function of the memory available, the
model's shape and the longest sample: the largest power of two whose update fits in
:data:`MEMORY_SHARE` of the available memory, by the model

    fixed   = 20 bytes x parameters (fp32 weights, gradients, AdamW's two moments, the rollout's copy)
              + :data:`RUNTIME_BYTES` (interpreter, torch, tokenizer, allocator slack)
              + 3 fp32 [log_prob_chunk, vocab] temporaries of the chunked log-softmax
    per token = :data:`ACT_FLOATS_PER_LAYER_WIDTH` x layers x hidden x 4 bytes (stored activations)

calibrated on SmolLM2-135M (docs/performance.md): an fp32 update of 16 x 192 tokens peaked 4.4 GB
above AdamW's state (1.43 MB a token, 20.7 x 30 layers x 576 x 4 B), a bf16-autocast step of
16 x ~300 tokens 10.4 GB in all (1.33 MB a token) and one of 32 x 320 tokens 19.8 GB in all (1.58 MB
a token above the fixed part, 22.9 floats: a model of 20 had chosen those 32 rows on a 24 GB machine,
1.5x TRL's peak of 13.0 GB, and no faster than 16 rows at 10.8 GB: 141.6 against 142.6 s a batch). ``trainer.micro_batch.size`` /
``log_prob_size`` set in a recipe or on the command line win; the choice and its reason are printed
when a run starts (:func:`rlzoo.train.inputs.train_spec`).

bf16 (:func:`choose_bf16`): ``model.dtype: auto`` and ``trainer.backend.autocast: auto`` mean bf16
on CPUs with native bf16 arithmetic (``avx512_bf16`` / ``amx_bf16``: 1.5-2x faster updates and
decoding there, docs/recipes.md) and on CUDA devices, fp32 elsewhere (emulated bf16 is slower than
fp32 on a CPU without those units).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlzoo.system.machine import available_memory_bytes, cpu_bf16_flags

__all__ = [
    "ACT_FLOATS_PER_LAYER_WIDTH",
    "MEMORY_SHARE",
    "RUNTIME_BYTES",
    "MicroBatchChoice",
    "ModelShape",
    "choose_bf16",
    "choose_micro_batch",
    "machine_micro_batch",
    "model_shape",
    "resolve_autocast",
]

#: share of the available memory one update may use (the rest: generation, the OS, other work)
MEMORY_SHARE = 0.75
#: the process's own memory besides the model (interpreter, torch, tokenizer, allocator slack)
RUNTIME_BYTES = 1 << 30
#: stored activations per token, in floats per (layer x hidden width): SmolLM2-135M measured 19-23
#: (the largest micro-batches the most), rounded up
ACT_FLOATS_PER_LAYER_WIDTH = 24
#: bytes per parameter the process holds: fp32 weights, gradients, AdamW's two moments, rollout copy
BYTES_PER_PARAM = 20
#: forward-only log-prob passes keep no activations: this many times the update's rows
LOG_PROB_FACTOR = 2


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a model (read from its ``config.json``)."""

    params: int
    layers: int
    hidden: int
    vocab: int


def model_shape(model_path: str) -> ModelShape | None:
    """The shape of a Hugging Face model folder (``config.json``; a VL model's ``text_config``);
    None when it is not a local folder with one."""
    cfg_file = Path(model_path).expanduser() / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    try:
        h, n_layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    inter = int(cfg.get("intermediate_size") or 4 * h)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // max(heads, 1))
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
    per_layer = attn + 3 * h * inter  # gated MLP
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return ModelShape(params=n_layers * per_layer + embed, layers=n_layers, hidden=h, vocab=vocab)


@dataclass(frozen=True)
class MicroBatchChoice:
    size: int
    log_prob_size: int
    reason: str


def _pow2_at_most(x: float) -> int:
    n = 1
    while n * 2 <= x:
        n *= 2
    return n


def choose_micro_batch(
    memory_bytes: int | None,
    shape: ModelShape | None,
    seq_len: int,
    rows: int,
    *,
    log_prob_rows: int | None = None,
    log_prob_chunk: int = 256,
    fallback: tuple[int, int] = (4, 8),
) -> MicroBatchChoice:
    """Micro-batch sizes for an update of ``rows`` samples (a mini-batch) of at most ``seq_len``
    tokens (prompt + response) on a machine with ``memory_bytes`` available (module docstring: the
    memory model).

    The update's size is the largest power of two (or ``rows``, if smaller) whose activations fit
    in :data:`MEMORY_SHARE` of the memory beside the fixed part; the log-prob passes' is
    :data:`LOG_PROB_FACTOR` times it, capped at ``log_prob_rows`` (the samples a log-prob pass
    covers: the whole batch; default ``rows``). Unknown memory or model: ``fallback``.
    """
    if memory_bytes is None or shape is None:
        what = "the available memory" if memory_bytes is None else "the model's shape (no config.json)"
        return MicroBatchChoice(*fallback, reason=f"{what} is unknown: the fallback sizes")
    rows, seq_len = max(1, rows), max(1, seq_len)
    lp_rows = max(1, log_prob_rows if log_prob_rows is not None else rows)
    gib = 1024**3
    budget = MEMORY_SHARE * memory_bytes
    fixed = BYTES_PER_PARAM * shape.params + RUNTIME_BYTES + 3 * log_prob_chunk * shape.vocab * 4
    per_token = ACT_FLOATS_PER_LAYER_WIDTH * shape.layers * shape.hidden * 4
    fits = (budget - fixed) / (per_token * seq_len)
    size = min(rows, _pow2_at_most(fits)) if fits >= 1 else 1
    log_prob_size = min(lp_rows, LOG_PROB_FACTOR * size)
    reason = (
        f"{memory_bytes / gib:.1f} GiB available, an update may use {budget / gib:.1f}; "
        f"{shape.params / 1e6:.3g}M params take {fixed / gib:.1f} GiB, each sample of <= {seq_len} tokens "
        f"{per_token * seq_len / gib:.2f} GiB"
        + (f"; capped at the {rows} samples of a mini-batch" if size == rows and fits >= 2 * rows else "")
        + ("; even one sample exceeds the budget" if fits < 1 else "")
    )
    return MicroBatchChoice(size, log_prob_size, reason)


def choose_bf16(device: str, flags: tuple[str, ...] | None = None) -> tuple[bool, str]:
    """Whether bf16 is the fast choice on ``device`` ('cpu', 'cuda', 'cuda:N'), and why.
    ``flags``: the CPU's bf16 flags (default: :func:`rlzoo.system.machine.cpu_bf16_flags`)."""
    if device.startswith("cuda"):
        return True, "a CUDA device"
    found = cpu_bf16_flags() if flags is None else flags
    if found:
        return True, f"the CPU has {', '.join(found)}"
    return False, "the CPU has no avx512_bf16 / amx_bf16 (bf16 would be emulated, slower than fp32)"


def resolve_autocast(setting: str | None, device: str) -> bool:
    """Whether a train backend's ``autocast`` setting (None, 'bfloat16', 'auto') turns bf16 autocast
    on for ``device``; 'auto' decides with :func:`choose_bf16` and prints the decision."""
    if setting != "auto":
        return setting is not None
    on, why = choose_bf16(device)
    print(
        f"rlzoo: trainer.backend.autocast: auto -> {'bfloat16' if on else 'off (fp32)'} ({why})", flush=True
    )
    return on


def machine_micro_batch(
    model_path: str, seq_len: int, rows: int, log_prob_rows: int, log_prob_chunk: int
) -> MicroBatchChoice:
    """:func:`choose_micro_batch` on this machine's available memory and the model at ``model_path``."""
    return choose_micro_batch(
        available_memory_bytes(),
        model_shape(model_path),
        seq_len,
        rows,
        log_prob_rows=log_prob_rows,
        log_prob_chunk=log_prob_chunk,
    )
