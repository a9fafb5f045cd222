"""The native rollout engine: batched KV-cache sampling with continuous batching.

Works with any Hugging Face causal LM (anything whose ``forward`` takes ``input_ids``,
``attention_mask``, ``position_ids`` and a ``DynamicCache``) and, without a cache, with any module
that maps ``input_ids`` (+ ``attention_mask`` / ``position_ids``) to logits.

Parts, composed (each an object the engine holds): the sequence / batch state and the batch
surgery below (:class:`~rlzoo.backends.native.batch.BatchSurgery`), the model calls (forwards,
prefills, VL inputs; :class:`~rlzoo.backends.native.forward.ModelCalls`); the seeds and top-k /
top-p filter are in :mod:`rlzoo.backends.native.sampling`. This module holds :class:`NativeEngine`,
its requests, threads, loop and decode step.

Layout of the running batch
---------------------------
``B`` running sequences (``B <= max_num_seqs``) share one KV cache of ``T`` columns. Every row is
*right-aligned*: its context (all its tokens but the last) fills the last columns of the row, the
columns before it are padding, masked out by ``ctx_mask``; ``position_ids`` are given per row, so
padding never shifts positions. The last token of each row (``last_tok``, sampled but not yet fed)
is what the next decode step feeds::

    ctx_ids / cache columns  ->   0   1   2   3   4   5        last_tok
    row 0 (long prompt)           p   p   p   p   r   r        r
    row 1 (joined later)          .   .   .   p   p   r        r      ('.' = padding, mask 0)

One decode step feeds ``last_tok`` ([B, 1]) with the mask ``[ctx_mask, 1]`` and the cache, samples a
token per row and appends one column to every row. A sequence that stops leaves the batch at once
(its row is dropped from the cache; leading columns that are padding in every remaining row are
cut). Queued sequences join in the same step: their contexts are prefilled together (left-padded,
one forward, the ``n`` samples of a prompt share one prefill) and their KV is left-padded to ``T``
(or the running rows to the joiners' length) and concatenated along the batch. So a long response
never holds the slots of short ones.

The cache's layers keep spare columns (:mod:`rlzoo.backends.native.kv`): a decode step writes its
keys and values in place instead of concatenating (copying) the whole cache of every layer; the
batch surgery above still hands them plain tensors, copied into new buffers at the next step.

After ``update_weights`` the KV of in-flight rows was computed by the old weights; with
``recompute_kv_on_update`` the whole running context is re-prefilled (one forward over ``ctx_ids``,
the same layout) before the next decode step.

Without a cache (``use_kv_cache=False`` or a model that returns none, or a cache whose layers are
not plain full-attention ``DynamicLayer``s, e.g. sliding-window or linear-attention layers) the
same layout is kept for the token ids only and every step recomputes the whole context.

Vision-language models
----------------------
With a Qwen2-VL-style model (:func:`rlzoo.backends.native.multimodal.is_multimodal_model`), a
request's ``multi_modal`` holds its images' ``pixel_values`` / ``image_grid_thw`` and its
``prompt_ids`` already have one image token per merged patch
(:func:`~rlzoo.models.processor.expand_prompt`). Every full forward (a joiners' prefill,
a re-prefill after a weight update, each step without a cache) passes the rows' pixels
concatenated in row order and M-RoPE position ids ``[3, B, L]`` from the model's rope index; each
row keeps its ``rope_delta``, and a decode step feeds ``pos + rope_delta`` on all three axes (the
KV cache holds the images). Samples of a prompt share its prefill only when they share its images.
The image / video placeholder tokens are never sampled (a response holding one could not go
through a forward with pixels again: the model matches image features to those tokens); the
log-prob of a sampled token is still of the full distribution, as with top-k / top-p.

Sampling
--------
Per row: temperature, top-k, top-p (top-k first, then top-p on the renormalised top-k
distribution, as in HF / vLLM), greedy. Sampling inverts the CDF (:func:`inverse_cdf_draw`): one
``u ~ U[0, 1)`` (float64) per row and step from the row's own ``torch.Generator``, the token is the
first whose cumulative probability (a float64 cumsum of ``softmax(logits')``) exceeds ``u``. One
random number per row, not one per vocabulary entry: a Gumbel-max draw (``argmax(logits' - log E)``,
``E ~ Exp(1)`` per token, what the engine did before) drew 64 x 49,152 exponentials per decode step
of SmolLM2, serially, 205 ms on 2 shared cores (load 6) against 50 ms. Each sequence's generator is seeded from
``(engine seed, request seed, sample index)`` (or the request's submission number when the request
has no seed), so a sequence's tokens do not depend on which other sequences share the batch, on
slot timing or on threads.

Rollout log-prob of a token: ``log_softmax(logits / temperature)[token]`` of the model's full
distribution, without top-k / top-p truncation (what a trainer recomputes with the same
temperature). Greedy rows use ``temperature`` as given, 1.0 when it is 0.

Threads
-------
The engine runs either driven by the caller (``generate`` / ``stream`` call :meth:`step`) or in a
background thread (:meth:`start`). ``submit`` is thread-safe and never waits for a step;
finished samples go to a queue that ``stream`` / ``generate`` read. ``pause`` returns once no step
is running; ``update_weights`` takes the step lock, so it always lands between two steps.
``generate`` blocks its caller anyway, so it always drives the steps on the calling thread (the
background loop stands by meanwhile; every running sequence still advances): no hand-off per call,
and torch's intra-op thread team of the caller is the only one at work. With the background
thread doing the steps while the caller trains, two OpenMP teams contend for the cores: on 2 cores
a small model's training step took twice as long.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn

from rlzoo.backends.native.batch import BatchSurgery, _Batch, _Seq
from rlzoo.backends.native.forward import ModelCalls
from rlzoo.backends.native.sampling import _NEG_INF, _filter_top_k_top_p, _mix_seed
from rlzoo.kernel.protocols import GenerationRequest, Sample
from rlzoo.rollout_kit.streams import POLL_S, collect_requested, requested_keys, stream_samples

__all__ = ["NativeEngine", "inverse_cdf_draw"]


def inverse_cdf_draw(logits: Tensor, u: Tensor) -> Tensor:
    """One token per row drawn from ``softmax(logits)`` ``[B, V]`` by inverting its CDF at ``u``
    ``[B]`` (float64, in ``[0, 1)``): the first token whose cumulative probability exceeds
    ``u * total``. A token of probability 0 (``-inf`` logit) is never drawn, whatever ``u``."""
    cdf = logits.softmax(dim=-1).cumsum(dim=-1, dtype=torch.float64)  # [B, V]
    total = cdf[:, -1:].contiguous()  # [B, 1], 1 up to rounding
    tok = torch.searchsorted(cdf, u[:, None].to(torch.float64) * total, right=True)  # [B, 1]
    last = torch.searchsorted(cdf, total)  # [B, 1], the last token of nonzero probability
    return torch.minimum(tok, last).squeeze(-1)  # [B]


class NativeEngine:
    """Continuous-batching sampler over a causal LM. See the module docstring for the design.

    Args:
        model: the causal LM (already on its device, in its dtype).
        eos_token_ids: tokens that end every sequence (finish reason ``"stop"``), on top of each
            request's ``sampling.stop_token_ids``. The stop token is kept as the last response token.
        pad_token_id: id written in padding columns (never attended to).
        max_num_seqs: slots: sequences decoded together.
        max_prefill_tokens: padded tokens per prefill forward (joins are chunked to fit).
        seed: engine seed; with the request seed (or submission number) and the sample index it
            seeds each sequence's generator.
        max_response_length: cap on every request's ``max_new_tokens`` (None: no cap).
        max_prompt_length: longer prompts are rejected at submit (None: no check).
        recompute_kv_on_update: re-prefill in-flight sequences after ``update_weights``.
        use_kv_cache: False recomputes the whole context every step.
        record_routes: keep a MoE model's top-k expert indices of every position fed, per layer, in
            each sample's ``routed_experts`` (router replay; :mod:`rlzoo.backends.native.routes`).
        kv_spare_columns: columns each KV cache layer keeps to spare, so that a decode step writes
            in place (:mod:`rlzoo.backends.native.kv`; None: its ``SPARE_COLUMNS``; 0: transformers'
            ``DynamicLayer``, which concatenates the whole cache every step).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int = 0,
        max_num_seqs: int = 64,
        max_prefill_tokens: int = 16384,
        seed: int = 0,
        max_response_length: int | None = None,
        max_prompt_length: int | None = None,
        recompute_kv_on_update: bool = True,
        use_kv_cache: bool = True,
        record_routes: bool = False,
        kv_spare_columns: int | None = None,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.model = model.eval()
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_num_seqs = int(max_num_seqs)
        self.max_prefill_tokens = max(1, int(max_prefill_tokens))
        self.seed = int(seed)
        self.max_response_length = max_response_length
        self.max_prompt_length = max_prompt_length
        self.recompute_kv_on_update = recompute_kv_on_update
        self.version = 0

        self.stats = {"steps": 0, "decode_forwards": 0, "prefill_forwards": 0, "tokens": 0, "recomputes": 0}
        self._calls = ModelCalls(
            model,
            use_kv_cache=use_kv_cache,
            stats=self.stats,
            record_routes=record_routes,
            kv_spare_columns=kv_spare_columns,
        )
        self.device = self._calls.device
        self._vl = self._calls.vl
        self._banned: Tensor | None = None  # tokens never sampled (a VL model's placeholders)
        if self._vl:
            cfg = model.config
            banned = [getattr(cfg, k, None) for k in ("image_token_id", "video_token_id")]
            banned = [int(t) for t in banned if t is not None]
            if banned:
                self._banned = torch.tensor(banned, dtype=torch.long, device=self.device)

        self._out: queue.Queue[Sample] = queue.Queue()
        self._rows = BatchSurgery(
            self._calls,
            pad_token_id=self.pad_token_id,
            max_prefill_tokens=self.max_prefill_tokens,
            out=self._out,
        )
        self._waiting: deque[_Seq] = deque()
        self._kv_stale = False
        self._num_requests = 0  # submission counter: seeds requests that carry no seed

        # threads: _step_lock guards the batch, the model and the waiting queue; _cv guards the
        # inbox, the counters and the paused / stop flags (submit never waits for a step).
        self._step_lock = threading.RLock()
        self._cv = threading.Condition()
        self._inbox: deque[_Seq] = deque()
        self._submitted = 0
        self._delivered = 0
        self._paused = False
        self._stop = False
        self._closed = False
        self._drivers = 0  # generate() calls driving the steps themselves; the loop stands by
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------------------------------
    # public API
    # ------------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests (``sampling.n`` sequences each). Thread-safe; returns at once."""
        if self._closed:
            raise RuntimeError("the engine was shut down")
        seqs: list[_Seq] = []
        done: list[_Seq] = []
        with self._cv:
            for req in requests:
                seqs_of_req = self._make_seqs(req, self._num_requests)
                self._num_requests += 1
                for s in seqs_of_req:
                    (done if s.max_new <= 0 else seqs).append(s)
            self._inbox.extend(seqs)
            self._submitted += len(seqs) + len(done)
            self._cv.notify_all()
        for s in done:  # nothing to generate: finished at once
            self._out.put(BatchSurgery.to_sample(s, [], [], [], "length"))

    def step(self) -> int:
        """One engine iteration: admit queued sequences, then decode one token for every row.

        Returns the number of sequences that finished. Does nothing while paused.
        """
        with self._step_lock, torch.inference_mode():
            with self._cv:
                if self._paused:
                    return 0
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            b = self._rows.batch
            if self._kv_stale:
                self._kv_stale = False
                self._rows.reprefill()
            free = self.max_num_seqs - len(b)
            if free > 0 and self._waiting:
                joiners = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                self._rows.admit(joiners)
            if len(b) == 0:
                return 0
            self.stats["steps"] += 1
            return self._decode()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        """Submit ``requests`` and block until all their samples are done.

        Returns them in request order, then sample index. Samples of other requests that finish
        meanwhile stay in the stream queue. Do not run it concurrently with a ``stream`` consumer.
        """
        requested_keys(requests)  # unique ids, before anything is submitted
        with self._cv:
            if self._paused:
                raise RuntimeError("generate() while paused would never finish: call resume() first")
            self._drivers += 1  # this thread drives the steps (module docstring, Threads)
        try:
            self.submit(requests)

            def next_sample() -> Sample | None:
                s = self._next_sample(timeout=None, poll=POLL_S, drive=True)
                if s is None and self._closed:
                    raise RuntimeError("the engine was shut down during generate()")
                return s

            return collect_requested(requests, next_sample, self._out.put, self._count_delivered)
        finally:
            with self._cv:
                self._drivers -= 1
                self._cv.notify_all()  # the background loop takes over what is left

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        """Yield finished samples as they complete, each exactly once.

        Ends when every submitted sample has been yielded, or when ``timeout`` seconds pass
        without a new sample (``None``: wait as long as work is pending). Without a background
        thread the caller drives the engine through this iterator; while paused it then waits up
        to ``timeout`` for another thread to resume (``None``: ends at once, nothing would drive it).
        """

        def finished() -> bool:
            if self.num_pending() == 0 or self._closed:
                return True
            # paused with nobody to drive the engine: waiting would never end
            return timeout is None and self._paused and not self._thread_alive()

        yield from stream_samples(
            lambda remaining: self._next_sample(timeout=remaining, poll=POLL_S),
            finished,
            self._count_delivered,
            timeout,
        )

    def _count_delivered(self) -> None:
        with self._cv:
            self._delivered += 1

    def start(self) -> None:
        """Run the engine loop in a background thread (idempotent)."""
        if self._thread_alive():
            return
        if self._closed:
            raise RuntimeError("the engine was shut down")
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="rlzoo-native-engine", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop generating; returns once no step is in progress. In-flight sequences keep their tokens."""
        with self._cv:
            self._paused = True
        with self._step_lock:  # wait for the step in progress, if any
            pass

    def resume(self) -> None:
        """Continue generating (after a weight update the in-flight KV is re-prefilled first)."""
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Copy new weights into the model in place and set ``version``.

        Takes the step lock, so it lands between two steps. In-flight sequences continue under
        the new weights (their next tokens carry ``version``); with ``recompute_kv_on_update``
        their KV is recomputed before the next decode step.
        """
        with self._step_lock, torch.no_grad():
            own = dict(self.model.state_dict(keep_vars=True))
            unknown = []
            for name, tensor in named_tensors:
                target = own.get(name)
                if target is None:
                    unknown.append(name)
                    continue
                target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
            if unknown:
                raise KeyError(
                    f"update_weights: {len(unknown)} names the model does not have, e.g. {unknown[:5]}"
                )
            self.version = int(version)
            if self.recompute_kv_on_update and self._calls.use_cache and len(self._rows.batch) > 0:
                self._kv_stale = True

    def abort(self, request_ids: Iterable[str] | None = None) -> int:
        """Finish queued and in-flight sequences now (all, or those of ``request_ids``).

        Their samples keep the tokens generated so far, with finish reason ``"abort"``, and are
        delivered like any other. Returns how many were aborted.
        """
        ids = None if request_ids is None else set(request_ids)

        def hit(s: _Seq) -> bool:
            return ids is None or s.request.request_id in ids

        with self._step_lock, torch.inference_mode():
            with self._cv:
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            queued = [s for s in self._waiting if hit(s)]
            self._waiting = deque(s for s in self._waiting if not hit(s))
            for s in queued:
                self._out.put(BatchSurgery.to_sample(s, [], [], [], "abort"))
            rows = [i for i, s in enumerate(self._rows.batch.seqs) if hit(s)]
            if rows:
                self._rows.finish_rows(rows, ["abort"] * len(rows))
        return len(queued) + len(rows)

    def num_pending(self) -> int:
        """Samples submitted and not yet handed out by ``stream`` / ``generate`` (queued, running or done)."""
        with self._cv:
            return self._submitted - self._delivered

    def num_running(self) -> int:
        """Sequences in the batch now."""
        return len(self._rows.batch)

    def num_waiting(self) -> int:
        """Sequences queued for a slot."""
        with self._cv:
            return len(self._waiting) + len(self._inbox)

    def shutdown(self) -> None:
        """Stop the background thread and drop every sequence and the cache."""
        with self._cv:
            self._stop = True
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._step_lock:
            self._rows.batch = _Batch(self.device)
            self._waiting.clear()
            self._inbox.clear()

    # ------------------------------------------------------------------------------------------
    # threads
    # ------------------------------------------------------------------------------------------
    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _has_work(self) -> bool:
        return bool(self._inbox or self._waiting or len(self._rows.batch))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (self._paused or self._drivers or not self._has_work()):
                    self._cv.wait()
                if self._stop:
                    return
            try:
                self.step()
            except BaseException as e:  # surfaced to the consumer by stream() / generate()
                self._error = e
                with self._cv:
                    self._stop = True
                    self._cv.notify_all()
                return

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("the native rollout engine thread failed") from self._error

    def _next_sample(self, timeout: float | None, poll: float, drive: bool = False) -> Sample | None:
        """The next finished sample, driving the engine when no thread does (or ``drive``: the
        caller drives it, the background loop standing by); None if none came."""
        try:
            return self._out.get_nowait()
        except queue.Empty:
            pass
        self._raise_if_failed()
        if self._thread_alive() and not drive:
            wait = poll if timeout is None else max(0.0, min(poll, timeout))
            try:
                return self._out.get(timeout=wait)
            except queue.Empty:
                self._raise_if_failed()
                return None
        if not self._paused and self._has_work():
            self.step()
        elif self._paused:
            with self._cv:  # another thread may resume us
                self._cv.wait(timeout=poll if timeout is None else min(poll, timeout))
        try:
            return self._out.get_nowait()
        except queue.Empty:
            return None

    # ------------------------------------------------------------------------------------------
    # sequences
    # ------------------------------------------------------------------------------------------
    def _make_seqs(self, req: GenerationRequest, number: int) -> list[_Seq]:
        sp = req.sampling
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r}: empty prompt")
        if self.max_prompt_length is not None and len(req.prompt_ids) > self.max_prompt_length:
            raise ValueError(
                f"request {req.request_id!r}: prompt of {len(req.prompt_ids)} tokens is longer than "
                f"max_prompt_length={self.max_prompt_length}"
            )
        if sp.n < 1:
            raise ValueError(f"request {req.request_id!r}: sampling.n must be >= 1, got {sp.n}")
        if self._vl:
            image_id = getattr(self.model.config, "image_token_id", None)
            if req.prompt_ids[-1] == image_id:
                raise ValueError(
                    f"request {req.request_id!r}: the prompt ends with an image token; a VL prompt must "
                    "end with text (e.g. the chat template's assistant header)"
                )
            if image_id in req.prompt_ids and not (req.multi_modal and "pixel_values" in req.multi_modal):
                raise ValueError(
                    f"request {req.request_id!r}: the prompt has image tokens but multi_modal has no "
                    "pixel_values; expand it with the model's processor (make_requests(..., "
                    "processor=...), rlzoo.models.processor.expand_prompt)"
                )
        if not 0.0 < sp.top_p <= 1.0:
            raise ValueError(f"request {req.request_id!r}: top_p must be in (0, 1], got {sp.top_p}")
        if sp.temperature < 0.0:
            raise ValueError(f"request {req.request_id!r}: temperature must be >= 0 (0: greedy)")
        greedy = sp.greedy or sp.temperature == 0.0
        max_new = sp.max_new_tokens
        if self.max_response_length is not None:
            max_new = min(max_new, self.max_response_length)
        stop = tuple(dict.fromkeys((*self.eos_token_ids, *sp.stop_token_ids)))
        req_seed: object = sp.seed if sp.seed is not None else f"auto{number}"
        out = []
        for i in range(sp.n):
            gen = None
            if not greedy:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(_mix_seed(self.seed, req_seed, i))
            out.append(
                _Seq(
                    request=req,
                    index=i,
                    tokens=list(req.prompt_ids),
                    max_new=max_new,
                    stop_ids=stop,
                    temperature=sp.temperature if sp.temperature > 0 else 1.0,
                    top_k=sp.top_k,
                    top_p=sp.top_p,
                    greedy=greedy,
                    generator=gen,
                )
            )
        return out

    # ------------------------------------------------------------------------------------------
    # decode
    # ------------------------------------------------------------------------------------------
    def _decode(self) -> int:
        """Feed ``last_tok``, sample one token per row, retire the rows that finished."""
        b = self._rows.batch
        n = len(b)
        ones = torch.ones(n, 1, dtype=torch.long, device=self.device)
        mask = torch.cat([b.ctx_mask, ones], dim=1)  # [B, T + 1]
        ids = torch.cat([b.ctx_ids, b.last_tok[:, None]], dim=1)  # [B, T + 1]
        self.stats["decode_forwards"] += 1
        if self._calls.use_cache:
            pos = b.pos[:, None]  # [B, 1]
            if self._vl:
                from rlzoo.backends.native.multimodal import decode_position_ids

                pos = decode_position_ids(b.rope_delta[:, None], pos)  # [3, B, 1]
            logits, cache = self._calls.forward(b.last_tok[:, None], mask, pos, b.cache, want_cache=True)
            if not self._calls.use_cache:  # the model's cache turned out unusable: redo this step without it
                logits, cache = self._recompute_logits(ids, mask)
        else:
            logits, cache = self._recompute_logits(ids, mask)
        b.cache, b.ctx_ids, b.ctx_mask = cache, ids, mask
        self._rows.store_routes(b.seqs, (b.pos + 1).tolist())  # up to last_tok (all of them without a cache)

        tok, lp = self._sample(logits)  # [B], [B]
        rows = torch.arange(n, device=self.device)
        b.gen_tok[rows, b.n_gen] = tok
        b.gen_lp[rows, b.n_gen] = lp
        b.gen_ver[rows, b.n_gen] = self.version
        b.n_gen += 1
        b.last_tok = tok
        b.pos = b.pos + 1
        self.stats["tokens"] += n

        stopped = (tok[:, None] == b.stop_ids).any(dim=-1)  # [B]
        done = stopped | (b.n_gen >= b.max_new)  # [B]
        if not bool(done.any()):
            return 0
        done_rows = done.nonzero().flatten().tolist()
        stop_rows = stopped.tolist()
        self._rows.finish_rows(done_rows, ["stop" if stop_rows[r] else "length" for r in done_rows])
        return len(done_rows)

    def _recompute_logits(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, None]:
        if self._vl:  # the whole context again: the rows' pixels and M-RoPE positions
            pos, _, extra = self._calls.vl_inputs(
                ids, mask, [self._calls.images(s.request) for s in self._rows.batch.seqs]
            )
            logits, _ = self._calls.forward(ids, mask, pos, None, want_cache=False, extra=extra)
            return logits, None
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T + 1]
        logits, _ = self._calls.forward(ids, mask, pos, None, want_cache=False)
        return logits, None

    def _sample(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Sampled token [B] and its log-prob [B] (full distribution at the row's temperature)."""
        b = self._rows.batch
        scaled = logits / b.temperature[:, None]  # [B, V]
        logp = scaled.log_softmax(dim=-1)  # [B, V]
        if self._banned is not None:  # VL: never sample an image / video placeholder
            logits = logits.index_fill(-1, self._banned, _NEG_INF)  # [B, V]
            scaled = scaled.index_fill(-1, self._banned, _NEG_INF)  # [B, V]
        greedy_tok = logits.argmax(dim=-1)  # [B]
        if b.all_greedy:
            tok = greedy_tok
        else:
            filtered = _filter_top_k_top_p(scaled, b.top_k, b.top_p) if b.any_filter else scaled  # [B, V]
            u = torch.zeros(len(b), dtype=torch.float64, device=self.device)  # [B]; greedy rows: unused
            rows = [row for row, _ in b.sampled_rows]
            u[rows] = torch.cat(
                [
                    torch.rand(1, generator=g, dtype=torch.float64, device=self.device)
                    for _, g in b.sampled_rows
                ]
            )
            tok = torch.where(b.greedy, greedy_tok, inverse_cdf_draw(filtered, u))  # [B]
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
