"""Train kit: pieces every train backend composes (core; no backend imports another).

Log-probs and entropy of response tokens in chunks, forward and backward
(:func:`token_log_probs`, :func:`chunked_token_fn`): the fp32 ``[B, T, V]`` copies of the logits
that a plain ``log_softmax`` / ``softmax`` keeps for the backward (the fp32 cast, the division by
the temperature, the softmax of the entropy) are never built whole. Each chunk of at most
``chunk_tokens`` positions is cast to fp32, reduced, and dropped; the backward recomputes the
chunk's softmax from the logits and writes its gradient into one ``[B, T, V]`` tensor of the
logits' dtype. What stays alive for the backward is the logits tensor the model produced and
``[B, T]`` fp32 statistics.

Chunks are whole rows when ``T < chunk_tokens`` (``chunk_tokens // T`` rows at a time), else
``chunk_tokens`` positions of one row; the logits may be a strided slice (never copied whole).

Padding-free micro-batches (:func:`pack`, :func:`unpack`): a micro-batch's real tokens laid end
to end in one row, positions restarting per sequence (HF attention keeps each sequence to itself
when ``attention_mask`` is None), outputs only where a response token is predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from rlzoo.batch import Batch
from rlzoo.protocols import MicroBatchSettings

__all__ = [
    "DEFAULT_LOG_PROB_CHUNK",
    "Packed",
    "chunked_token_fn",
    "linear_token_log_probs",
    "pack",
    "token_log_probs",
    "token_log_probs_reference",
    "unpack",
]

DEFAULT_LOG_PROB_CHUNK = MicroBatchSettings().log_prob_chunk
"""Positions per chunk (``trainer.micro_batch.log_prob_chunk``, whose default this is)."""

TokenFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]
"""``fn(logits_chunk [r, c, V], targets_chunk [r, c]) -> (log_probs [r, c], entropy [r, c] | None)``."""


def chunks(rows: int, width: int, chunk_tokens: int) -> Iterator[tuple[slice, slice]]:
    """``(row slice, column slice)`` pieces of a ``[rows, width]`` grid, each at most
    ``max(chunk_tokens, 1)`` positions (whole rows when a row is shorter than that)."""
    step = max(1, chunk_tokens)
    if width >= step or width == 0:
        for r in range(rows):
            for c in range(0, max(width, 1), step):
                yield slice(r, r + 1), slice(c, min(width, c + step))
    else:
        per = max(1, step // width)
        for r in range(0, rows, per):
            yield slice(r, min(rows, r + per)), slice(0, width)


def token_log_probs_reference(
    logits: Tensor, targets: Tensor, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """The unchunked computation: whole-tensor fp32 cast, ``logsumexp`` and (for the entropy) one
    softmax, all kept by autograd. The definition the chunked path is tested against, and the
    ``log_prob_chunk: 0`` path (benchmarks/memory.py measures both)."""
    z = logits.float()  # [B, T, V]
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)  # [B, T]
    log_probs = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1) - lse  # [B, T]
    entropy = None
    if with_entropy:
        entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)  # [B, T]
    return log_probs, entropy


def _fp32_scaled(x: Tensor, temperature: float) -> tuple[Tensor, bool]:
    """``x / temperature`` in fp32 and whether that is a fresh tensor (else a view of ``x``)."""
    if x.dtype == torch.float32:
        return (x, False) if temperature == 1.0 else (x / temperature, True)
    z = x.float()
    return (z.div_(temperature) if temperature != 1.0 else z), True


class _ChunkedLogProbs(torch.autograd.Function):
    """Log-probs + entropy of ``softmax(x / tau)``, chunk by chunk; analytic backward per chunk:

    ``z = x / tau``, ``p = softmax(z)``, ``lp = z_t - lse``, ``H = lse - sum p z``;
    ``dlp/dz = onehot_t - p``, ``dH/dz = -p (z - lse + H)``, ``dx = dz / tau``.

    At most two ``[chunk, V]`` fp32 temporaries live at once (three for non-fp32 logits).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        targets: Tensor,
        temperature: float,
        with_entropy: bool,
        chunk_tokens: int,
    ) -> tuple[Tensor, Tensor]:
        B, T = targets.shape
        lp = torch.empty((B, T), dtype=torch.float32, device=logits.device)
        lse = torch.empty((B, T), dtype=torch.float32, device=logits.device)
        ent = torch.empty((B, T) if with_entropy else (0,), dtype=torch.float32, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            for r, c in chunks(B, T, chunk_tokens):
                z, _ = _fp32_scaled(logits[r, c], temperature)  # [rr, cc, V]
                s = torch.logsumexp(z, dim=-1)  # [rr, cc]
                lse[r, c] = s
                lp[r, c] = z.gather(-1, targets[r, c].long().unsqueeze(-1)).squeeze(-1) - s
                if with_entropy:  # the unchunked formula, one [rr, cc, V] temporary
                    ent[r, c] = s - torch.softmax(z, dim=-1).mul_(z).sum(-1)
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(lse)
        return lp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, None, None, None, None]:
        logits, targets, lse, ent = ctx.saved_tensors  # type: ignore[attr-defined]
        if not ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            return None, None, None, None, None
        tau: float = ctx.temperature  # type: ignore[attr-defined]
        use_ent = bool(ctx.with_entropy) and g_ent is not None  # type: ignore[attr-defined]
        B, T = targets.shape
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [B, T, V]
        with torch.autocast(logits.device.type, enabled=False):
            for r, c in chunks(B, T, ctx.chunk_tokens):  # type: ignore[attr-defined]
                z, fresh = _fp32_scaled(logits[r, c], tau)  # [rr, cc, V]
                dz = _softmax_backward(
                    z,
                    fresh,
                    lse[r, c],
                    ent[r, c] if use_ent else None,
                    targets[r, c],
                    None if g_lp is None else g_lp[r, c],
                    g_ent[r, c] if use_ent and g_ent is not None else None,
                    tau,
                )
                grad[r, c] = dz
        return grad, None, None, None, None


def token_log_probs(
    logits: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """``log softmax(logits / temperature)`` at ``targets`` ``[B, T]`` (fp32), and the entropy of
    that distribution ``[B, T]`` when ``with_entropy`` (else None).

    ``logits`` ``[B, T, V]`` (any float dtype, may be a strided slice). ``chunk_tokens > 0``: in
    chunks of at most that many positions, forward and backward (module docstring); ``0``: the
    unchunked :func:`token_log_probs_reference`. Equal values and gradients either way.
    """
    if logits.shape[:-1] != targets.shape or logits.dim() != 3:
        raise ValueError(
            f"token_log_probs: logits must be [B, T, V] and targets [B, T], got "
            f"{tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0 (0: unchunked), got {chunk_tokens}")
    if chunk_tokens == 0:
        return token_log_probs_reference(logits, targets, temperature=temperature, with_entropy=with_entropy)
    lp, ent = _ChunkedLogProbs.apply(
        logits, targets, float(temperature), bool(with_entropy), int(chunk_tokens)
    )
    return lp, ent if with_entropy else None


class _ChunkedLinearLogProbs(torch.autograd.Function):
    """:class:`_ChunkedLogProbs` with the LM head inside: ``x = hidden @ weight.T`` per chunk, in
    the forward and again in the backward, so no ``[B, T, V]`` tensor exists at all. Backward per
    chunk: ``dhidden = dx @ weight``, ``dweight += dx.T @ hidden`` (``dx`` in the matmul dtype)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        temperature: float,
        with_entropy: bool,
        chunk_tokens: int,
    ) -> tuple[Tensor, Tensor]:
        B, T = targets.shape
        lp = torch.empty((B, T), dtype=torch.float32, device=hidden.device)
        lse = torch.empty((B, T), dtype=torch.float32, device=hidden.device)
        ent = torch.empty((B, T) if with_entropy else (0,), dtype=torch.float32, device=hidden.device)
        w = weight.to(hidden.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for r, c in chunks(B, T, chunk_tokens):
                z, _ = _fp32_scaled(hidden[r, c] @ w.T, temperature)  # [rr, cc, V]
                s = torch.logsumexp(z, dim=-1)  # [rr, cc]
                lse[r, c] = s
                lp[r, c] = z.gather(-1, targets[r, c].long().unsqueeze(-1)).squeeze(-1) - s
                if with_entropy:
                    ent[r, c] = s - torch.softmax(z, dim=-1).mul_(z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(lse)
        return lp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None]:
        hidden, weight, targets, lse, ent = ctx.saved_tensors  # type: ignore[attr-defined]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        if not (need_h or need_w):
            return None, None, None, None, None, None
        tau: float = ctx.temperature  # type: ignore[attr-defined]
        use_ent = bool(ctx.with_entropy) and g_ent is not None  # type: ignore[attr-defined]
        B, T = targets.shape
        w = weight.to(hidden.dtype)
        d_hidden = torch.zeros_like(hidden) if need_h else None  # [B, T, H]
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        with torch.autocast(hidden.device.type, enabled=False):
            for r, c in chunks(B, T, ctx.chunk_tokens):  # type: ignore[attr-defined]
                h = hidden[r, c]  # [rr, cc, H]
                z, _ = _fp32_scaled(h @ w.T, tau)  # [rr, cc, V]
                dz = _softmax_backward(
                    z,
                    True,  # the matmul's output: a temporary
                    lse[r, c],
                    ent[r, c] if use_ent else None,
                    targets[r, c],
                    None if g_lp is None else g_lp[r, c],
                    g_ent[r, c] if use_ent and g_ent is not None else None,
                    tau,
                )
                dx = dz.to(h.dtype)  # [rr, cc, V]
                if d_hidden is not None:
                    d_hidden[r, c] = dx @ w
                if d_weight is not None:
                    d_weight += (dx.flatten(0, 1).T @ h.flatten(0, 1)).float()
        return (
            d_hidden,
            None if d_weight is None else d_weight.to(weight.dtype),
            None,
            None,
            None,
            None,
        )


def _softmax_backward(
    z: Tensor,
    fresh: bool,
    lse: Tensor,
    ent: Tensor | None,
    targets: Tensor,
    g_lp: Tensor | None,
    g_ent: Tensor | None,
    tau: float,
) -> Tensor:
    """``d loss / d x`` ``[rr, cc, V]`` fp32 of one chunk (``z = x / tau`` in fp32, ``fresh``: a
    temporary that may be overwritten): ``g_lp (onehot - p) - g_ent p (z - lse + H)``, over ``tau``."""
    s = lse.unsqueeze(-1)  # [rr, cc, 1]
    p = (z - s).exp_()  # [rr, cc, V]: softmax
    gl = None if g_lp is None else g_lp.float().unsqueeze(-1)  # [rr, cc, 1]
    if g_ent is not None and ent is not None:
        ge = g_ent.float().unsqueeze(-1)  # [rr, cc, 1]
        dz = z.sub_(s) if fresh else z - s  # in z's buffer when z is a temporary
        dz.add_(ent.unsqueeze(-1)).mul_(p).mul_(-ge)
        if gl is not None:
            dz.addcmul_(p, gl, value=-1.0)
    elif gl is not None:
        dz = p.mul_(-gl)
    else:
        dz = p.zero_()
    if gl is not None:
        dz.scatter_add_(-1, targets.long().unsqueeze(-1), gl)
    if tau != 1.0:
        dz.div_(tau)
    return dz


def linear_token_log_probs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_log_probs` of ``logits = hidden @ weight.T`` (a bias-free LM head) without
    ever building the logits: ``hidden`` ``[B, T, H]``, ``weight`` ``[V, H]``, ``targets``
    ``[B, T]``; chunks of ``chunk_tokens`` positions (> 0) in the forward and the backward.

    The matmul runs in ``hidden``'s dtype (the weight cast to it), the log-softmax in fp32.
    """
    if hidden.dim() != 3 or hidden.shape[:-1] != targets.shape or weight.dim() != 2:
        raise ValueError(
            f"linear_token_log_probs: hidden must be [B, T, H], weight [V, H], targets [B, T], got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    if chunk_tokens < 1:
        raise ValueError(f"linear_token_log_probs needs chunk_tokens >= 1, got {chunk_tokens}")
    lp, ent = _ChunkedLinearLogProbs.apply(
        hidden, weight, targets, float(temperature), bool(with_entropy), int(chunk_tokens)
    )
    return lp, ent if with_entropy else None


class _ChunkedTokenFn(torch.autograd.Function):
    """Any per-position ``fn`` over chunks: forward under no_grad, backward recomputes each chunk's
    ``fn`` with autograd and writes its input gradient into one preallocated tensor."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        targets: Tensor,
        fn: TokenFn,
        with_entropy: bool,
        chunk_tokens: int,
    ) -> tuple[Tensor, Tensor]:
        B, T = targets.shape
        lp = torch.empty((B, T), dtype=torch.float32, device=logits.device)
        ent = torch.empty((B, T) if with_entropy else (0,), dtype=torch.float32, device=logits.device)
        with torch.no_grad():
            for r, c in chunks(B, T, chunk_tokens):
                lp_c, ent_c = fn(logits[r, c], targets[r, c])
                lp[r, c] = lp_c.float()
                if with_entropy:
                    assert ent_c is not None
                    ent[r, c] = ent_c.float()
        ctx.save_for_backward(logits, targets)
        ctx.fn = fn  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
        return lp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, None, None, None, None]:
        logits, targets = ctx.saved_tensors  # type: ignore[attr-defined]
        if not ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            return None, None, None, None, None
        B, T = targets.shape
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [B, T, V]
        for r, c in chunks(B, T, ctx.chunk_tokens):  # type: ignore[attr-defined]
            x = logits[r, c].detach().requires_grad_(True)
            with torch.enable_grad():
                lp_c, ent_c = ctx.fn(x, targets[r, c])  # type: ignore[attr-defined]
                outs, grads = [], []
                if g_lp is not None:
                    outs.append(lp_c)
                    grads.append(g_lp[r, c].to(lp_c.dtype))
                if ctx.with_entropy and g_ent is not None and ent_c is not None:  # type: ignore[attr-defined]
                    outs.append(ent_c)
                    grads.append(g_ent[r, c].to(ent_c.dtype))
                (gx,) = torch.autograd.grad(outs, [x], grads, allow_unused=True)
            grad[r, c] = 0.0 if gx is None else gx.to(grad.dtype)
        return grad, None, None, None, None


def chunked_token_fn(
    fn: TokenFn,
    logits: Tensor,
    targets: Tensor,
    *,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """``fn`` (per-position log-probs and entropy from logits, any math: e.g. megatron's
    vocab-parallel one with its collectives) applied chunk by chunk, forward and backward.

    ``logits`` ``[B, T, V']``, ``targets`` ``[B, T]``; returns fp32 ``[B, T]`` (and the entropy).
    Only the logits are kept for the backward, which reruns ``fn`` on one chunk at a time (every
    rank runs the same chunks, so collectives inside ``fn`` stay matched). ``chunk_tokens == 0``:
    ``fn`` on the whole tensor, as autograd keeps it.
    """
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0 (0: unchunked), got {chunk_tokens}")
    if chunk_tokens == 0:
        return fn(logits, targets)
    lp, ent = _ChunkedTokenFn.apply(logits, targets, fn, bool(with_entropy), int(chunk_tokens))
    return lp, ent if with_entropy else None


# ---------------------------------------------------------------------------------------------
# padding-free micro-batches
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Packed:
    """A micro-batch's real tokens packed into one row (padding-free forward).

    ``input_ids`` / ``position_ids`` ``[1, N]`` (positions restart at 0 for every sequence, which is
    how HF attention finds the sequence boundaries when ``attention_mask`` is None);
    ``predict_at`` ``[n]`` packed positions whose output predicts a response token; ``targets``
    ``[n]`` those tokens; ``response_valid`` ``[b, T]`` where the ``n`` results go back
    (row-major, ``out[response_valid] = result``).
    """

    input_ids: Tensor
    position_ids: Tensor
    predict_at: Tensor
    targets: Tensor
    response_valid: Tensor


def pack(mb: Batch) -> Packed:
    """Pack ``mb`` (``rlzoo.batch`` layout: prompt left-padded, response right-padded).

    Response token ``t`` of a sample is predicted by the packed position just before it, which is
    the previous real token of the same sequence (prompt and response are contiguous). Needs at
    least one prompt token per sample (as the padded path does).
    """
    ids = mb["input_ids"]  # [b, L]
    attn = mb["attention_mask"].bool()  # [b, L]
    T = mb["responses"].shape[1]
    flat_ids = ids[attn]  # [N] row-major: sample after sample
    pos = (attn.long().cumsum(-1) - 1)[attn]  # [N] 0.. per sequence
    # packed position of each token: sequences laid end to end, row after row
    packed_pos = rearrange(attn.long(), "b l -> (b l)").cumsum(0) - 1  # [b*L]
    flat_index = rearrange(packed_pos, "(b l) -> b l", b=attn.shape[0])  # [b, L]
    response_valid = attn[:, -T:]  # [b, T]
    token_at = flat_index[:, -T:][response_valid]  # [n]
    return Packed(
        input_ids=rearrange(flat_ids, "n -> 1 n"),  # one packed row [1, N]
        position_ids=rearrange(pos, "n -> 1 n"),  # [1, N]
        predict_at=token_at - 1,  # [n]
        targets=flat_ids[token_at],  # [n]
        response_valid=response_valid,  # [b, T]
    )


def unpack(values: Tensor, response_valid: Tensor) -> Tensor:
    """``[n]`` per-response-token values back to ``[b, T]``, zero on padding."""
    out = torch.zeros(response_valid.shape, dtype=values.dtype, device=values.device)  # [b, T]
    return out.masked_scatter(response_valid, values)
