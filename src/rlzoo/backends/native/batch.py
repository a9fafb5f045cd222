"""The running batch of the native engine: sequence state, per-row tensors and batch surgery.

The right-aligned row layout, padding and column cutting described in the "Layout of the running
batch" section of :mod:`rlzoo.backends.native.engine`'s docstring: :class:`_Seq` (one sample being
generated), :class:`_Batch` (its rows' tensors and KV cache) and :class:`BatchSurgery` (the part of the
engine that adds rows, drops rows and re-prefills them).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rlzoo.backends.native.forward import ModelCalls
from rlzoo.backends.native.sampling import _NO_TOP_K
from rlzoo.kernel.protocols import GenerationRequest, Sample


@dataclass(eq=False)
class _Seq:
    """One sample being generated (its token buffers live in the engine's batch tensors)."""

    request: GenerationRequest
    index: int
    tokens: list[int]  # prompt + generated so far: only read when the sequence joins the batch
    max_new: int
    stop_ids: tuple[int, ...]
    temperature: float  # used for the log-probs (and the sampling unless greedy)
    top_k: int  # <= 0: off
    top_p: float
    greedy: bool
    generator: torch.Generator | None  # None for greedy rows
    #: with route recording: the experts chosen at each position fed so far [positions, layers, top_k]
    routes: Tensor | None = None


class _Batch:
    """Per-row tensors of the running batch (rows aligned with the KV cache rows)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seqs: list[_Seq] = []
        self.cache: Any = None  # DynamicCache over ctx columns, or None (empty, or recompute mode)
        self.ctx_ids = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, T]
        self.ctx_mask = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, T]
        self.last_tok = torch.zeros(0, dtype=torch.long, device=device)  # [B], fed next step
        self.pos = torch.zeros(0, dtype=torch.long, device=device)  # [B], position of last_tok
        self.rope_delta = torch.zeros(0, dtype=torch.long, device=device)  # [B], M-RoPE offset (VL; else 0)
        self.gen_tok = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, G]
        self.gen_lp = torch.zeros(0, 0, dtype=torch.float32, device=device)  # [B, G]
        self.gen_ver = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, G]
        self.n_gen = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.max_new = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.stop_ids = torch.full((0, 1), -1, dtype=torch.long, device=device)  # [B, S], -1 pads
        self.temperature = torch.ones(0, device=device)  # [B]
        self.top_k = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.top_p = torch.ones(0, device=device)  # [B]
        self.greedy = torch.zeros(0, dtype=torch.bool, device=device)  # [B]
        self.any_filter = False
        self.all_greedy = True
        self.sampled_rows: list[tuple[int, torch.Generator]] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def refresh_sampling(self) -> None:
        """Rebuild the per-row sampling tensors after the batch composition changed."""
        dev = self.device
        self.temperature = torch.tensor([s.temperature for s in self.seqs], dtype=torch.float32, device=dev)
        self.top_k = torch.tensor(
            [s.top_k if s.top_k > 0 else _NO_TOP_K for s in self.seqs], dtype=torch.long, device=dev
        )
        self.top_p = torch.tensor([s.top_p for s in self.seqs], dtype=torch.float32, device=dev)
        self.greedy = torch.tensor([s.greedy for s in self.seqs], dtype=torch.bool, device=dev)
        self.max_new = torch.tensor([s.max_new for s in self.seqs], dtype=torch.long, device=dev)
        width = max([1] + [len(s.stop_ids) for s in self.seqs])
        self.stop_ids = torch.tensor(
            [list(s.stop_ids) + [-1] * (width - len(s.stop_ids)) for s in self.seqs],
            dtype=torch.long,
            device=dev,
        ).reshape(len(self.seqs), width)  # [B, S]
        self.any_filter = any((not s.greedy) and (s.top_k > 0 or s.top_p < 1.0) for s in self.seqs)
        self.all_greedy = all(s.greedy for s in self.seqs)
        self.sampled_rows = [(i, s.generator) for i, s in enumerate(self.seqs) if s.generator is not None]


def _pad_left(x: Tensor, width: int, dim: int, value: float = 0) -> Tensor:
    """``x`` left-padded along ``dim`` to ``width``."""
    extra = width - x.shape[dim]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x.new_full(shape, value), x], dim=dim)


def _pad_right(x: Tensor, width: int, value: float = 0) -> Tensor:
    """``x`` [B, W] right-padded to [B, width]."""
    extra = width - x.shape[1]
    return x if extra <= 0 else F.pad(x, (0, extra), value=value)


class BatchSurgery:
    """The engine's running batch and its surgery: admit (prefill and append) rows, drop finished
    rows (their samples go to ``out``), re-prefill the rows after a weight update. Model calls go
    through ``calls``."""

    def __init__(
        self, calls: ModelCalls, *, pad_token_id: int, max_prefill_tokens: int, out: queue.Queue[Sample]
    ) -> None:
        self.calls = calls
        self.device = calls.device
        self.pad_token_id = pad_token_id
        self.max_prefill_tokens = max_prefill_tokens
        self.out = out
        self.batch = _Batch(calls.device)

    @staticmethod
    def to_sample(
        s: _Seq, response: list[int], log_probs: list[float], versions: list[int], reason: str
    ) -> Sample:
        sample = Sample.of_request(s.request, s.index, response, log_probs, versions, reason)
        if s.routes is not None:  # the positions fed: the prompt and all but the last response token
            sample.routed_experts = s.routes[: max(len(s.request.prompt_ids) + len(response) - 1, 0)].cpu()
        return sample

    def store_routes(self, seqs: list[_Seq], ends: list[int]) -> None:
        """Keep the last forward's expert choices (``calls.routes`` ``[R, W, layers, top_k]``) on its
        rows' sequences: row ``r``'s real tokens are right-aligned and end before position
        ``ends[r]``, so its last ``min(W, ends[r])`` columns are the positions up to there (earlier
        choices of those positions are replaced: a re-prefill's or a recompute's are the latest)."""
        routes = self.calls.routes
        if self.calls.recorder is None or routes is None:
            return
        W = routes.shape[1]
        for r, (s, end) in enumerate(zip(seqs, ends)):
            n = min(W, end)
            kept = s.routes[: end - n] if s.routes is not None else routes.new_zeros(0, *routes.shape[2:])
            if kept.shape[0] != end - n:
                raise RuntimeError(
                    f"router replay: sequence {s.request.request_id}/{s.index} has routes for "
                    f"{kept.shape[0]} positions, expected {end - n}"
                )
            s.routes = torch.cat([kept, routes[r, W - n :]])  # [end, layers, top_k]
        self.calls.routes = None

    def admit(self, joiners: list[_Seq]) -> None:
        """Prefill ``joiners`` (identical contexts once) and append them to the running batch."""
        dev = self.device
        # one prefill row per distinct context: the n samples of a prompt share it (with a VL
        # model, only when they share its images too: same token ids, other pixels)
        rows: dict[tuple[tuple[int, ...], int | None], int] = {}
        first: list[_Seq] = []  # a member of each distinct context
        which = []
        for s in joiners:
            mm = self.calls.images(s.request) if self.calls.vl else None
            key = (tuple(s.tokens[:-1]), None if mm is None else id(mm))
            if key not in rows:
                rows[key] = len(rows)
                first.append(s)
            which.append(rows[key])
        contexts = [key[0] for key in rows]
        # chunk the distinct contexts so that each padded prefill stays under max_prefill_tokens
        chunks: list[list[int]] = [[]]
        width = 0
        for k, ctx in enumerate(contexts):
            w = max(width, len(ctx))
            if chunks[-1] and w * (len(chunks[-1]) + 1) > self.max_prefill_tokens:
                chunks.append([])
                w = len(ctx)
            chunks[-1].append(k)
            width = w
        for chunk in chunks:
            chunk_rows = {k: j for j, k in enumerate(chunk)}
            members = [i for i, k in enumerate(which) if k in chunk_rows]
            p = max(len(contexts[k]) for k in chunk)
            ids = torch.tensor(
                [[self.pad_token_id] * (p - len(contexts[k])) + list(contexts[k]) for k in chunk],
                dtype=torch.long,
                device=dev,
            ).reshape(len(chunk), p)  # [c, P]
            mask = torch.tensor(
                [[0] * (p - len(contexts[k])) + [1] * len(contexts[k]) for k in chunk],
                dtype=torch.long,
                device=dev,
            ).reshape(len(chunk), p)  # [c, P]
            cache, deltas = self.calls.prefill(
                ids, mask, [self.calls.images(first[k].request) for k in chunk] if self.calls.vl else None
            )
            expand = torch.tensor(
                [chunk_rows[which[i]] for i in members], dtype=torch.long, device=dev
            )  # [j]
            if len(members) != len(chunk) or expand.tolist() != list(range(len(chunk))):
                if cache is not None:
                    for layer in cache.layers:
                        layer.keys = layer.keys.index_select(0, expand)
                        layer.values = layer.values.index_select(0, expand)
                ids, mask = ids.index_select(0, expand), mask.index_select(0, expand)
                if deltas is not None:
                    deltas = deltas.index_select(0, expand)
                if self.calls.routes is not None:
                    self.calls.routes = self.calls.routes.index_select(0, expand)
            if self.calls.routes is not None:  # the prefill's forward ran: positions of the contexts
                self.store_routes(
                    [joiners[i] for i in members], [len(joiners[i].tokens) - 1 for i in members]
                )
            self.append_rows([joiners[i] for i in members], ids, mask, cache, deltas)

    def append_rows(
        self, seqs: list[_Seq], ids: Tensor, mask: Tensor, cache: Any, rope_delta: Tensor | None = None
    ) -> None:
        """Concatenate new rows (contexts ``ids``/``mask`` [j, P], their ``cache``, VL ``rope_delta``
        [j]: None is 0) to the batch."""
        b, dev = self.batch, self.device
        t, p = b.ctx_ids.shape[1], ids.shape[1]
        width = max(t, p)
        if not self.calls.use_cache:
            b.cache = None
        elif len(b) == 0:
            b.cache = cache
        elif b.cache is not None or cache is not None:
            b.cache = self.concat_caches(b.cache, len(b), cache, len(seqs), width)
        b.ctx_ids = torch.cat(
            [_pad_left(b.ctx_ids, width, 1, self.pad_token_id), _pad_left(ids, width, 1, self.pad_token_id)]
        )  # [B + j, T']
        b.ctx_mask = torch.cat([_pad_left(b.ctx_mask, width, 1), _pad_left(mask, width, 1)])  # [B + j, T']
        new_last = torch.tensor([s.tokens[-1] for s in seqs], dtype=torch.long, device=dev)  # [j]
        new_pos = torch.tensor([len(s.tokens) - 1 for s in seqs], dtype=torch.long, device=dev)  # [j]
        b.last_tok = torch.cat([b.last_tok, new_last])
        b.pos = torch.cat([b.pos, new_pos])
        if rope_delta is None:
            rope_delta = torch.zeros(len(seqs), dtype=torch.long, device=dev)  # [j]
        b.rope_delta = torch.cat([b.rope_delta, rope_delta])
        g = max(b.gen_tok.shape[1], max(s.max_new for s in seqs))
        j = len(seqs)
        b.gen_tok = torch.cat([_pad_right(b.gen_tok, g), torch.zeros(j, g, dtype=torch.long, device=dev)])
        b.gen_lp = torch.cat([_pad_right(b.gen_lp, g), torch.zeros(j, g, dtype=torch.float32, device=dev)])
        b.gen_ver = torch.cat([_pad_right(b.gen_ver, g), torch.zeros(j, g, dtype=torch.long, device=dev)])
        b.n_gen = torch.cat([b.n_gen, torch.zeros(j, dtype=torch.long, device=dev)])
        b.seqs.extend(seqs)
        b.refresh_sampling()

    @staticmethod
    def concat_caches(a: Any, rows_a: int, c: Any, rows_c: int, width: int) -> Any:
        """Batch-concatenate cache ``a`` (``rows_a`` rows, ``t`` columns) and ``c`` (``p`` columns),
        both left-padded to ``width`` columns; either may be None (no columns yet)."""
        base = a if a is not None else c
        for li, layer in enumerate(base.layers):
            parts_k, parts_v = [], []
            for cache, rows in ((a, rows_a), (c, rows_c)):
                if cache is not None:
                    k, v = cache.layers[li].keys, cache.layers[li].values  # [r, H, P, D]
                else:  # rows without context columns yet
                    ref = base.layers[li].keys
                    k = ref.new_zeros(rows, ref.shape[1], 0, ref.shape[3])
                    v = base.layers[li].values.new_zeros(
                        rows, ref.shape[1], 0, base.layers[li].values.shape[3]
                    )
                parts_k.append(_pad_left(k, width, 2))
                parts_v.append(_pad_left(v, width, 2))
            layer.keys = torch.cat(parts_k)  # [B + j, H, T', D]
            layer.values = torch.cat(parts_v)
        return base

    def keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in ``keep`` and cut leading all-padding columns."""
        b = self.batch
        if not keep:
            self.batch = _Batch(self.device)
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        b.seqs = [b.seqs[i] for i in keep]
        for name in (
            "ctx_ids",
            "ctx_mask",
            "last_tok",
            "pos",
            "rope_delta",
            "gen_tok",
            "gen_lp",
            "gen_ver",
            "n_gen",
        ):
            setattr(b, name, getattr(b, name).index_select(0, idx))
        # first column that holds a real token in some row; earlier columns are padding everywhere
        used = b.ctx_mask.any(dim=0)  # [T]
        first = int(used.int().argmax()) if bool(used.any()) else b.ctx_mask.shape[1]
        b.ctx_ids, b.ctx_mask = b.ctx_ids[:, first:], b.ctx_mask[:, first:]
        if b.cache is not None:
            if b.ctx_mask.shape[1] == 0:
                b.cache = None
            else:
                for layer in b.cache.layers:
                    layer.keys = layer.keys.index_select(0, idx)[:, :, first:]
                    layer.values = layer.values.index_select(0, idx)[:, :, first:]
        b.refresh_sampling()

    def finish_rows(self, rows: list[int], reasons: list[str]) -> None:
        """Emit the samples of ``rows`` and remove them from the batch."""
        b = self.batch
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        n_gen = b.n_gen.index_select(0, idx).tolist()
        toks = b.gen_tok.index_select(0, idx).tolist()
        lps = b.gen_lp.index_select(0, idx).tolist()
        vers = b.gen_ver.index_select(0, idx).tolist()
        for k, r in enumerate(rows):
            n = n_gen[k]
            self.out.put(self.to_sample(b.seqs[r], toks[k][:n], lps[k][:n], vers[k][:n], reasons[k]))
        gone = set(rows)
        self.keep_rows([i for i in range(len(b)) if i not in gone])

    def reprefill(self) -> None:
        """Recompute the running batch's KV with the current weights (same layout)."""
        b = self.batch
        if not self.calls.use_cache or len(b) == 0:
            return
        self.calls.stats["recomputes"] += 1
        b.cache, _ = self.calls.prefill(
            b.ctx_ids, b.ctx_mask, [self.calls.images(s.request) for s in b.seqs] if self.calls.vl else None
        )
        self.store_routes(b.seqs, b.pos.tolist())  # the contexts: positions before last_tok
