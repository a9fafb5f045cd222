"""The fully asynchronous runner: a Rollouter streams groups into a staleness-aware queue, a Trainer pulls them.

    Rollouter (thread)                               Trainer (main thread)
    prompts -> submit(n per prompt) ─┐               queue.get(R*M groups)          ◀── waits: trainer idle
    stream() one sample at a time ◀──┘               old/ref log-probs, advantages, PPO (PolicyTrainer)
    chunks -> ScoringStage (threads) -> scored       every K steps: push weights
    complete group -> queue.put ───▶ StalenessQueue ◀── (partial_rollout: pause, update, resume;
                                                          else: hold admission, drain, update)

Scoring runs beside the Rollouter (:mod:`rlzoo.sources.scoring`): while code runs in a sandbox the
Rollouter keeps submitting prompts and reading (or, without an engine thread, driving) the stream.
A group stays in flight for the queue until it is scored and put.

The two sides share only the :class:`~rlzoo.sources.queue.StalenessQueue` and the backends'
methods (``submit / stream / pause / resume / update_weights`` on the rollout side,
``export_weights`` and the update on the trainer side), so each can become an actor later.

Staleness (see :mod:`rlzoo.sources.queue` and docs/runners.md): per sync window the Rollouter may
start at most ``floor((1 + staleness_threshold) * K * R * M)`` groups, counting the groups carried
over from older weights; no group whose oldest token is more than ``ceil(staleness_threshold)``
policy versions behind the trainer is ever trained on (dropped, counted, regenerated).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.protocols import GenerationRequest, RewardResult, Sample
from rlzoo.sources.params import FullyAsyncParams, max_staleness_versions, window_budget
from rlzoo.sources.queue import Group, QueueExhausted, StalenessQueue, TrainerFailed
from rlzoo.sources.scoring import ScoringStage
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.loop import SourceExhausted, StepTimer
from rlzoo.train.session import Session

logger = logging.getLogger("rlzoo")

#: seconds between two looks at the stop flag / the stream on either side
POLL_S = 0.05


# ---------------------------------------------------------------------------------------------
# Prompts: drawn in loader batches of one trainer step, tracked until trained (resumable)
# ---------------------------------------------------------------------------------------------
@dataclass
class Prompt:
    """One drawn prompt. ``key`` = (epoch, dataset index) identifies it across a resume."""

    key: tuple[int, int]
    seq: int  # draw order in this process
    batch_no: int  # loader batch it came from (1-based): seeds its requests like sync's step
    j: int  # position in that batch
    item: dict[str, Any] = field(repr=False)
    attempt: int = 1  # of its current or next generation: 2, 3, ... once dropped as too stale


class PromptSource:
    """Draws prompts from a :class:`~rlzoo.data.dataset.PromptLoader` and tracks those not yet trained.

    ``state_dict()`` holds the loader state plus every outstanding prompt (drawn, not yet trained:
    buffered, in flight, queued, dropped for regeneration) with its loader batch, position and
    attempt; :meth:`load_state_dict` re-draws those first, so across a checkpoint no prompt is lost
    or trained twice, and each is generated with the seeds it would have had without the
    interruption (a long response in flight at a kill is generated again, not replaced). Thread-safe.
    """

    def __init__(
        self,
        dataset: Any,
        loader: Any,
        make_request: Callable[[Prompt], GenerationRequest],
        limit: int | None,
    ) -> None:
        self.dataset = dataset
        self.loader = loader
        self.make_request = make_request
        self.limit = limit  # fresh prompts drawn at most (total_rollout_steps)
        self._lock = threading.Lock()
        self._buffer: list[Prompt] = []  # fresh prompts of the current loader batch, not handed out
        self._restored: list[Prompt] = []  # outstanding prompts of a checkpoint, handed out first
        self._outstanding: dict[int, Prompt] = {}
        self._seq = 0
        self.drawn = 0
        self.batches = 0
        self.trained_keys: list[tuple[int, int]] = []  # for tests / accounting

    def draw(self) -> Prompt | None:
        """The next prompt: restored ones first, then fresh ones (None when the limit is reached)."""
        with self._lock:
            if self._restored:
                p = self._restored.pop(0)
            else:
                if self.limit is not None and self.drawn >= self.limit:
                    return None
                if not self._buffer:
                    try:
                        items = next(self.loader)
                    except StopIteration:
                        return None
                    st = self.loader.state_dict()
                    order = self.loader.order(st["epoch"])
                    idx = order[st["position"] - len(items) : st["position"]]
                    self.batches += 1
                    for j, (i, item) in enumerate(zip(idx, items)):
                        self._buffer.append(Prompt((int(st["epoch"]), int(i)), 0, self.batches, j, item))
                p = self._buffer.pop(0)
                self.drawn += 1
            self._seq += 1
            p.seq = self._seq
            self._outstanding[p.seq] = p
            return p

    def exhausted(self) -> bool:
        """No prompt will come any more from :meth:`draw`."""
        with self._lock:
            return not self._restored and self.limit is not None and self.drawn >= self.limit

    def dropped(self, p: Prompt) -> None:
        """``p``'s group was dropped as too stale: its next generation is a new attempt (new seeds)."""
        with self._lock:
            p.attempt += 1

    def trained(self, prompts: Sequence[Prompt]) -> None:
        with self._lock:
            for p in prompts:
                self._outstanding.pop(p.seq, None)
                self.trained_keys.append(p.key)

    def state_dict(self) -> dict[str, Any]:
        def enc(ps: Sequence[Prompt]) -> list[list[int]]:
            return [[p.key[0], p.key[1], p.batch_no, p.j, p.attempt] for p in ps]

        with self._lock:
            pending = self._restored + sorted(self._outstanding.values(), key=lambda p: p.seq)
            return {
                "loader": self.loader.state_dict(),
                "pending": enc(pending),
                "buffer": enc(self._buffer),
                "drawn": self.drawn,
                "batches": self.batches,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def dec(rows: Sequence[Sequence[int]]) -> list[Prompt]:
            return [
                Prompt((int(e), int(i)), 0, int(b), int(j), self.dataset[int(i)], attempt=int(a))
                for e, i, b, j, a in rows
            ]

        with self._lock:
            self.loader.load_state_dict(state["loader"])
            self.drawn = int(state.get("drawn", 0))
            self.batches = int(state.get("batches", 0))
            self._restored = dec(state.get("pending", []))
            self._buffer = dec(state.get("buffer", []))
            self._outstanding = {}


# ---------------------------------------------------------------------------------------------
# The Rollouter
# ---------------------------------------------------------------------------------------------
@dataclass
class _Open:
    prompt: Prompt
    n: int
    submit_version: int
    arrived: int = 0  # samples the stream gave back (scored or being scored)
    samples: list[Sample] = field(default_factory=list)  # scored, with their results
    results: list[RewardResult] = field(default_factory=list)


@dataclass(eq=False)
class Rollouter:
    """Feeds the rollout backend, consumes its stream, has samples scored, groups them, fills the queue.

    Scoring runs on a :class:`~rlzoo.sources.scoring.ScoringStage` (``scoring_workers`` threads), so
    the Rollouter keeps submitting prompts and consuming (or driving) the stream while a scorer runs.

    Args:
        rollout: the rollout backend (submit / stream / num_pending).
        queue: the :class:`StalenessQueue` shared with the trainer.
        prompts: where prompts come from.
        score: ``score(samples) -> rewards`` (called on the scoring stage's threads).
        sample_filter: optional ``filter(samples, rewards) -> keep mask`` (one group at a time).
        scoring_workers: chunks of samples scored at once.
    """

    rollout: Any
    queue: StalenessQueue
    prompts: PromptSource
    score: Callable[[list[Sample]], list[RewardResult]]
    sample_filter: Callable[[list[Sample], list[RewardResult]], list[bool]] | None = None
    scoring_workers: int = 1
    poll: float = POLL_S
    open: dict[str, _Open] = field(default_factory=dict, init=False)
    thread: threading.Thread | None = field(default=None, init=False)
    scoring: ScoringStage[Sample, RewardResult] | None = field(default=None, init=False)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="rlzoo-rollouter", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def run(self) -> None:
        self.scoring = ScoringStage(self.score, self.scoring_workers)
        try:
            self._loop()
        except TrainerFailed:
            return  # the trainer stopped us: nothing to report
        except BaseException as exc:
            logger.error("rollouter failed: %r", exc)
            self.queue.fail(exc, "rollouter")
        finally:
            self.scoring.stop()

    def _loop(self) -> None:
        q, scoring = self.queue, self.scoring
        assert scoring is not None
        t_mark = time.perf_counter()
        scored_mark = 0.0
        while not q.stopped:
            if q.park_requested:
                t0 = time.perf_counter()
                q.parked_wait(self.poll)
                q.report(idle_s=time.perf_counter() - t0)
                continue
            self._admit()
            self._collect(scoring.harvest())
            if any(g.arrived < g.n for g in self.open.values()):
                got, tokens = self._consume()
                q.report(tokens=tokens, samples=got)
            else:  # nothing left to generate: wait for the scorers, or for the trainer
                t0 = time.perf_counter()
                if scoring.pending():
                    self._collect(scoring.harvest(wait=self.poll))
                else:
                    q.wait_for_change(self.poll)
                q.report(idle_s=time.perf_counter() - t0)
            now = time.perf_counter()
            busy = scoring.busy_s
            q.report(wall_s=now - t_mark, scoring_s=busy - scored_mark)
            t_mark, scored_mark = now, busy

    def _admit(self) -> None:
        q, reqs = self.queue, []
        while True:
            regen = q.acquire_regen()
            if regen is not None:  # the payload of a group dropped as too stale: generate it again
                p: Prompt = regen[0]  # its attempt was counted at the drop (PromptSource.dropped)
            elif q.try_acquire():
                drawn = self.prompts.draw()
                if drawn is None:
                    q.cancel()
                    q.drawing_done()
                    break
                p = drawn
            else:
                if self.prompts.exhausted():
                    q.drawing_done()
                break
            req = self.prompts.make_request(p)
            self.open[req.request_id] = _Open(p, req.sampling.n, q.param_version)
            reqs.append(req)
        if reqs:
            self.rollout.submit(reqs)

    def _consume(self) -> tuple[int, int]:
        """Take finished samples for up to ``poll`` seconds and hand them to the scoring stage."""
        assert self.scoring is not None
        deadline = time.monotonic() + self.poll
        chunk: list[Sample] = []
        for s in self.rollout.stream(timeout=self.poll):
            chunk.append(s)
            if time.monotonic() >= deadline:
                break
        if not chunk:
            return 0, 0
        for s in chunk:
            g = self.open.get(s.request_id)
            if g is None:
                raise RuntimeError(
                    f"the rollout backend returned a sample of an unknown request {s.request_id!r}"
                )
            g.arrived += 1
        self.scoring.submit(chunk)
        return len(chunk), sum(len(s.response_ids) for s in chunk)

    def _collect(self, scored: list[tuple[list[Sample], list[RewardResult]]]) -> None:
        """Scored chunks (oldest first) into their groups; complete groups into the queue."""
        for chunk, results in scored:
            done: list[_Open] = []
            for s, r in zip(chunk, results):
                g = self.open[s.request_id]
                g.samples.append(s)
                g.results.append(r)
                if len(g.samples) == g.n:
                    done.append(g)
            for g in done:
                del self.open[g.samples[0].request_id]
                self._finish(g)

    def _finish(self, g: _Open) -> None:
        q = self.queue
        order = sorted(range(len(g.samples)), key=lambda i: g.samples[i].index)
        samples = [g.samples[i] for i in order]
        results = [g.results[i] for i in order]
        if self.sample_filter is not None:
            keep = self.sample_filter(samples, results)
            if not any(keep):
                q.cancel()
                self.prompts.trained([g.prompt])  # judged and filtered away: consumed, not lost
                q.report(filtered_groups=1)
                return
            samples = [s for s, k in zip(samples, keep) if k]
            results = [r for r, k in zip(results, keep) if k]
        vs = [q.version_of(v) for s in samples for v in (s.versions[:1] + s.versions[-1:])]
        version = min(vs) if vs else g.submit_version
        max_version = max(vs) if vs else g.submit_version
        group = Group(
            seq=g.prompt.seq,
            version=version,
            max_version=max_version,
            n_samples=len(samples),
            payload=(g.prompt, samples, results),
        )
        if not q.put(group):  # too stale already: dropped and queued for regeneration by the queue
            logger.debug("dropped stale group %s (version %d)", g.prompt.key, version)


# ---------------------------------------------------------------------------------------------
# The batch source (Trainer side)
# ---------------------------------------------------------------------------------------------
class StreamFromQueue:
    """Batch source of ``fully_async``: ``R * M`` groups per step from the staleness-aware queue.

    The Rollouter thread (started with the first :meth:`next_batch`, after any resume) fills the
    queue; a weight push opens a new staleness window (partial rollout: pause, update, resume;
    else hold admission, drain, update).
    """

    def __init__(self, params: FullyAsyncParams, session: Session) -> None:
        self.s = session
        self.params = params
        self.step_groups = step_groups = session.plan.prompts_per_step
        if len(session.data.train) < step_groups:
            raise ConfigError(
                [
                    f"runner.require_batches: {params.require_batches} x trainer.ppo_mini_batch_size="
                    f"{step_groups // params.require_batches} = {step_groups} prompts per trainer step, but the "
                    f"training data has only {len(session.data.train)} usable prompts"
                ]
            )
        self.max_stale = max_staleness_versions(params.staleness_threshold)
        self.budget = window_budget(
            params.staleness_threshold, params.trigger_parameter_sync_step, step_groups
        )
        self.prompts = PromptSource(
            session.data.train,
            session.make_loader(step_groups),
            self._make_request,
            params.total_rollout_steps,
        )
        self.queue: StalenessQueue | None = None
        self.rollouter: Rollouter | None = None
        self.consumed_samples = 0
        self._batch_prompts: list[Prompt] = []
        self._push_thread: threading.Thread | None = None  # runner.early_push: the push in flight
        self._push_error: BaseException | None = None
        self._push_metrics: dict[str, float] = {}  # of the last background push, for step_done
        self._push_stats: dict[str, float] = {}
        self._step = 0  # of the last next_batch
        self._push_version = 0  # of the push in flight

    def _make_request(self, pr: Prompt) -> GenerationRequest:
        # seeded by (loader batch, attempt) as sync's (step, round): s=0 generates what sync does
        req = self.s.train_requests([pr.item], pr.batch_no, pr.attempt)[0]
        req.request_id = f"s{pr.batch_no}r{pr.attempt}-{pr.j}"
        assert req.sampling.seed is not None
        req.sampling = dataclasses.replace(req.sampling, seed=req.sampling.seed + pr.j)
        return req

    def _keep(self, samples: list[Sample], results: list[RewardResult]) -> list[bool]:
        return self.s.keep(samples, results)

    def _start(self) -> StalenessQueue:
        s, p = self.s, self.params
        payload = s.resumed.payload if s.resumed is not None else {}
        self.queue = q = StalenessQueue(
            budget=self.budget,
            max_staleness=self.max_stale,
            capacity=p.max_queue_size,
            param_version=int(payload.get("policy_version", 0)),
            backend_version=int(s.rollout.version),
        )
        q.on_drop = lambda group, where: self.prompts.dropped(group.payload[0])
        keep = self._keep if s.reward.sample_filter is not None else None
        self.rollouter = Rollouter(s.rollout, q, self.prompts, s.score, keep, p.scoring_workers)
        print(
            f"rlzoo: fully_async: {self.step_groups} groups/step (require_batches={p.require_batches} x mini-batch "
            f"{self.step_groups // p.require_batches}), n={s.sampling.train.n}, sync every {p.trigger_parameter_sync_step} "
            f"steps, window budget {self.budget} groups, max staleness {self.max_stale} version(s), "
            f"partial_rollout={p.partial_rollout}, {s.schedule.total_steps} steps",
            flush=True,
        )
        self.rollouter.start()
        return q

    # -- BatchSource ------------------------------------------------------------------------------
    def resume(self, state: Mapping[str, Any]) -> None:
        self.prompts.load_state_dict(dict(state))

    def next_batch(self, step: int, timer: StepTimer) -> Batch | None:
        q = self.queue or self._start()
        self._step = step
        self._join_push(timer)  # the pushed weights before the update that changes them
        with timer.wait("wait_queue"):
            try:
                groups = q.get(self.step_groups, timeout=self.params.wait_timeout_s)
            except QueueExhausted as exc:
                raise SourceExhausted(f"queue termination: {exc}") from exc
        stale = q.staleness_of(groups)
        assert max(stale) <= self.max_stale, f"staleness invariant violated: {stale}"
        groups.sort(key=lambda g: g.seq)
        self._batch_prompts = [g.payload[0] for g in groups]
        samples = [x for g in groups for x in g.payload[1]]
        results = [x for g in groups for x in g.payload[2]]
        max_len = self.s.data.max_response_length
        with timer("collate"):
            batch = samples_to_batch(samples, results, self.s.pad_token_id, max_response_length=max_len)
        return batch

    def push_weights(self, timer: StepTimer) -> dict[str, float]:
        """Push the trainer's weights to the rollout backend; open a new staleness window.

        With ``early_push`` the push runs on a thread and this returns at once: the weights pushed
        are the trainer's as of now (after the window's last update; nothing updates them before the
        next batch, which waits for the push: :meth:`_join_push`). The policy version is the same
        either way: the loop counts the push now, the queue stamps ``backend_version`` before the
        engine receives it."""
        backend_version = int(self.s.backends.train.version)
        if (
            not self.params.early_push or self._step >= self.s.schedule.total_steps
        ):  # the last: nothing to overlap
            return self._push(backend_version, timer)
        self._join_push(None)  # at most one push in flight (the loop's cadence already ensures it)
        assert self.queue is not None
        self._push_version = self.queue.param_version + 1
        self._push_thread = threading.Thread(
            target=self._push_background, args=(backend_version,), name="rlzoo-push", daemon=True
        )
        self._push_thread.start()
        return {}

    def _push(self, backend_version: int, timer: StepTimer | None) -> dict[str, float]:
        q, s, partial = self.queue, self.s, self.params.partial_rollout
        assert q is not None
        new = q.param_version + 1
        if not partial:
            t0 = time.perf_counter()
            with timer.wait("sync_drain") if timer is not None else contextlib.nullcontext():
                q.hold()  # finish in-flight requests under the old weights
                q.wait_drained(timeout=self.params.wait_timeout_s)
            self._push_stats["drain_s"] = time.perf_counter() - t0
        try:
            q.register_version(backend_version, new)
            if partial:
                s.rollout.pause()  # in-flight requests keep their tokens
            try:
                pushed = s.send_weights(backend_version)
            finally:
                if partial:
                    s.rollout.resume()
            q.on_sync(new)
        finally:
            if not partial:
                q.release()
        return {} if pushed is None else {"perf/weight_push_bytes": float(pushed)}

    def _push_background(self, backend_version: int) -> None:
        t0 = time.perf_counter()
        try:
            m = self._push(backend_version, None)
        except BaseException as exc:
            logger.error("weight push (runner.early_push) failed: %r", exc)
            self._push_error = exc
            if self.queue is not None:
                self.queue.fail(exc, "trainer")  # the Rollouter stops too
            return
        m["weight_sync/background_s"] = time.perf_counter() - t0
        if "drain_s" in self._push_stats:
            m["weight_sync/background_drain_s"] = self._push_stats.pop("drain_s")
        self._push_metrics.update(m)

    def _join_push(self, timer: StepTimer | None) -> None:
        """Wait for the push in flight (trainer idle: ``timing_s/sync_wait``); its error, if any, here."""
        t = self._push_thread
        if t is None:
            return
        with timer.wait("sync_wait") if timer is not None else contextlib.nullcontext():
            t.join()
        self._push_thread = None
        if self._push_error is not None:
            exc, self._push_error = self._push_error, None
            raise RuntimeError(f"the weight push (runner.early_push) failed: {exc!r}") from exc

    def step_done(self, batch: Batch | None) -> dict[str, float]:
        """The batch's prompts are consumed; the queue's and the Rollouter's metrics (the batch's own
        are the loop's)."""
        q = self.queue
        assert q is not None
        if batch is not None:
            self.prompts.trained(self._batch_prompts)
            self.consumed_samples += len(batch)
        m = dict(q.snapshot())
        if self._push_thread is None:  # a background push's metrics once it is done (next step's row)
            m.update(self._push_metrics)
            self._push_metrics = {}
        else:  # the version in flight, as the loop counts it (from the push's start)
            m["param_version"] = float(self._push_version)
        st = q.take_stats()
        wall = st.get("wall_s", 0.0)
        if wall > 0:
            m["rollouter/idle_ratio"] = min(1.0, st.get("idle_s", 0.0) / wall)
            m["perf/rollouter_tokens_per_s"] = st.get("tokens", 0.0) / wall
        m["rollouter/filtered_groups"] = st.get("filtered_groups", 0.0)
        m["rollouter/scoring_s"] = st.get("scoring_s", 0.0)
        m["trainer/samples_consumed"] = float(self.consumed_samples)
        m["trainer/prompts_consumed"] = float(len(self.prompts.trained_keys))
        return m

    def state_dict(self) -> dict[str, Any]:
        return self.prompts.state_dict()

    # -- Background -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        assert self.queue is not None
        self._join_push(None)  # validation generates with the weights just pushed
        self.queue.park(timeout=self.params.wait_timeout_s)
        try:
            yield
        finally:
            self.queue.unpark()

    def close(self, exc: BaseException | None) -> None:
        if self._push_thread is not None and exc is None:  # a clean end: the push in flight finishes
            self._push_thread.join(timeout=self.params.wait_timeout_s)  # (its error was logged)
        if self.queue is not None:
            if exc is not None:
                self.queue.fail(exc, "trainer")
            self.queue.stop()
        if self._push_thread is not None:  # stopped queue: a push waiting on a drain returns
            self._push_thread.join(timeout=30)
        if self.rollouter is not None:
            self.rollouter.join(timeout=30)
