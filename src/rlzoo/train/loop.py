"""The one training loop. Runners differ only in the batch source that feeds it.

    build_loop(config, run_dir, lock): the session (rlzoo.train.session: the recipe read once into
                RunInputs), the runner's batch source = its registered factory(params, session); on a
                resume source.resume(the checkpoint's data); Run.train() (rlzoo.recipe.compose) runs it
    for step in start+1 .. total:
        batch  <- source.next_batch(step, timer)   sync: generate now; one_step_off: the batch
                                                   generated beside the last step; fully_async:
                                                   R*M groups from the staleness-aware queue
        staleness of the batch (measured from the policy version of every sample's tokens)
        policy update (PolicyTrainer: old / ref log-probs, advantages, PPO epochs)
        every plan.push_every steps (and the last): source.push_weights(timer) -> a new policy version
        source.step_done(batch): the source's metrics of the step
        validation when due (on the weights just pushed; a Background source holds generation)
        checkpoint when due: ONE payload for every runner (step, trainer, source.state_dict(),
        policy version); export when due; one metrics row

The loop owns validation, checkpoints, the weight-push cadence, metrics, the staleness
measurement, Ctrl-C (with the resume command), the end-of-run summary and resume. A batch source
(:class:`BatchSource`) owns only where batches come from and how a weight push reaches its
rollout side; one that generates while the trainer trains is also a :class:`Background`.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlzoo.kernel.batch import Batch
from rlzoo.recipe.types import Selection
from rlzoo.report.console import failure_lines
from rlzoo.report.metrics import PhaseTimer, read_metrics
from rlzoo.system.failpoints import failpoint
from rlzoo.system.signals import Terminated, shielded
from rlzoo.train.batching import rollout_metrics
from rlzoo.train.checkpoint import read_summary
from rlzoo.train.rewards import guard_rewards
from rlzoo.train.session import Session, open_session

if TYPE_CHECKING:
    from pathlib import Path

    from rlzoo.recipe.types import RecipeConfig
    from rlzoo.train.checkpoint import RunLock

logger = logging.getLogger("rlzoo")

#: phases that are model compute (forward / backward / generation); the rest is framework overhead
COMPUTE_PHASES = ("gen", "old_log_prob", "ref", "values", "update_actor", "update_critic")


class SourceExhausted(RuntimeError):
    """The batch source has nothing more to give (e.g. fully-async drew every prompt it may)."""


class StepTimer(PhaseTimer):
    """One step's phase timer. A source times the phases in which the trainer waits for data with
    :meth:`wait`; the loop counts those as idle (``trainer/idle_ratio``)."""

    def __init__(self) -> None:
        super().__init__()
        self.idle: set[str] = set()

    def wait(self, phase: str) -> AbstractContextManager[None]:
        """``with timer.wait("wait_queue"): ...`` times ``phase`` as trainer idle time."""
        self.idle.add(phase)
        return self(phase)


class BatchSource(Protocol):
    """Where the loop's batches come from: what a runner is. Everything else is the loop's.

    A runner plugin registers a factory ``(params, session) -> BatchSource`` (a class will do); the
    session (:class:`~rlzoo.train.session.Session`) carries the step plan (``session.plan``), the
    backends and the helpers that generate, score and collate (``make_loader``,
    ``train_requests``, ``score``, ``keep``, ``sync_weights``). See ``tests/sources/test_custom_source.py``.
    """

    def resume(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (once, before the first batch, on a resume)."""

    def next_batch(self, step: int, timer: StepTimer) -> Batch | None:
        """The batch of ``step``; None skips the update (a filter dropped every group).

        Time waits for data with ``timer.wait(phase)``. Raises :class:`SourceExhausted` when no
        more batches will come."""
        ...

    def push_weights(self, timer: StepTimer) -> dict[str, float]:
        """Bring the trainer's weights to the rollout side; returns weight-sync metrics."""
        ...

    def step_done(self, batch: Batch | None) -> dict[str, float]:
        """The step's update on ``batch`` is done (None: skipped): the source's metrics of the step."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this source without losing or repeating a prompt."""
        ...


@runtime_checkable
class Background(Protocol):
    """A batch source that generates while the trainer trains (one-step-off, fully-async)."""

    def hold(self) -> AbstractContextManager[None]:
        """Hold generation while the loop validates on the current weights."""
        ...

    def close(self, exc: BaseException | None) -> None:
        """Stop the background work, once, on every exit (``exc``: the loop is failing with it)."""


def build_loop(config: RecipeConfig, run_dir: Path, lock: RunLock, resume_info: Any = None) -> TrainLoop:
    """The session (models loaded, resume applied) and the runner's batch source, ready to
    :meth:`~TrainLoop.run`. ``run_dir`` is claimed and ``lock`` held by the caller, which hands the
    lock to the session (:meth:`rlzoo.recipe.compose.Run.loop` does both)."""
    runner = config.runner
    assert isinstance(runner, Selection)
    session = open_session(config, run_dir, lock, resume_info)
    try:
        source: BatchSource = runner.fn(runner.params, session)
    except BaseException:
        session.close()
        raise
    return TrainLoop(session, source)


class VersionMap:
    """Policy versions (weight pushes so far) from the rollout backend's own version numbers.

    Every token a rollout backend produces carries the backend's version at that moment; the
    loop records which backend version each push installed, so any token's policy version, and
    a sample's staleness (``current - oldest``), is measured rather than assumed.
    """

    def __init__(self, backend_version: int, policy_version: int = 0) -> None:
        self._keys = [int(backend_version)]
        self._vals = [int(policy_version)]

    @property
    def current(self) -> int:
        return self._vals[-1]

    def push(self, backend_version: int) -> int:
        """A push installed ``backend_version``: a new policy version (returned)."""
        v = self._vals[-1] + 1
        if int(backend_version) == self._keys[-1]:
            self._vals[-1] = v  # the same backend version again (e.g. no update since): relabel
        else:
            i = bisect.bisect_left(self._keys, int(backend_version))
            self._keys.insert(i, int(backend_version))
            self._vals.insert(i, v)
        return v

    def copy(self) -> VersionMap:
        """The map as it is now (later pushes do not change it)."""
        out = VersionMap(0)
        out._keys, out._vals = list(self._keys), list(self._vals)
        return out

    def of(self, backend_version: int) -> int:
        i = bisect.bisect_right(self._keys, int(backend_version)) - 1
        return self._vals[max(i, 0)]


def version_metrics(versions: Sequence[Sequence[int]], versions_map: VersionMap) -> dict[str, float]:
    """Staleness and partial-rollout metrics of a trained batch, in policy versions.

    ``versions[i]``: the backend version that produced each token of sample ``i``. Staleness of a
    sample: the current policy version minus the version of its oldest token. Version span: how
    many policy versions its tokens cover (> 0: a partial rollout resumed across a weight push).
    """
    now = versions_map.current
    per_sample = [now - versions_map.of(min(v)) if v else 0 for v in versions]
    spans = []
    for v in versions:
        pv = {versions_map.of(x) for x in set(v)}
        spans.append(max(pv) - min(pv) if pv else 0)
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


def is_due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


class TrainLoop:
    """Drives a :class:`BatchSource` through the steps of a :class:`~rlzoo.train.session.Session`."""

    def __init__(self, session: Session, source: BatchSource) -> None:
        self.s = session
        self.source = source
        self.versions = VersionMap(int(session.rollout.version), 0)
        self.staleness_hist: dict[int, int] = {}
        self._closed = False

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        s, src, plan = self.s, self.source, self.s.plan
        t_start = time.perf_counter()
        rows: list[dict[str, Any]] = []
        ended = "completed"
        try:
            if s.resumed is not None and s.start_step >= s.schedule.total_steps:
                finished = self._already_finished()
                if finished is not None:
                    return finished
                # killed after its last checkpoint, before its summary: the summary of its rows
                rows = [r for r in read_metrics(s.run_dir) if r.get("step", 0) > 0]
            if s.resumed is not None:
                state = s.resumed.payload
                src.resume(state["data"])
                self.versions = VersionMap(int(s.rollout.version), int(state.get("policy_version", 0)))
            total = s.schedule.total_steps
            if s.schedule.validate_before_train and s.start_step == 0 and s.data.val is not None:
                rows.append(s.metrics.log(0, s.validate(0), advance=False))
            since_push = 0
            val_pending = False
            t_prev = time.perf_counter()
            for step in range(s.start_step + 1, total + 1):
                timer = StepTimer()
                m: dict[str, Any] = {}
                with timer("step"):
                    try:
                        batch = src.next_batch(step, timer)
                    except SourceExhausted as exc:
                        s.metrics.write(f"rlzoo: training stopped: {exc}")
                        ended = f"stopped early: {exc}"
                        break
                    if batch is not None:
                        # every runner's batch, however collated: non-finite rewards failed and
                        # counted; the batch's own metrics (critic/score, reward/failed, agent/*)
                        guard_rewards(batch)
                        m.update(rollout_metrics(batch, s.data.max_response_length))
                        m.update(self._staleness(batch))
                        model_mask = batch["response_mask"]  # as collated: a correction may mask more
                        m.update(s.trainer.step(batch, timer))
                        since_push += 1
                        with timer("samples"):  # in the background; waits only for the last step's
                            s.samples.write_train(step, batch, model_mask, self.versions.copy().of)
                    synced = False
                    if since_push and (step % plan.push_every == 0 or step == total):
                        with timer("sync_weights"):
                            m.update(src.push_weights(timer))
                        self.versions.push(int(s.backends.train.version))
                        since_push, synced = 0, True
                m["rollout/skipped_step"] = float(batch is None)
                wall = time.perf_counter() - t_prev
                m.update(self._perf(batch, timer, wall))
                m.update(src.step_done(batch))
                if s.data.val is not None and is_due(step, s.schedule.test_freq, total):
                    val_pending = True
                if val_pending and (synced or since_push == 0):  # on the weights just pushed
                    with timer("testing"), self._held():
                        m.update(s.validate(step))
                    m["timing_s/testing"] = timer.seconds["testing"]
                    val_pending = False
                # rlzoo.train.failures: counted over the trained batch, the same for every runner
                m.update(s.reward.failures.end_step(step, batch, write=s.metrics.write))
                # HF folders export/step_K/ + final/ (rlzoo.train.export), before the checkpoint: a step is
                # saved only complete, so a kill during the export has the resume redo it
                m.update(s.export(step, total))
                if is_due(step, s.schedule.save_freq, total):
                    # the checkpoint carries the step's row so far: killed before the row is
                    # written below, the resumed run writes it from there (no gap in the metrics)
                    with timer("samples"):  # the samples of every step saved are on disk first
                        s.samples.flush()
                    with timer("save_checkpoint"), shielded():  # a SIGTERM lets a due checkpoint finish
                        s.save(
                            step,
                            {
                                **self.payload(step, val=m.get("val/mean")),
                                "metrics_row": s.metrics.record(step, m),
                            },
                        )
                    m["timing_s/save_checkpoint"] = timer.seconds["save_checkpoint"]
                    m["timing_s/samples"] = timer.seconds["samples"]
                failpoint("metrics:before")
                rows.append(s.metrics.log(step, m))
                failpoint("metrics:after")
                s.reward.failures.check()  # (nearly) all trained samples failed too many steps in a row
                t_prev = time.perf_counter()
            s.samples.flush()  # the last steps' samples on disk (a failed write fails the run here)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (rlzoo.system.signals.Terminated)
            self._close_source(exc)
            s.metrics.write(s.resume_hint())
            how = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
            self._summary_on_the_way_out(rows, t_start, f"interrupted ({how})")
            raise
        except BaseException as exc:
            self._close_source(exc)
            self._summary_on_the_way_out(rows, t_start, f"failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self._close_source(None)
            s.close()
        return s.finish(rows, wall_s=time.perf_counter() - t_start, ended=ended, extra=self.summary_extra())

    def _already_finished(self) -> dict[str, Any] | None:
        """A resume of a run that completed (its checkpoint is the last step, its ``summary.json``
        says so): nothing to train, and the summary is kept as the run wrote it, not rewritten by a
        run of no steps. None when the run has no such summary (killed before writing it)."""
        s = self.s
        summary = read_summary(s.run_dir)
        if summary is None or summary.get("ended") != "completed" or summary.get("last_step") != s.start_step:
            return None
        s.metrics.write(
            f"rlzoo: {s.run_dir} is finished: its checkpoint of step {s.start_step} is the run's last step "
            f"(of {s.schedule.total_steps}); nothing to resume. To train it further, resume with more steps "
            f"(e.g. {s.resume_command} trainer.total_steps={s.start_step * 2})"
        )
        return summary

    def _held(self) -> AbstractContextManager[None]:
        return self.source.hold() if isinstance(self.source, Background) else contextlib.nullcontext()

    def _close_source(self, exc: BaseException | None) -> None:
        if not self._closed and isinstance(self.source, Background):
            self._closed = True
            self.source.close(exc)

    def _summary_on_the_way_out(self, rows: list[dict[str, Any]], t_start: float, ended: str) -> None:
        """``summary.json`` says how this run ended, not what an earlier run of the directory did."""
        try:
            summary = self.s.finish(
                rows, wall_s=time.perf_counter() - t_start, ended=ended, extra=self.summary_extra()
            )
            lines = failure_lines(summary)  # what failed, by part and message, before the error line
            if lines:
                print(
                    "\n".join([f"rlzoo: the run {ended.split(':', 1)[0]}; what failed:", *lines]), flush=True
                )
        except Exception as exc:  # never hide the error that got us here
            logger.warning("could not write summary.json: %s", exc)

    # -- pieces ---------------------------------------------------------------------------------
    def payload(self, step: int, val: Any = None) -> dict[str, Any]:
        """The one checkpoint payload of every runner (``val``: the step's ``val/mean``, if validated)."""
        out = {
            "step": step,
            "runner": self.s.runner_name,
            "trainer": self.s.trainer.state_dict(),
            "data": self.source.state_dict(),
            "policy_version": self.versions.current,
        }
        if isinstance(val, (int, float)):
            out["val"] = float(val)
        return out

    def _staleness(self, batch: Batch) -> dict[str, float]:
        """Per sample: current policy version minus the version of its oldest token (measured)."""
        versions = batch.get("versions") or []
        now = self.versions.current
        for v in versions:
            st = now - self.versions.of(min(v)) if v else 0
            self.staleness_hist[st] = self.staleness_hist.get(st, 0) + 1
        return version_metrics(versions, self.versions)

    def _perf(self, batch: Batch | None, timer: StepTimer, wall: float) -> dict[str, float]:
        out = timer.metrics()
        step_s = timer.seconds["step"]
        idle = sum(timer.seconds.get(p, 0.0) for p in timer.idle)
        out["trainer/idle_ratio"] = min(1.0, idle / wall) if wall > 0 else 0.0
        out["trainer/step_wall_s"] = wall
        if batch is None:
            return out
        tokens = float(batch["attention_mask"].sum().item())
        out["perf/total_num_tokens"] = tokens
        out["perf/throughput"] = tokens / wall if wall > 0 else 0.0
        out["perf/trainer_tokens_per_s"] = tokens / step_s if step_s > 0 else 0.0
        compute = sum(timer.seconds.get(p, 0.0) for p in COMPUTE_PHASES)
        waits = sum(timer.seconds.get(p, 0.0) for p in timer.idle if p not in (*COMPUTE_PHASES, "reward"))
        other = step_s - compute - timer.seconds.get("reward", 0.0) - waits
        out["perf/overhead_frac"] = max(0.0, other) / step_s if step_s > 0 else 0.0
        return out

    def summary_extra(self) -> dict[str, Any]:
        return {
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "failures": self.s.reward.failures.summary(),
        }
