"""Train kit: log-probs, entropy, ``sum_pi_squared`` and values of a micro-batch's response tokens.

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
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.settings import MicroBatchSettings
from rlzoo.train_kit.attention import packed_forward, shares_prompts

__all__ = [
    "DEFAULT_LOG_PROB_CHUNK",
    "Packed",
    "actor_log_probs",
    "actor_log_probs_and_divergence",
    "actor_log_probs_and_sum_pi_squared",
    "chunked_divergence",
    "chunked_token_fn",
    "critic_values",
    "linear_token_log_probs",
    "pack",
    "packed_response_logits",
    "pad_response",
    "response_hidden",
    "response_logits",
    "sum_pi_squared",
    "token_log_probs",
    "token_log_probs_reference",
    "trim",
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


def _chunk_stats(
    z: Tensor, targets: Tensor, lp: Tensor, lse: Tensor, ent: Tensor | None, r: slice, c: slice
) -> None:
    """One chunk's forward statistics from its fp32 scaled logits ``z`` ``[rr, cc, V]``: writes
    ``lse``, ``lp = z_t - lse`` and (``ent`` given) the entropy ``lse - sum softmax(z) z`` (the
    unchunked formula, one ``[rr, cc, V]`` temporary) at ``[r, c]``."""
    s = torch.logsumexp(z, dim=-1)  # [rr, cc]
    lse[r, c] = s
    lp[r, c] = z.gather(-1, targets[r, c].long().unsqueeze(-1)).squeeze(-1) - s
    if ent is not None:
        ent[r, c] = s - torch.softmax(z, dim=-1).mul_(z).sum(-1)


def _chunked_forward(
    ctx: torch.autograd.function.FunctionCtx,
    chunk_logits: Callable[[slice, slice], Tensor],
    targets: Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward of the analytic Functions: ``lp``, ``lse`` and ``ent`` ``[B, T]`` fp32 (``ent``
    empty without ``with_entropy``) from ``chunk_logits(r, c)`` ``[rr, cc, V]``, one chunk at a time;
    records on ``ctx`` what the backward reads (the caller saves the tensors)."""
    B, T = targets.shape
    lp = torch.empty((B, T), dtype=torch.float32, device=device)
    lse = torch.empty((B, T), dtype=torch.float32, device=device)
    ent = torch.empty((B, T) if with_entropy else (0,), dtype=torch.float32, device=device)
    with torch.autocast(device.type, enabled=False):
        for r, c in chunks(B, T, chunk_tokens):
            z, _ = _fp32_scaled(chunk_logits(r, c), temperature)  # [rr, cc, V]
            _chunk_stats(z, targets, lp, lse, ent if with_entropy else None, r, c)
    ctx.temperature = temperature  # type: ignore[attr-defined]
    ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
    ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
    ctx.mark_non_differentiable(lse)
    return lp, lse, ent


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
        lp, lse, ent = _chunked_forward(
            ctx, lambda r, c: logits[r, c], targets, temperature, with_entropy, chunk_tokens, logits.device
        )
        ctx.save_for_backward(logits, targets, lse, ent)
        return lp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, None, None, None, None]:
        logits, targets, lse, ent = ctx.saved_tensors  # type: ignore[attr-defined]
        if not ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            return None, None, None, None, None
        tau: float = ctx.temperature  # type: ignore[attr-defined]
        ent_grad = _entropy_grad(ctx, ent, g_ent)
        B, T = targets.shape
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [B, T, V]
        with torch.autocast(logits.device.type, enabled=False):
            for r, c in chunks(B, T, ctx.chunk_tokens):  # type: ignore[attr-defined]
                z, fresh = _fp32_scaled(logits[r, c], tau)  # [rr, cc, V]
                grad[r, c] = _softmax_backward(z, fresh, r, c, lse, targets, g_lp, ent_grad, tau)
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
        w = weight.to(hidden.dtype)
        lp, lse, ent = _chunked_forward(
            ctx,
            lambda r, c: hidden[r, c] @ w.T,
            targets,
            temperature,
            with_entropy,
            chunk_tokens,
            hidden.device,
        )
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
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
        ent_grad = _entropy_grad(ctx, ent, g_ent)
        B, T = targets.shape
        w = weight.to(hidden.dtype)
        d_hidden = torch.zeros_like(hidden) if need_h else None  # [B, T, H]
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        with torch.autocast(hidden.device.type, enabled=False):
            for r, c in chunks(B, T, ctx.chunk_tokens):  # type: ignore[attr-defined]
                h = hidden[r, c]  # [rr, cc, H]
                z, _ = _fp32_scaled(h @ w.T, tau)  # [rr, cc, V]
                # z is the matmul's output: a temporary (fresh)
                dz = _softmax_backward(z, True, r, c, lse, targets, g_lp, ent_grad, tau)
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


def _entropy_grad(
    ctx: torch.autograd.function.FunctionCtx, ent: Tensor, g_ent: Tensor | None
) -> tuple[Tensor, Tensor] | None:
    """``(entropy, its gradient)`` ``[B, T]`` when the forward computed the entropy and the loss
    reads it, else None (the backward then leaves the entropy term out)."""
    if not ctx.with_entropy or g_ent is None:  # type: ignore[attr-defined]
        return None
    return ent, g_ent


def _softmax_backward(
    z: Tensor,
    fresh: bool,
    r: slice,
    c: slice,
    lse: Tensor,
    targets: Tensor,
    g_lp: Tensor | None,
    ent_grad: tuple[Tensor, Tensor] | None,
    tau: float,
) -> Tensor:
    """``d loss / d x`` ``[rr, cc, V]`` fp32 of the chunk ``[r, c]`` (``z = x / tau`` in fp32,
    ``fresh``: a temporary that may be overwritten; ``lse``, ``targets``, ``g_lp`` and
    ``ent_grad`` are whole ``[B, T]``): ``g_lp (onehot - p) - g_ent p (z - lse + H)``, over ``tau``."""
    s = lse[r, c].unsqueeze(-1)  # [rr, cc, 1]
    p = (z - s).exp_()  # [rr, cc, V]: softmax
    gl = None if g_lp is None else g_lp[r, c].float().unsqueeze(-1)  # [rr, cc, 1]
    if ent_grad is not None:
        ent, g_ent = ent_grad
        ge = g_ent[r, c].float().unsqueeze(-1)  # [rr, cc, 1]
        dz = z.sub_(s) if fresh else z - s  # in z's buffer when z is a temporary
        dz.add_(ent[r, c].unsqueeze(-1)).mul_(p).mul_(-ge)
        if gl is not None:
            dz.addcmul_(p, gl, value=-1.0)
    elif gl is not None:
        dz = p.mul_(-gl)
    else:
        dz = p.zero_()
    if gl is not None:
        dz.scatter_add_(-1, targets[r, c].long().unsqueeze(-1), gl)
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


#: ``divergence(student_logits [..., V], teacher_logits [..., V]) -> [...]`` per position
PairFn = Callable[[Tensor, Tensor], Tensor]


class _ChunkedPairFn(torch.autograd.Function):
    """A per-position ``fn(student_logits, teacher_logits)`` over chunks: forward under no_grad,
    backward recomputes each chunk's ``fn`` with autograd (the student's gradient only; the
    teacher's logits are constants) and writes it into one preallocated tensor."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        student: Tensor,
        teacher: Tensor,
        fn: PairFn,
        chunk_tokens: int,
    ) -> Tensor:
        B, T = student.shape[:2]
        out = torch.empty((B, T), dtype=torch.float32, device=student.device)  # [B, T]
        with torch.no_grad():
            for r, c in chunks(B, T, chunk_tokens):
                out[r, c] = fn(student[r, c], teacher[r, c]).float()
        ctx.save_for_backward(student, teacher)
        ctx.fn = fn  # type: ignore[attr-defined]
        ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_out: Tensor
    ) -> tuple[Tensor | None, None, None, None]:
        student, teacher = ctx.saved_tensors  # type: ignore[attr-defined]
        if not ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            return None, None, None, None
        B, T = student.shape[:2]
        grad = torch.empty(student.shape, dtype=student.dtype, device=student.device)  # [B, T, V]
        for r, c in chunks(B, T, ctx.chunk_tokens):  # type: ignore[attr-defined]
            x = student[r, c].detach().requires_grad_(True)
            with torch.enable_grad():
                y = ctx.fn(x, teacher[r, c])  # type: ignore[attr-defined]
                (gx,) = torch.autograd.grad([y], [x], [g_out[r, c].to(y.dtype)], allow_unused=True)
            grad[r, c] = 0.0 if gx is None else gx.to(grad.dtype)
        return grad, None, None, None


def chunked_divergence(
    fn: PairFn, student_logits: Tensor, teacher_logits: Tensor, *, chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK
) -> Tensor:
    """``fn(student_logits, teacher_logits)`` ``[B, T, V] x [B, T, V] -> [B, T]`` (fp32) chunk by chunk,
    forward and backward: the fp32 temporaries of ``fn`` live for one chunk at a time; the gradient
    flows to the student's logits only. ``chunk_tokens == 0``: ``fn`` on the whole tensors."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"chunked_divergence: the student's logits {tuple(student_logits.shape)} and the teacher's "
            f"{tuple(teacher_logits.shape)} differ (a teacher with another vocabulary size?)"
        )
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0 (0: unchunked), got {chunk_tokens}")
    if chunk_tokens == 0:
        return fn(student_logits, teacher_logits.detach()).float()
    out: Tensor = _ChunkedPairFn.apply(student_logits, teacher_logits.detach(), fn, int(chunk_tokens))
    return out


def actor_log_probs_and_divergence(
    module: nn.Module,
    teacher: nn.Module,
    mb: Batch,
    divergence: PairFn,
    *,
    keep_arg: bool,
    teacher_keep_arg: bool,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The student's log-probs (+ entropy) ``[b, T]`` and ``divergence(student, teacher)`` ``[b, T]``
    of one text micro-batch already on the device, from one student forward (with autograd) and one
    teacher forward (no_grad) over the same :func:`trim` columns; zero on padding.

    Both models' logits ``[b, T_eff, V]`` of this micro-batch exist during its update (the student's
    in its dtype, the teacher's in its own, never an fp32 copy); the log-softmaxes inside
    ``divergence`` run chunk by chunk (:func:`chunked_divergence`)."""
    logits, targets = response_logits(module, mb, keep_arg=keep_arg)  # [b, T_eff, V], [b, T_eff]
    with torch.no_grad():
        t_logits, _ = response_logits(teacher, mb, keep_arg=teacher_keep_arg)  # [b, T_eff, V]
    lp, ent = token_log_probs(
        logits, targets, temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens
    )  # [b, T_eff]
    div = chunked_divergence(divergence, logits, t_logits, chunk_tokens=chunk_tokens)  # [b, T_eff]
    return (
        pad_response(lp, mb),
        None if ent is None else pad_response(ent, mb),
        pad_response(div, mb),
    )  # [b, T] each


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


def pack(mb: Batch, *, share_prompts: bool = False) -> Packed:
    """Pack ``mb`` (``rlzoo.kernel.batch`` layout: prompt left-padded, response right-padded).

    Response token ``t`` of a sample is predicted by the packed position just before it, which is
    the previous real token of the same sequence (prompt and response are contiguous). Needs at
    least one prompt token per sample (as the padded path does).

    ``share_prompts``: samples whose prompt tokens are the same are laid out as the prompt once,
    then each response, positions continuing from the prompt's length (``[0 .. P + n1)``,
    ``[P .. P + n2)``, ...); only a model on :data:`rlzoo.train_kit.attention.PACKED_SDPA` reads
    that layout (:func:`rlzoo.train_kit.attention.row_layout`).
    """
    if share_prompts:
        return _pack_sharing_prompts(mb)
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


def _pack_sharing_prompts(mb: Batch) -> Packed:
    """:func:`pack` with each distinct prompt once: a group's samples laid out together, the first
    carrying the prompt (a group kept together is what lets :func:`rlzoo.train_kit.attention.row_layout`
    tell a response that continues its group's prompt from one that continues the row)."""
    ids = mb["input_ids"]  # [b, L]
    attn = mb["attention_mask"].bool()  # [b, L]
    T = mb["responses"].shape[1]
    P = ids.shape[1] - T
    response_valid = attn[:, -T:]  # [b, T]
    n_resp = [int(n) for n in response_valid.sum(-1).tolist()]  # right-padded: the first n are real
    groups: dict[tuple[int, ...], list[int]] = {}  # prompt tokens -> its rows, in order
    for i in range(ids.shape[0]):
        groups.setdefault(tuple(ids[i, :P][attn[i, :P]].tolist()), []).append(i)
    chunks: list[Tensor] = []
    positions: list[Tensor] = []
    predict: dict[int, Tensor] = {}
    cursor = 0
    for prompt_tokens, rows in groups.items():
        p, start = len(prompt_tokens), cursor
        chunks.append(ids.new_tensor(prompt_tokens))
        positions.append(torch.arange(p, device=ids.device))
        cursor += p
        for i in rows:
            n = n_resp[i]
            chunks.append(ids[i, P : P + n])
            positions.append(torch.arange(p, p + n, device=ids.device))  # each continues the prompt
            # token t is predicted by the token before it: the prompt's last for t = 0 (the first
            # response follows it in the row, a later one only by position)
            predict[i] = torch.cat(
                [
                    torch.tensor([start + p - 1], device=ids.device),
                    torch.arange(cursor, cursor + n - 1, device=ids.device),
                ]
            )[:n]
            cursor += n
    return Packed(
        input_ids=rearrange(torch.cat(chunks), "n -> 1 n"),  # [1, N]
        position_ids=rearrange(torch.cat(positions), "n -> 1 n"),  # [1, N]
        predict_at=torch.cat([predict[i] for i in range(ids.shape[0])]),  # [n], sample after sample
        targets=ids[:, P:][response_valid],  # [n]
        response_valid=response_valid,  # [b, T]
    )


def unpack(values: Tensor, response_valid: Tensor) -> Tensor:
    """``[n]`` per-response-token values back to ``[b, T]``, zero on padding."""
    out = torch.zeros(response_valid.shape, dtype=values.dtype, device=values.device)  # [b, T]
    return out.masked_scatter(response_valid, values)


# ---------------------------------------------------------------------------------------------
# one micro-batch of a causal LM: response log-probs, sum_pi_squared, critic values
# ---------------------------------------------------------------------------------------------
def trim(mb: Batch) -> tuple[Tensor, Tensor, Tensor, int, int]:
    """Columns of a micro-batch that any row attends to.

    Returns ``(input_ids, attention_mask, position_ids, T_eff, resp_start)`` where the trimmed
    tensors are ``[b, P' + T_eff]`` and position ``resp_start - 1 + t`` predicts response token t.
    """
    ids = mb["input_ids"]  # [b, P+T]
    attn = mb["attention_mask"]  # [b, P+T]
    T = mb["responses"].shape[1]
    P = ids.shape[1] - T
    if "position_ids" in mb:
        pos = mb["position_ids"]  # [b, P+T]
    else:
        pos = (attn.long().cumsum(-1) - 1).clamp(min=0)  # [b, P+T]
    cols = attn.bool().any(0)  # [P+T]
    prompt_cols = cols[:P].nonzero()
    start = min(int(prompt_cols[0]) if len(prompt_cols) else P - 1, max(P - 1, 0))
    resp_cols = cols[P:].nonzero()
    t_eff = max(1, int(resp_cols[-1]) + 1 if len(resp_cols) else 1)
    end = P + t_eff
    return ids[:, start:end], attn[:, start:end], pos[:, start:end], t_eff, P - start


def pad_response(x: Tensor, mb: Batch) -> Tensor:
    """``[b, T_eff]`` per-token outputs of :func:`trim`'s columns back to ``[b, T]``, zero on padding."""
    T = mb["responses"].shape[1]
    valid = mb["attention_mask"][:, -T:].bool()  # [b, T]
    return torch.where(valid, F.pad(x, (0, T - x.shape[1])), 0.0)  # [b, T]


def actor_log_probs(
    module: nn.Module,
    mb: Batch,
    *,
    keep_arg: bool,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
    packed: bool = False,
    lm_head: nn.Linear | None = None,
    matmul_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (+ entropy) ``[b, T]`` of one micro-batch already on the device; zero on padding.

    ``lm_head`` (from :func:`fusable_lm_head`, text models, ``chunk_tokens > 0``): the decoder's
    hidden states go through :func:`linear_token_log_probs` (the LM head applied
    per chunk; the logits are never built), the matmul in ``matmul_dtype`` (default: the hidden
    states' dtype; bf16 under autocast, as the head would run).

    Padded forward over the :func:`trim` columns, or (``packed``, text models) one padding-free
    forward (:func:`packed_response_logits`); ``keep_arg``: the module's forward takes
    ``logits_to_keep``; ``chunk_tokens``: :func:`token_log_probs`'s chunks. Text models (a
    vision-language model's forward also takes its images: the native backend's
    ``vl_actor_log_probs``).
    """
    if lm_head is not None and chunk_tokens > 0:
        hidden, targets, pk = response_hidden(module, mb, packed=packed)  # [r, t, H], [r, t]
        if matmul_dtype is not None:
            hidden = hidden.to(matmul_dtype)
        lp, ent = linear_token_log_probs(
            hidden,
            lm_head.weight,
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
        )
        if pk is not None:
            return unpack(lp[0], pk.response_valid), None if ent is None else unpack(
                ent[0], pk.response_valid
            )
    elif packed:
        logits, pk = packed_response_logits(module, mb, keep_arg=keep_arg)  # [1, n, V]
        lp, ent = token_log_probs(
            logits,
            pk.targets[None],
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
        )  # [1, n]
        return unpack(lp[0], pk.response_valid), None if ent is None else unpack(ent[0], pk.response_valid)
    else:
        logits, targets = response_logits(module, mb, keep_arg=keep_arg)  # [b, T_eff, V], [b, T_eff]
        lp, ent = token_log_probs(
            logits, targets, temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens
        )
    return pad_response(lp, mb), None if ent is None else pad_response(ent, mb)  # [b, T]


def response_logits(module: nn.Module, mb: Batch, *, keep_arg: bool) -> tuple[Tensor, Tensor]:
    """Logits ``[b, T_eff, V]`` that predict the response tokens ``[b, T_eff]`` of a text micro-batch
    (padded forward over the :func:`trim` columns; position ``P - 1 + t`` predicts token ``t``).

    ``keep_arg``: only those positions go through the LM head (``logits_to_keep`` as indices), so
    the logits are exactly ``[b, T_eff, V]``, not a slice of a larger tensor whose backward would
    allocate the larger gradient."""
    ids, attn, pos, t_eff, _ = trim(mb)
    L = ids.shape[1]
    if keep_arg:
        keep = torch.arange(L - t_eff - 1, L - 1, device=ids.device)  # [T_eff]
        logits = module(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=keep
        ).logits  # [b, T_eff, V]
    else:
        logits = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
        logits = logits[:, -(t_eff + 1) : -1]  # [b, T_eff, V]
    return logits, mb["responses"][:, :t_eff]


def response_hidden(module: nn.Module, mb: Batch, *, packed: bool) -> tuple[Tensor, Tensor, Packed | None]:
    """The decoder's last hidden states at the positions that predict the response tokens, and
    those tokens: ``[b, T_eff, H]``, ``[b, T_eff]`` over the :func:`trim` columns, or (``packed``)
    ``[1, n, H]``, ``[1, n]`` and the :class:`Packed` layout."""
    decoder: Any = module.get_decoder()  # type: ignore[operator]
    if packed:
        pk = pack(mb, share_prompts=shares_prompts(module))
        with packed_forward():
            out = decoder(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False)
        return out.last_hidden_state[:, pk.predict_at], pk.targets[None], pk
    ids, attn, pos, t_eff, _ = trim(mb)
    L = ids.shape[1]
    out = decoder(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False)
    return out.last_hidden_state[:, L - t_eff - 1 : L - 1], mb["responses"][:, :t_eff], None


def packed_response_logits(module: nn.Module, mb: Batch, *, keep_arg: bool) -> tuple[Tensor, Packed]:
    """Logits ``[1, n, V]`` that predict the ``n`` real response tokens of a text micro-batch, from
    one padding-free forward (:func:`pack`: real tokens end to end, positions
    restarting per sequence, no attention mask, so HF attention keeps each sequence to itself)."""
    pk = pack(mb, share_prompts=shares_prompts(module))
    if keep_arg:
        with packed_forward():
            out = module(
                input_ids=pk.input_ids,
                position_ids=pk.position_ids,
                use_cache=False,
                logits_to_keep=pk.predict_at,
            )
        return out.logits, pk  # [1, n, V]
    with packed_forward():
        out = module(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False)
    return out.logits[:, pk.predict_at], pk  # [1, n, V]


def actor_log_probs_and_sum_pi_squared(
    module: nn.Module,
    mb: Batch,
    *,
    keep_arg: bool,
    temperature: float,
    vision: bool = False,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
    packed: bool = False,
) -> tuple[Tensor, Tensor]:
    """Log-probs (as :func:`actor_log_probs`) and ``sum_pi_squared`` ``[b, T]`` of one text
    micro-batch on the device, from one forward; zero on padding. ``vision``: refused (VL models
    take their logits inside :func:`~rlzoo.backends.native.multimodal.vl_token_log_probs`)."""
    if vision:
        raise NotImplementedError(
            "sum_pi_squared (advantages with needs_sum_pi_squared, e.g. optimal_token_baseline) is not "
            "computed for vision-language models yet; use another advantage (e.g. grpo) with VL models"
        )
    if packed:
        plogits, pk = packed_response_logits(module, mb, keep_arg=keep_arg)  # [1, n, V]
        plp, _ = token_log_probs(
            plogits, pk.targets[None], temperature=temperature, chunk_tokens=chunk_tokens
        )
        psps = sum_pi_squared(plogits, temperature=temperature, chunk_tokens=max(1, chunk_tokens))
        return unpack(plp[0], pk.response_valid), unpack(psps[0], pk.response_valid)  # [b, T]
    logits, targets = response_logits(module, mb, keep_arg=keep_arg)  # [b, T_eff, V], [b, T_eff]
    lp, _ = token_log_probs(logits, targets, temperature=temperature, chunk_tokens=chunk_tokens)
    sps = sum_pi_squared(logits, temperature=temperature, chunk_tokens=max(1, chunk_tokens))  # [b, T_eff]
    return pad_response(lp, mb), pad_response(sps, mb)  # [b, T]


def critic_values(critic: nn.Module, mb: Batch, *, packed: bool = False) -> Tensor:
    """Values ``[b, T]`` of one micro-batch on the device (value at ``P - 1 + t``); zero on padding.
    ``packed``: one padding-free forward (as :func:`packed_response_logits`)."""
    if packed:
        pk = pack(mb, share_prompts=shares_prompts(critic))
        with packed_forward():
            values = critic(pk.input_ids, None, pk.position_ids, keep_index=pk.predict_at)[0]  # [n]
        return unpack(values, pk.response_valid)  # [b, T]
    ids, attn, pos, t_eff, _ = trim(mb)
    values = critic(ids, attn, pos, keep_last=t_eff + 1)[:, :-1]  # [b, T_eff]
    return pad_response(values, mb)  # [b, T]


def sum_pi_squared(logits: Tensor, *, temperature: float = 1.0, chunk_tokens: int = 1024) -> Tensor:
    """``sum_v pi_v^2`` ``[B, T]`` of ``pi = softmax(logits / temperature)`` (``logits`` ``[B, T, V]``).

    ``exp(logsumexp(2 z) - 2 logsumexp(z))`` with ``z = logits / temperature`` in fp32 (the form
    verl's ``calculate_sum_pi_squared_from_logits`` uses; no softmax is materialised), over at most
    ``chunk_tokens`` positions of one row at a time, so the extra memory is ``[chunk_tokens, V]``
    (``logits`` may be a strided slice; it is not copied whole).
    """
    rows, width = logits.shape[0], logits.shape[1]
    out = torch.empty((rows, width), dtype=torch.float32, device=logits.device)  # [B, T]
    step = max(1, chunk_tokens)
    for i in range(rows):
        for start in range(0, width, step):
            z = logits[i, start : start + step].float()  # [c, V]
            if temperature != 1.0:
                z = z / temperature
            out[i, start : start + step] = torch.exp(
                torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1)
            )
    return out
