"""Ulysses sequence parallelism for the fsdp2 backend (DeepSpeed-Ulysses, arXiv:2309.14509).

The ``ulysses_size`` ranks of one SP group take the same micro-batch. Its padding-free row
(:func:`rlzoo.train_kit.logprobs.pack`) is padded to a multiple of the group size and cut into
equal consecutive pieces: SP rank ``s`` runs the model on piece ``s`` only (its embeddings, MLPs,
norms and LM head see ``N / P`` tokens), with the *global* position ids of its tokens (rotary
embeddings and sequence boundaries stay those of the whole row). Attention needs every position:
the attention function registered here (:data:`ATTENTION`, through transformers'
``AttentionInterface``) all-to-alls ``q``, ``k``, ``v`` from ``[b, heads, N / P, d]`` to
``[b, heads / P, N, d]``, runs the model's usual attention (sdpa, eager) causally over each packed
sequence of the whole row in turn (no ``N x N`` mask), and all-to-alls the output back.

Each SP rank computes the log-probs / entropies / values of the response tokens predicted inside
its piece; :class:`GatherPieces` joins them in order on every SP rank, and its backward hands each
rank the gradient of its own piece only. Every SP rank then computes the same loss, so the
gradient of the one loss reaches every parameter exactly once over the group (FSDP2 sums gradients
over all ranks; the backend counts each SP group's loss once in its metrics).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from rlzoo.kernel.batch import Batch
from rlzoo.train_kit.attention import Segment, row_layout
from rlzoo.train_kit.logprobs import Packed, pack, sum_pi_squared, token_log_probs, unpack

__all__ = [
    "ATTENTION",
    "GatherPieces",
    "SeqPiece",
    "UlyssesGroup",
    "heads_to_seq",
    "install",
    "seq_to_heads",
    "sp_actor_log_probs",
    "sp_critic_values",
    "sp_log_probs_and_sum_pi_squared",
    "split_packed",
]

#: the attention implementation's name in transformers' ``AttentionInterface``
ATTENTION = "rlzoo_ulysses"


# ---------------------------------------------------------------------------------------------
# the group and its collectives
# ---------------------------------------------------------------------------------------------
@dataclass
class UlyssesGroup:
    """One SP group as its ranks see it: the process ``group``, its ``size`` and this rank's
    place ``rank`` in it; ``inner``: the model's own attention implementation (sdpa, eager);
    ``segments``: the ``[start, end)`` spans of the packed sequences of the current row (set by
    :func:`split_packed` before each forward and kept until the next one, so an
    activation-checkpointed layer recomputed in the backward sees the same row)."""

    group: Any
    size: int
    rank: int
    inner: str = "sdpa"
    segments: list[tuple[int, int]] | None = None


def _all_to_all(x: Tensor, group: Any) -> Tensor:
    """``all_to_all_single`` along dim 0 (``x`` ``[P, ...]``: slice ``j`` goes to rank ``j``;
    slice ``i`` of the result came from rank ``i``)."""
    x = x.contiguous()  # before empty_like, which would copy a view's permuted strides
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: Tensor, group: Any, size: int) -> Tensor:
    """``[b, H, s, d]`` (this rank's ``s`` positions, every head) -> ``[b, H / P, P s, d]``
    (this rank's heads, every position)."""
    parts = rearrange(x, "b (p h) s d -> p b h s d", p=size)  # head chunk p goes to rank p
    got = _all_to_all(parts, group)  # [P, b, H/P, s, d]: piece i of the sequence, from rank i
    return rearrange(got, "p b h s d -> b h (p s) d")


def _heads_to_seq(x: Tensor, group: Any, size: int) -> Tensor:
    """The inverse of :func:`_seq_to_heads`: ``[b, H / P, P s, d]`` -> ``[b, H, s, d]``."""
    parts = rearrange(x, "b h (p s) d -> p b h s d", p=size)  # sequence piece p goes to rank p
    got = _all_to_all(parts, group)  # [P, b, H/P, s, d]: head chunk i, from rank i
    return rearrange(got, "p b h s d -> b (p h) s d")


class _SeqToHeads(torch.autograd.Function):
    """:func:`_seq_to_heads`; its backward is :func:`_heads_to_seq` (an all-to-all is a permutation
    of the group's elements, and the inverse permutation is its adjoint)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any, size: int) -> Tensor:  # type: ignore[override]
        ctx.group, ctx.size = group, size
        return _seq_to_heads(x, group, size)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return _heads_to_seq(g, ctx.group, ctx.size), None, None


class _HeadsToSeq(torch.autograd.Function):
    """:func:`_heads_to_seq`; backward :func:`_seq_to_heads`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any, size: int) -> Tensor:  # type: ignore[override]
        ctx.group, ctx.size = group, size
        return _heads_to_seq(x, group, size)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return _seq_to_heads(g, ctx.group, ctx.size), None, None


def seq_to_heads(x: Tensor, sp: UlyssesGroup) -> Tensor:
    """``[b, H, N / P, d]`` -> ``[b, H / P, N, d]`` across the SP group (autograd-aware)."""
    out: Tensor = _SeqToHeads.apply(x, sp.group, sp.size)
    return out


def heads_to_seq(x: Tensor, sp: UlyssesGroup) -> Tensor:
    """``[b, H / P, N, d]`` -> ``[b, H, N / P, d]`` across the SP group (autograd-aware)."""
    out: Tensor = _HeadsToSeq.apply(x, sp.group, sp.size)
    return out


class GatherPieces(torch.autograd.Function):
    """Every SP rank's ``[n_s, ...]`` joined in rank order: ``[sum n_s, ...]`` on every rank.

    ``counts`` (every rank's ``n_s``) is known everywhere, so no sizes are exchanged. Backward: this
    rank's rows of the incoming gradient, nothing summed: every SP rank computes the same loss
    from the joined tensor, and each piece's gradient must reach its own rank once.
    """

    @staticmethod
    def forward(ctx: Any, local: Tensor, counts: list[int], sp: UlyssesGroup) -> Tensor:  # type: ignore[override]
        ctx.start = sum(counts[: sp.rank])
        ctx.n = counts[sp.rank]
        width = max(max(counts), 1)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(sp.size)]
        dist.all_gather(parts, padded.contiguous(), group=sp.group)
        return torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return g[ctx.start : ctx.start + ctx.n], None, None


def gather_pieces(local: Tensor, counts: list[int], sp: UlyssesGroup) -> Tensor:
    out: Tensor = GatherPieces.apply(local, counts, sp)
    return out


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def ulysses_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The ``AttentionInterface`` function: ``query`` ``[b, H, N / P, d]``, ``key`` / ``value``
    ``[b, H_kv, N / P, d]`` (rotary already applied at the global positions) -> ``[b, N / P, H, d]``.

    Attention runs causally within each packed sequence (``sp.segments``), one sequence at a time:
    no ``N x N`` mask is built, and sdpa takes its causal kernel (O(N) memory on CPU and GPU).
    ``attention_mask`` is ignored (transformers builds none for an implementation it does not
    know). The group comes from the module (:func:`install` sets ``module.rlzoo_ulysses``)."""
    sp: UlyssesGroup | None = getattr(module, "rlzoo_ulysses", None)
    if sp is None or sp.segments is None:
        raise RuntimeError(
            f"{ATTENTION} attention called outside the fsdp2 backend's Ulysses forward (no SP group or row)"
        )
    q, k, v = (seq_to_heads(t, sp) for t in (query, key, value))  # [b, H/P, N, d]
    inner = _inner_attention(module, sp.inner)
    kwargs.pop("is_causal", None)
    outs = []
    for start, end in sp.segments:
        qs, ks, vs = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]  # one sequence
        mask = None if sp.inner == "sdpa" else _causal_mask(end - start, q)  # sdpa: is_causal
        outs.append(inner(module, qs, ks, vs, mask, is_causal=True, **kwargs)[0])  # [b, n, H/P, d]
    out = torch.cat(outs, dim=1)  # [b, N, H/P, d]
    out = heads_to_seq(rearrange(out, "b n h d -> b h n d"), sp)  # [b, H, N/P, d]
    return rearrange(out, "b h n d -> b n h d").contiguous(), None


def _inner_attention(module: nn.Module, name: str) -> Any:
    """The attention function ``name`` names for ``module``: transformers' registered one (sdpa), or
    the model's own ``eager_attention_forward`` (each modeling file defines it; it is no registered
    name)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"fsdp2 Ulysses: {type(module).__name__} has no {name!r} attention function")
    return fn


def _causal_mask(n: int, like: Tensor) -> Tensor:
    """The additive causal mask ``[1, 1, n, n]`` eager attention adds (0 / the dtype's minimum)."""
    allowed = torch.ones((n, n), dtype=torch.bool, device=like.device).tril_()
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    return torch.where(allowed, zero, torch.finfo(like.dtype).min)[None, None]


def install(model: nn.Module, sp: UlyssesGroup) -> None:
    """Route ``model``'s attention through :func:`ulysses_attention` (registered under
    :data:`ATTENTION`); ``sp.inner`` becomes the model's own implementation: sdpa or eager, the
    ones checked here (others, e.g. flash attention, are refused until checked on a GPU)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)
    config: Any = model.config
    inner = config._attn_implementation or "sdpa"
    if inner == ATTENTION:
        inner = sp.inner
    if inner not in ("sdpa", "eager"):
        raise ValueError(
            f"fsdp2: ulysses_size > 1 runs the model's own attention per packed sequence; attn_implementation "
            f"{inner!r} is not supported with it yet (use sdpa or eager: trainer.backend.attn_implementation)"
        )
    sp.inner = inner
    for m in model.modules():
        if hasattr(m, "num_key_value_groups"):  # HF attention layers
            setattr(m, "rlzoo_ulysses", sp)  # noqa: B010 (a plain attribute, not a submodule)
    model.set_attn_implementation(ATTENTION)  # type: ignore[operator]


# ---------------------------------------------------------------------------------------------
# inputs: one packed row cut into SP pieces
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeqPiece:
    """This SP rank's piece of a packed row: ``input_ids`` / ``position_ids`` ``[1, N / P]``
    (global positions), ``predict_at`` ``[n_s]`` indices in the piece whose output predicts a
    response token, ``targets`` ``[n_s]`` those tokens, ``counts`` every SP rank's ``n_s``."""

    input_ids: Tensor
    position_ids: Tensor
    predict_at: Tensor
    targets: Tensor
    counts: list[int]


def split_packed(pk: Packed, sp: UlyssesGroup) -> SeqPiece:
    """Pad the packed row to a multiple of the group size (the padding is one more sequence, of
    token 0 at positions 0, 1, ..., after every real one, so nothing real attends to it), set it
    as the group's current row, and cut out this rank's piece."""
    n = pk.input_ids.shape[1]
    pad = -n % sp.size
    ids = F.pad(pk.input_ids, (0, pad), value=0)  # [1, N']
    pad_pos = torch.arange(pad, dtype=pk.position_ids.dtype, device=pk.position_ids.device)
    pos = torch.cat([pk.position_ids, pad_pos[None]], dim=1)  # [1, N']
    layout = row_layout(pos) or [Segment(0, n + pad)]  # one sequence, no padding: one segment
    sp.segments = [(seg.start, seg.end) for seg in layout]
    width = (n + pad) // sp.size
    start = sp.rank * width
    owner = torch.div(pk.predict_at, width, rounding_mode="floor")  # [n] SP rank of each prediction
    mine = owner == sp.rank
    counts = torch.bincount(owner, minlength=sp.size).tolist()
    return SeqPiece(
        input_ids=ids[:, start : start + width],
        position_ids=pos[:, start : start + width],
        predict_at=pk.predict_at[mine] - start,
        targets=pk.targets[mine],
        counts=[int(c) for c in counts],
    )


# ---------------------------------------------------------------------------------------------
# one micro-batch, split over the SP group
# ---------------------------------------------------------------------------------------------
def _piece_logits(module: nn.Module, mb: Batch, sp: UlyssesGroup) -> tuple[Tensor, SeqPiece, Packed]:
    """Logits ``[1, n_s, V]`` of the response tokens predicted in this rank's piece."""
    pk = pack(mb)
    piece = split_packed(pk, sp)
    out = module(
        input_ids=piece.input_ids,
        position_ids=piece.position_ids,
        use_cache=False,
        logits_to_keep=piece.predict_at,
    )
    return out.logits, piece, pk


def sp_actor_log_probs(
    module: nn.Module,
    mb: Batch,
    sp: UlyssesGroup,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (+ entropy) ``[b, T]`` of one micro-batch, the same on every SP rank; zero on padding."""
    logits, piece, pk = _piece_logits(module, mb, sp)
    lp, ent = token_log_probs(
        logits,
        piece.targets[None],
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
    )  # [1, n_s]
    full_lp = unpack(gather_pieces(lp[0], piece.counts, sp), pk.response_valid)  # [b, T]
    if ent is None:
        return full_lp, None
    return full_lp, unpack(gather_pieces(ent[0], piece.counts, sp), pk.response_valid)


def sp_log_probs_and_sum_pi_squared(
    module: nn.Module, mb: Batch, sp: UlyssesGroup, *, temperature: float, chunk_tokens: int
) -> tuple[Tensor, Tensor]:
    """Log-probs and ``sum_v pi_v^2`` ``[b, T]`` of one micro-batch from one split forward."""
    logits, piece, pk = _piece_logits(module, mb, sp)
    lp, _ = token_log_probs(logits, piece.targets[None], temperature=temperature, chunk_tokens=chunk_tokens)
    sps = sum_pi_squared(logits, temperature=temperature, chunk_tokens=max(1, chunk_tokens))  # [1, n_s]
    return (
        unpack(gather_pieces(lp[0], piece.counts, sp), pk.response_valid),
        unpack(gather_pieces(sps[0], piece.counts, sp), pk.response_valid),
    )


def sp_critic_values(critic: nn.Module, mb: Batch, sp: UlyssesGroup) -> Tensor:
    """Values ``[b, T]`` of one micro-batch (value at the position predicting each response token)."""
    pk = pack(mb)
    piece = split_packed(pk, sp)
    values = critic(piece.input_ids, None, piece.position_ids, keep_index=piece.predict_at)[0]  # [n_s]
    return unpack(gather_pieces(values, piece.counts, sp), pk.response_valid)  # [b, T]
