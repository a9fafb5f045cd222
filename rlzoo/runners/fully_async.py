"""The fully asynchronous runner: a Rollouter streams groups into a staleness-aware queue, a Trainer pulls them.

    Rollouter (thread)                               Trainer (main thread)
    prompts -> submit(n per prompt) ─┐               queue.get(R*M groups)          ◀── waits: trainer idle
    stream() one sample at a time ◀──┘               old/ref log-probs, advantages, PPO (PolicyTrainer)
    score as samples arrive                          every K steps: push weights
    complete group -> queue.put ───▶ StalenessQueue ◀── (partial_rollout: pause, update, resume;
                                                          else: hold admission, drain, update)

The two sides share only the :class:`~rlzoo.runners.queue.StalenessQueue` and the backends'
methods (``submit / stream / pause / resume / update_weights`` on the rollout side,
``export_weights`` and the update on the trainer side), so each can become an actor later.

Staleness (see :mod:`rlzoo.runners.queue` and docs/runners.md): per sync window the Rollouter may
start at most ``floor((1 + staleness_threshold) * K * R * M)`` groups, counting the groups carried
over from older weights; no group whose oldest token is more than ``ceil(staleness_threshold)``
policy versions behind the trainer is ever trained on (dropped, counted, regenerated).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from rlzoo.errors import ConfigError
from rlzoo.metrics import PhaseTimer
from rlzoo.protocols import GenerationRequest, RewardResult, Sample
from rlzoo.runners.async_params import (
    FullyAsyncParams,
    max_staleness_versions,
    mini_batch_groups,
    window_budget,
)
from rlzoo.runners.queue import Group, QueueExhausted, StalenessQueue, TrainerFailed

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
    attempt: int = 1  # 2, 3, ... when regenerated after a staleness drop


class PromptSource:
    """Draws prompts from a :class:`~rlzoo.data.dataset.PromptLoader` and tracks those not yet trained.

    ``state_dict()`` holds the loader state plus every outstanding prompt (drawn, not yet trained:
    buffered, in flight, queued, dropped for regeneration); :meth:`load_state_dict` re-draws those
    first, so across a checkpoint no prompt is lost or trained twice. Thread-safe.
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

    def trained(self, prompts: Sequence[Prompt]) -> None:
        with self._lock:
            for p in prompts:
                self._outstanding.pop(p.seq, None)
                self.trained_keys.append(p.key)

    def state_dict(self) -> dict[str, Any]:
        def enc(ps: Sequence[Prompt]) -> list[list[int]]:
            return [[p.key[0], p.key[1], p.batch_no, p.j] for p in ps]

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
            return [Prompt((int(e), int(i)), 0, int(b), int(j), self.dataset[int(i)]) for e, i, b, j in rows]

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
    samples: list[Sample] = field(default_factory=list)
    results: list[RewardResult] = field(default_factory=list)


class Rollouter:
    """Feeds the rollout backend, consumes its stream, scores, groups, and fills the queue.

    Args:
        rollout: the rollout backend (submit / stream / num_pending).
        queue: the :class:`StalenessQueue` shared with the trainer.
        prompts: where prompts come from.
        score: ``score(samples) -> rewards``.
        sample_filter: optional ``filter(samples, rewards) -> keep mask`` (one group at a time).
    """

    def __init__(
        self,
        rollout: Any,
        queue: StalenessQueue,
        prompts: PromptSource,
        score: Callable[[list[Sample]], list[RewardResult]],
        sample_filter: Callable[[list[Sample], list[RewardResult]], list[bool]] | None = None,
        poll: float = POLL_S,
    ) -> None:
        self.rollout = rollout
        self.queue = queue
        self.prompts = prompts
        self.score = score
        self.sample_filter = sample_filter
        self.poll = poll
        self.open: dict[str, _Open] = {}
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="rlzoo-rollouter", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def run(self) -> None:
        try:
            self._loop()
        except TrainerFailed:
            return  # the trainer stopped us: nothing to report
        except BaseException as exc:
            logger.error("rollouter failed: %r", exc)
            self.queue.fail(exc, "rollouter")

    def _loop(self) -> None:
        q = self.queue
        t_mark = time.perf_counter()
        while not q.stopped:
            if q.park_requested:
                t0 = time.perf_counter()
                q.parked_wait(self.poll)
                q.report(idle_s=time.perf_counter() - t0)
                continue
            self._admit()
            if self.open:
                got, tokens = self._consume()
                q.report(tokens=tokens, samples=got)
            else:
                t0 = time.perf_counter()
                q.wait_for_change(self.poll)
                q.report(idle_s=time.perf_counter() - t0)
            now = time.perf_counter()
            q.report(wall_s=now - t_mark)
            t_mark = now

    def _admit(self) -> None:
        q, reqs = self.queue, []
        while True:
            regen = q.acquire_regen()
            if regen is not None:  # the payload of a group dropped as too stale: generate it again
                p: Prompt = regen[0]
                p.attempt += 1
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
        """Take finished samples for up to ``poll`` seconds; score them; put complete groups."""
        deadline = time.monotonic() + self.poll
        chunk: list[Sample] = []
        for s in self.rollout.stream(timeout=self.poll):
            chunk.append(s)
            if time.monotonic() >= deadline:
                break
        if not chunk:
            return 0, 0
        results = self.score(chunk)
        done: list[_Open] = []
        for s, r in zip(chunk, results):
            g = self.open.get(s.request_id)
            if g is None:
                raise RuntimeError(
                    f"the rollout backend returned a sample of an unknown request {s.request_id!r}"
                )
            g.samples.append(s)
            g.results.append(r)
            if len(g.samples) == g.n:
                done.append(g)
        for g in done:
            rid = next(iter(g.samples)).request_id
            del self.open[rid]
            self._finish(g)
        return len(chunk), sum(len(s.response_ids) for s in chunk)

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
# The runner (Trainer side)
# ---------------------------------------------------------------------------------------------
class FullyAsyncRunner:
    def __init__(self, params: FullyAsyncParams, run: Any) -> None:
        self.params = params
        self.run_obj = run
        self.queue: StalenessQueue | None = None
        self.rollouter: Rollouter | None = None
        self.prompts: PromptSource | None = None

    # -- helpers --------------------------------------------------------------------------------
    def _plan(self, cfg: Any) -> tuple[int, int | None]:
        """(groups per trainer step, trainer steps or None for the Session's own count)."""
        p = self.params
        step_groups = p.require_batches * mini_batch_groups(cfg)
        if p.total_rollout_steps is not None:
            return step_groups, max(1, p.total_rollout_steps // step_groups)
        return step_groups, None

    def run(self) -> dict[str, Any]:
        from rlzoo.runners.session import Session

        cfg = self.run_obj.config
        problems = FullyAsyncParams.check(self.params, cfg)
        if problems:
            raise ConfigError(problems)
        step_groups, steps = self._plan(cfg)
        run = self.run_obj
        if steps is not None:  # the LR schedule and the progress bar count trainer steps of R*M prompts
            cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=steps))
            run = SimpleNamespace(config=cfg, make_run_dir=self.run_obj.make_run_dir)
        s = Session(run, desc="fully_async")
        try:
            return self._run(s, step_groups)
        finally:
            s.close()

    def _run(self, s: Any, step_groups: int) -> dict[str, Any]:
        import torch

        from rlzoo.data.dataset import PromptLoader
        from rlzoo.runners.common import (
            make_requests,
            rollout_metrics,
            samples_to_batch,
            sampling_params,
            write_summary,
        )
        from rlzoo.runners.sync import is_due

        cfg, p = s.cfg, self.params
        if len(s.train_data) < step_groups:
            raise ConfigError(
                [
                    f"runner.require_batches: {p.require_batches} x trainer.ppo_mini_batch_size={mini_batch_groups(cfg)} = "
                    f"{step_groups} prompts per trainer step, but the training data has only {len(s.train_data)} usable prompts"
                ]
            )
        total_steps = s.total_steps
        if cfg.trainer.total_steps is None:  # epochs over the data, in steps of R*M prompts
            total_steps = max(1, len(s.train_data) // step_groups) * cfg.trainer.total_epochs
        K = p.trigger_parameter_sync_step
        max_stale = max_staleness_versions(p.staleness_threshold)
        budget = window_budget(p.staleness_threshold, K, step_groups)

        # resume state beyond what the Session restores
        state: dict[str, Any] = {}
        if cfg.resume:
            state = dict(
                getattr(s, "resume_state", None) or s.train_backend.load_checkpoint(s.ckpt.latest()) or {}
            )
        fa_state = state.get("fully_async", {})
        param_version = int(fa_state.get("param_version", 0))

        loader = PromptLoader(
            s.train_data, batch_size=step_groups, shuffle=cfg.data.shuffle, seed=cfg.run.seed
        )
        loader.load_state_dict(s.loader.state_dict())

        def make_request(pr: Prompt) -> GenerationRequest:
            base = cfg.run.seed * 100_003 + pr.batch_no * 101 + pr.attempt  # as sync's step / round
            sp = sampling_params(cfg, seed=base)
            req = make_requests([pr.item], sp, prefix=f"s{pr.batch_no}r{pr.attempt}", processor=s.processor)[
                0
            ]
            req.request_id = f"s{pr.batch_no}r{pr.attempt}-{pr.j}"
            req.sampling = dataclasses.replace(sp, seed=base * 1_000_003 + pr.j)
            return req

        limit = p.total_rollout_steps
        self.prompts = prompts = PromptSource(s.train_data, loader, make_request, limit)
        if fa_state:
            prompts.load_state_dict(fa_state["prompts"])
        q = StalenessQueue(
            budget=budget,
            max_staleness=max_stale,
            capacity=p.max_queue_size,
            param_version=param_version,
            backend_version=int(getattr(s.rollout, "version", s.train_backend.version)),
        )
        self.queue = q
        sample_filter = None
        if s.filter is not None:
            flt = s.filter

            def sample_filter(samples: list[Sample], results: list[RewardResult]) -> list[bool]:
                rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)
                return [bool(k) for k in flt(rewards, torch.zeros(len(samples), dtype=torch.long)).tolist()]

        self.rollouter = rollouter = Rollouter(s.rollout, q, prompts, s.score, sample_filter)
        print(
            f"rlzoo: fully_async: {step_groups} groups/step (require_batches={p.require_batches} x mini-batch "
            f"{mini_batch_groups(cfg)}), n={cfg.rollout.n}, sync every {K} steps, window budget {budget} groups, "
            f"max staleness {max_stale} version(s), partial_rollout={p.partial_rollout}, {total_steps} steps",
            flush=True,
        )

        last: dict[str, Any] = {}
        consumed_samples = 0
        staleness_hist: dict[int, int] = {}
        if cfg.trainer.val_before_train and s.start_step == 0 and s.val_data is not None:
            last.update(s.metrics.log(0, s.validate(), advance=False))
        rollouter.start()
        val_pending = False
        t_prev = time.perf_counter()
        try:
            for step in range(s.start_step + 1, total_steps + 1):
                timer = PhaseTimer()
                m: dict[str, Any] = {}
                with timer("step"):
                    with timer("wait_queue"):
                        try:
                            groups = q.get(step_groups, timeout=p.wait_timeout_s)
                        except QueueExhausted as exc:
                            s.metrics.write(f"rlzoo: training stopped by queue termination: {exc}")
                            break
                    stale = q.staleness_of(groups)
                    assert max(stale) <= max_stale, f"staleness invariant violated: {stale}"
                    groups.sort(key=lambda g: g.seq)
                    batch_prompts = [g.payload[0] for g in groups]
                    samples = [x for g in groups for x in g.payload[1]]
                    results = [x for g in groups for x in g.payload[2]]
                    with timer("collate"):
                        batch = samples_to_batch(
                            samples,
                            results,
                            int(s.tokenizer.pad_token_id),
                            max_response_length=cfg.data.max_response_length,
                        )
                    m.update(rollout_metrics(batch, cfg.data.max_response_length))
                    m.update(self._version_metrics(q, groups, samples, stale, staleness_hist))
                    m.update(s.trainer.step(batch, timer))
                    prompts.trained(batch_prompts)
                    consumed_samples += len(samples)
                    if step % K == 0 or step == total_steps:
                        self._push_weights(s, q, timer)
                m.update(timer.metrics())
                now = time.perf_counter()
                wall = now - t_prev
                idle = timer.seconds.get("wait_queue", 0.0) + timer.seconds.get("sync_drain", 0.0)
                m["trainer/idle_ratio"] = idle / wall if wall > 0 else 0.0
                m["trainer/step_wall_s"] = wall
                tokens = float(batch["attention_mask"].sum().item())
                m["perf/total_num_tokens"] = tokens
                m["perf/throughput"] = tokens / wall if wall > 0 else 0.0
                m["perf/trainer_tokens_per_s"] = (
                    tokens / timer.seconds["step"] if timer.seconds["step"] > 0 else 0.0
                )
                m["trainer/samples_consumed"] = float(consumed_samples)
                m["trainer/prompts_consumed"] = float(len(prompts.trained_keys))
                m.update(self._rollouter_metrics(q))
                if s.val_data is not None and is_due(step, cfg.trainer.test_freq, total_steps):
                    val_pending = True
                synced = step % K == 0 or step == total_steps
                if val_pending and synced:  # on the weights just pushed
                    with timer("testing"):
                        q.park(timeout=p.wait_timeout_s)
                        try:
                            m.update(s.validate())
                        finally:
                            q.unpark()
                    m["timing_s/testing"] = timer.seconds["testing"]
                    val_pending = False
                if is_due(step, cfg.trainer.save_freq, total_steps):
                    with timer("save_checkpoint"):
                        self._save(s, step, q)
                    m["timing_s/save_checkpoint"] = timer.seconds["save_checkpoint"]
                last = s.metrics.log(step, m)
                t_prev = time.perf_counter()
        except BaseException as exc:
            q.fail(exc, "trainer")
            raise
        finally:
            q.stop()
            rollouter.join(timeout=30)
        summary = {
            "run_dir": str(s.run_dir),
            "steps": total_steps,
            "final": last,
            "staleness_histogram": {str(k): v for k, v in sorted(staleness_hist.items())},
        }
        write_summary(s.run_dir, summary)
        return summary

    # -- pieces ---------------------------------------------------------------------------------
    def _push_weights(self, s: Any, q: StalenessQueue, timer: PhaseTimer) -> None:
        """Push the trainer's weights to the rollout backend; open a new staleness window."""
        new = q.param_version + 1
        backend_version = int(s.train_backend.version)
        if not self.params.partial_rollout:
            with timer("sync_drain"):  # finish in-flight requests under the old weights
                q.hold()
                q.wait_drained(timeout=self.params.wait_timeout_s)
        try:
            with timer("sync_weights"):
                q.register_version(backend_version, new)
                if self.params.partial_rollout:
                    s.rollout.pause()  # in-flight requests keep their tokens
                try:
                    s.rollout.update_weights(s.train_backend.export_weights(), backend_version)
                finally:
                    if self.params.partial_rollout:
                        s.rollout.resume()
                q.on_sync(new)
        finally:
            if not self.params.partial_rollout:
                q.release()

    def _save(self, s: Any, step: int, q: StalenessQueue) -> None:
        assert self.prompts is not None
        s.ckpt.save(
            step,
            s.train_backend,
            {
                "step": step,
                "loader": self.prompts.loader.state_dict(),
                "trainer": s.trainer.state_dict(),
                "fully_async": {"prompts": self.prompts.state_dict(), "param_version": q.param_version},
            },
        )

    @staticmethod
    def _version_metrics(
        q: StalenessQueue, groups: list[Group], samples: list[Sample], stale: list[int], hist: dict[int, int]
    ) -> dict[str, float]:
        per_sample: list[int] = []
        for g, st in zip(groups, stale):
            per_sample += [st] * g.n_samples
            hist[st] = hist.get(st, 0) + g.n_samples
        spans = []
        for smp in samples:
            vs = {q.version_of(v) for v in set(smp.versions)}
            spans.append(max(vs) - min(vs) if vs else 0)
        n = max(len(per_sample), 1)
        return {
            "staleness/mean": sum(per_sample) / n,
            "staleness/max": float(max(per_sample, default=0)),
            "staleness/min": float(min(per_sample, default=0)),
            "staleness/stale_ratio": sum(1 for x in per_sample if x > 0) / n,
            "rollout/partial_ratio": sum(1 for x in spans if x > 0) / max(len(spans), 1),
            "rollout/version_span/mean": sum(spans) / max(len(spans), 1),
            "rollout/version_span/max": float(max(spans, default=0)),
        }

    @staticmethod
    def _rollouter_metrics(q: StalenessQueue) -> dict[str, float]:
        m = q.snapshot()
        st = q.take_stats()
        wall = st.get("wall_s", 0.0)
        if wall > 0:
            m["rollouter/idle_ratio"] = min(1.0, st.get("idle_s", 0.0) / wall)
            m["perf/rollouter_tokens_per_s"] = st.get("tokens", 0.0) / wall
        m["rollouter/filtered_groups"] = st.get("filtered_groups", 0.0)
        return m
