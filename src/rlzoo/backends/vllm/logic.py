"""The vLLM rollout backend's pure logic: no vllm, no torch, no event loop. Tested on CPU.

- :func:`vllm_sampling_kwargs`: rlzoo :class:`~rlzoo.kernel.protocols.SamplingParams` → keyword arguments
  of ``vllm.SamplingParams`` (one engine request per sample, ``n=1``).
- :class:`SeqState` / :class:`RequestBook`: per-sample bookkeeping of partial rollouts. A request
  with ``n`` samples becomes ``n`` engine requests; tokens arrive as deltas stamped with the policy
  version that produced them. On ``pause`` the engine requests are aborted and each sample is
  *parked* with what it generated so far; on ``resume`` it is resubmitted as a continuation
  (prompt + generated so far, the remaining ``max_tokens``, a seed derived from the sample's seed
  and its length) under a fresh engine request id.
- :func:`sampled_log_probs`: the sampled tokens' log-probs out of vLLM's per-position logprob dicts.
- :func:`prompt_log_prob_kwargs` / :func:`prompt_token_log_probs`: a teacher's scoring request
  (prompt log-probs, one generated token) and the given tokens' log-probs out of its output.
- :func:`map_names`: a trainer's exported HF parameter names → the names the vLLM model's
  ``load_weights`` takes (strip wrapper prefixes, drop buffers / heads vLLM does not load).
- :func:`plan_buckets`: consecutive tensors grouped into buckets of at most ``bucket_bytes``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlzoo.distributed.buckets import iter_bucketed
from rlzoo.kernel.protocols import GenerationRequest, Sample, SamplingParams

__all__ = [
    "FINISH_REASONS",
    "RequestBook",
    "SeqState",
    "finish_reason",
    "map_names",
    "mix_seed",
    "plan_buckets",
    "sampled_log_probs",
    "vllm_sampling_kwargs",
]

_SEED_MASK = (1 << 63) - 1

#: vLLM ``CompletionOutput.finish_reason`` (``vllm.v1.engine.FINISH_REASON_STRINGS``) → rlzoo
#: ``Sample.finish_reason``. ``"error"`` (a request-level engine failure) is not a completion:
#: ``"abort"``. ``"repetition"`` (vLLM cut a repetitive loop short) did not end naturally:
#: ``"length"``, as a truncated response.
FINISH_REASONS: Mapping[str, str] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "abort",
    "repetition": "length",
}


def mix_seed(*parts: object) -> int:
    """A stable 63-bit seed from printable parts (same parts → same seed, in any process).

    The same construction as the native engine's, so a request's seed means the same thing to
    both backends (their random streams still differ: different samplers).
    """
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def finish_reason(vllm_reason: str | None) -> str:
    """vLLM's finish reason → rlzoo's (:data:`FINISH_REASONS`); an unknown one is an error."""
    if vllm_reason is None:
        raise ValueError("finish_reason(None): the sequence has not finished")
    if vllm_reason not in FINISH_REASONS:
        raise ValueError(f"unknown vLLM finish reason {vllm_reason!r}; known: {sorted(FINISH_REASONS)}")
    return FINISH_REASONS[vllm_reason]


# ---------------------------------------------------------------------------------------------
# sampling params
# ---------------------------------------------------------------------------------------------
def vllm_sampling_kwargs(
    sp: SamplingParams,
    *,
    max_tokens: int,
    seed: int | None,
    eos_token_ids: Sequence[int] = (),
    logprobs: int = 0,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for ONE sample of a request.

    1:1 with rlzoo's fields: ``temperature`` (0.0 when ``greedy``: vLLM's greedy), ``top_p``,
    ``top_k`` (rlzoo's ``-1`` / ``0`` "off" → vLLM's ``0``), ``max_tokens``, ``seed`` (per sample,
    see :meth:`SeqState.seed_for_segment`; ``None`` for greedy). ``n`` is always 1: the backend fans
    a request out into one engine request per sample, so each sample streams, pauses and resumes
    on its own. Stopping matches the native engine: on ``eos_token_ids`` (the spec's) or the
    request's ``stop_token_ids``, and on nothing else (``ignore_eos=True`` turns off vLLM's own
    EOS from the tokenizer / generation config, which may differ from the spec's).
    ``logprobs=0``: vLLM returns the sampled token's log-prob only. Token ids in, token ids out:
    ``detokenize=False``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    stop = sorted({int(t) for t in (*eos_token_ids, *sp.stop_token_ids)})
    return {
        "n": 1,
        "temperature": 0.0 if sp.greedy else float(sp.temperature),
        "top_p": float(sp.top_p),
        "top_k": int(sp.top_k) if sp.top_k > 0 else 0,
        "max_tokens": int(max_tokens),
        "seed": None if sp.greedy else seed,
        "stop_token_ids": stop,
        "ignore_eos": True,
        "logprobs": int(logprobs),
        "detokenize": False,
        "skip_special_tokens": False,
    }


def sampled_log_probs(token_ids: Sequence[int], position_logprobs: Sequence[Any] | None) -> list[float]:
    """The log-prob of each sampled token, out of vLLM's ``CompletionOutput.logprobs``.

    ``position_logprobs[i]`` maps token id → an object with a ``.logprob`` (vLLM's ``Logprob``),
    for position ``i`` of ``token_ids`` (the sampled token is always in it when ``logprobs >= 0``
    was requested). Works for both ``list[dict]`` and vLLM's ``FlatLogprobs``.
    """
    if not token_ids:
        return []
    if position_logprobs is None:
        raise ValueError("the engine returned no logprobs: request them with logprobs=0")
    if len(position_logprobs) != len(token_ids):
        raise ValueError(
            f"{len(token_ids)} tokens but {len(position_logprobs)} logprob positions in one output"
        )
    out = []
    for tok, pos in zip(token_ids, position_logprobs):
        entry = pos[int(tok)]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def prompt_log_prob_kwargs() -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for scoring a token sequence (the teacher,
    ``algorithm.teacher.backend: rollout``): ``prompt_logprobs=0`` returns, at every position but
    the first, the log-prob of the token there given the tokens before it (of the raw logits:
    vLLM's prompt log-probs skip the sampling processors, temperature included); ``max_tokens=1``,
    the fewest vLLM generates, greedy so nothing is drawn."""
    return {"n": 1, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False}


def prompt_token_log_probs(
    token_ids: Sequence[int], prompt_logprobs: Sequence[Any] | None, start: int
) -> list[float]:
    """The log-prob of each of ``token_ids[start:]`` given its prefix, out of vLLM's
    ``RequestOutput.prompt_logprobs`` (one entry per token, ``None`` for the first; each maps token
    id → an object with a ``.logprob``, the given token always among them)."""
    if not 1 <= start <= len(token_ids):
        raise ValueError(
            f"start must be in [1, {len(token_ids)}] (a token is scored given its prefix), got {start}"
        )
    if prompt_logprobs is None:
        raise ValueError("the engine returned no prompt logprobs: request them with prompt_logprobs=0")
    if len(prompt_logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(prompt_logprobs)} prompt logprob positions")
    out = []
    for j in range(start, len(token_ids)):
        entry = prompt_logprobs[j][int(token_ids[j])]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


# ---------------------------------------------------------------------------------------------
# request bookkeeping for streaming and partial rollout
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class SeqState:
    """One sample of a request: what it generated so far, over one or more engine submissions."""

    request: GenerationRequest
    index: int  # 0..n-1
    base_seed: int | None  # None for greedy
    max_new: int  # response budget of the whole sample
    response_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    segments: int = 0  # engine submissions so far (1 + number of resumptions)
    engine_id: str | None = None  # the engine request currently running, if any
    segment_version: int = -1  # policy version of the running segment

    @property
    def uid(self) -> str:
        return f"{self.request.request_id}/{self.index}"

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.response_ids)

    def seed_for_segment(self) -> int | None:
        """Seed of the next submission: the sample's seed for the first, then mixed with the
        number of tokens already generated (a continuation must not replay the first draws)."""
        if self.base_seed is None:
            return None
        if not self.response_ids:
            return self.base_seed
        return mix_seed(self.base_seed, "continue", len(self.response_ids))

    def next_submission(self, version: int) -> tuple[str, list[int], int, int | None]:
        """``(engine_request_id, prompt_ids, max_tokens, seed)`` of the next engine request.

        The prompt of a continuation is the original prompt + the tokens generated so far; its
        tokens will carry ``version``.
        """
        if self.engine_id is not None:
            raise RuntimeError(f"sample {self.uid} is already running as {self.engine_id}")
        if self.remaining < 1:
            raise RuntimeError(f"sample {self.uid} has no token budget left")
        self.segments += 1
        self.engine_id = f"{self.uid}#{self.segments}"
        self.segment_version = int(version)
        prompt = [*self.request.prompt_ids, *self.response_ids]
        return self.engine_id, prompt, self.remaining, self.seed_for_segment()

    def extend(self, token_ids: Sequence[int], log_probs: Sequence[float]) -> None:
        """Append a delta of the running segment (tokens carry the segment's version)."""
        if len(token_ids) != len(log_probs):
            raise ValueError(f"{len(token_ids)} tokens but {len(log_probs)} log-probs")
        take = min(len(token_ids), self.remaining)  # never exceed the budget
        self.response_ids.extend(int(t) for t in token_ids[:take])
        self.log_probs.extend(float(x) for x in log_probs[:take])
        self.versions.extend([self.segment_version] * take)

    def to_sample(self, reason: str) -> Sample:
        return Sample.of_request(
            self.request,
            self.index,
            list(self.response_ids),
            list(self.log_probs),
            list(self.versions),
            reason,
        )


class RequestBook:
    """Every sample between ``submit`` and its delivery, keyed by engine request id.

    Not thread-safe: the backend calls it from its event-loop thread only. States:

    - *waiting*: submitted while paused (or not yet started); started by :meth:`start_waiting`.
    - *running*: an engine request is generating it (``engine_id`` set).
    - *parking*: running, but :meth:`park_running` asked for it to stop; when its engine request
      ends (aborted, or finished in the meantime) it goes back to waiting, keeping its tokens — or
      is finished, if it finished for a real reason (stop / length) or used up its budget.
    """

    def __init__(self, engine_seed: int = 0, max_response_length: int | None = None) -> None:
        self.engine_seed = int(engine_seed)
        self.max_response_length = max_response_length
        self.waiting: list[SeqState] = []
        self.running: dict[str, SeqState] = {}
        self.parking: set[str] = set()
        self._live_requests: dict[str, int] = {}  # request id → samples not yet finished
        self._num_requests = 0

    # -- intake ---------------------------------------------------------------------------------
    def add(self, requests: Iterable[GenerationRequest]) -> list[SeqState]:
        """Fan requests out into samples (appended to *waiting*); returns the new states."""
        new: list[SeqState] = []
        for req in requests:
            if req.request_id in self._live_requests:
                raise ValueError(f"request id {req.request_id!r} is already in flight")
            sp = req.sampling
            if sp.n < 1:
                raise ValueError(f"request {req.request_id!r}: sampling.n must be >= 1, got {sp.n}")
            max_new = sp.max_new_tokens
            if self.max_response_length is not None:
                max_new = min(max_new, self.max_response_length)
            self._num_requests += 1
            req_seed: object = sp.seed if sp.seed is not None else f"auto{self._num_requests}"
            for i in range(sp.n):
                seed = None if sp.greedy else mix_seed(self.engine_seed, req_seed, i)
                new.append(SeqState(request=req, index=i, base_seed=seed, max_new=max(0, max_new)))
            self._live_requests[req.request_id] = sp.n
        self.waiting.extend(new)
        return new

    def start_waiting(
        self, version: int
    ) -> tuple[list[tuple[SeqState, str, list[int], int, int | None]], list[Sample]]:
        """Start every waiting sample: ``(submissions, finished)``.

        A submission is ``(state, engine_id, prompt_ids, max_tokens, seed)``. A sample without
        budget left (``max_new_tokens`` 0, or used up before a pause) finishes at once as
        ``"length"`` and is returned in ``finished`` instead.
        """
        subs, done = [], []
        waiting, self.waiting = self.waiting, []
        for s in waiting:
            if s.remaining < 1:
                done.append(self._finish(s, "length"))
                continue
            eid, prompt, max_tokens, seed = s.next_submission(version)
            self.running[eid] = s
            subs.append((s, eid, prompt, max_tokens, seed))
        return subs, done

    # -- engine outputs -------------------------------------------------------------------------
    def on_output(
        self,
        engine_id: str,
        token_ids: Sequence[int],
        log_probs: Sequence[float],
        vllm_finish_reason: str | None,
    ) -> Sample | None:
        """A delta of ``engine_id``; returns the finished sample when the sample is done.

        Unknown ids (a late output of a request already settled) are ignored.
        """
        s = self.running.get(engine_id)
        if s is None:
            return None
        s.extend(token_ids, log_probs)
        if vllm_finish_reason is None:
            return None
        reason = finish_reason(
            vllm_finish_reason
        )  # raises on an unknown one: still running, on_error ends it
        del self.running[engine_id]
        s.engine_id = None
        parked = engine_id in self.parking
        self.parking.discard(engine_id)
        if reason == "abort" and parked:
            if s.remaining < 1:
                return self._finish(s, "length")
            self.waiting.append(s)  # keeps its tokens; resubmitted by start_waiting
            return None
        if reason == "stop" or s.remaining < 1:
            return self._finish(s, "length" if reason != "stop" else "stop")
        return self._finish(s, reason)

    def on_error(self, engine_id: str) -> Sample | None:
        """The engine request failed: the sample finishes as ``"abort"`` with its tokens."""
        s = self.running.pop(engine_id, None)
        if s is None:
            return None
        s.engine_id = None
        self.parking.discard(engine_id)
        return self._finish(s, "abort")

    # -- pause / abort --------------------------------------------------------------------------
    def park_running(self) -> list[str]:
        """Mark every running sample to be parked; returns the engine ids to abort."""
        ids = list(self.running)
        self.parking.update(ids)
        return ids

    def abort(self, request_ids: Iterable[str] | None = None) -> tuple[list[str], list[Sample]]:
        """Finish samples now with reason ``"abort"`` (all, or those of ``request_ids``).

        Waiting samples finish at once (returned); running ones are un-parked and their engine
        ids returned, to be aborted: their final output then finishes them as ``"abort"``.
        """
        wanted = None if request_ids is None else set(request_ids)

        def hit(s: SeqState) -> bool:
            return wanted is None or s.request.request_id in wanted

        done = [self._finish(s, "abort") for s in self.waiting if hit(s)]
        self.waiting = [s for s in self.waiting if not hit(s)]
        ids = [eid for eid, s in self.running.items() if hit(s)]
        self.parking.difference_update(ids)
        return ids, done

    # -- counts ---------------------------------------------------------------------------------
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def _finish(self, s: SeqState, reason: str) -> Sample:
        rid = s.request.request_id
        left = self._live_requests.get(rid, 0) - 1
        if left > 0:
            self._live_requests[rid] = left
        else:
            self._live_requests.pop(rid, None)
        return s.to_sample(reason)


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------
#: prefixes that wrappers add to parameter names (FSDP1, activation checkpointing,
#: torch.compile, DDP); stripped wherever they appear
WRAPPER_PREFIXES: tuple[str, ...] = (
    "_fsdp_wrapped_module.",
    "_checkpoint_wrapped_module.",
    "_orig_mod.",
)

#: names vLLM models do not load (rotary caches are recomputed; a critic's head is not the policy)
DEFAULT_DROP: tuple[str, ...] = (
    r"(^|\.)rotary_emb\.inv_freq$",
    r"(^|\.)rotary_emb\.(cos|sin)_cached$",
    r"^value_head\.",
)

T = TypeVar("T")


def map_names(
    named: Iterable[tuple[str, T]],
    *,
    tie_word_embeddings: bool = False,
    strip_prefixes: Sequence[str] = ("module.",),
    rename: Sequence[tuple[str, str]] = (),
    drop: Sequence[str] = DEFAULT_DROP,
) -> Iterator[tuple[str, T]]:
    """A trainer's exported HF parameter names → the names ``model.load_weights`` takes. Lazy.

    vLLM's models load **Hugging Face checkpoint names** (``model.layers.0.self_attn.q_proj.weight``)
    and do the fusing (q/k/v → ``qkv_proj``, gate/up → ``gate_up_proj``) and the TP slicing
    themselves, so the mapping is about what surrounds those names:

    1. wrapper prefixes (:data:`WRAPPER_PREFIXES`, anywhere) and leading ``strip_prefixes``
       (default ``module.``, DDP) are removed;
    2. ``rename``: ``(regex, replacement)`` pairs applied in order with ``re.sub`` (e.g. a model
       whose trainer-side names differ from its checkpoint's);
    3. names matching a ``drop`` regex are skipped (rotary caches, a critic's value head);
    4. with ``tie_word_embeddings``, ``lm_head.weight`` is skipped (it is the embedding: vLLM ties
       them, sending it twice would only cost bandwidth).

    Duplicate names after mapping are an error (two tensors would land on one parameter).
    """
    drops = [re.compile(p) for p in drop]
    renames = [(re.compile(p), r) for p, r in rename]
    seen: set[str] = set()
    for name, tensor in named:
        new = name
        for p in WRAPPER_PREFIXES:
            new = new.replace(p, "")
        for p in strip_prefixes:
            if new.startswith(p):
                new = new[len(p) :]
        for pat, repl in renames:
            new = pat.sub(repl, new)
        if any(d.search(new) for d in drops):
            continue
        if tie_word_embeddings and re.search(r"(^|\.)lm_head\.weight$", new):
            continue
        if new in seen:
            raise ValueError(f"map_names: two exported tensors map to {new!r} (the second was {name!r})")
        seen.add(new)
        yield new, tensor


def plan_buckets(sizes: Sequence[tuple[str, int]], bucket_bytes: int, align: int = 16) -> list[list[int]]:
    """Indices of consecutive tensors grouped into buckets of at most ``bucket_bytes``.

    Each tensor's size is rounded up to ``align`` bytes (its offset in a flat bucket); a tensor
    larger than ``bucket_bytes`` forms a bucket of its own. The same rule as
    :func:`rlzoo.distributed.buckets.iter_bucketed` (what the weight push uses), as a plan over sizes.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    indexed = ((i, n) for i, (_, n) in enumerate(sizes))
    return [[i for i, _ in bucket] for bucket in iter_bucketed(indexed, int, bucket_bytes, align)]
