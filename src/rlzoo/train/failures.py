"""One failure policy for every runner: failed samples counted per trajectory, per kind and per
part over the TRAINED batch; each distinct error printed once with its count, its traceback kept in
``failures.jsonl``; a run whose user code fails on (nearly) everything aborts.

The session records every scored batch (:meth:`RewardFailures.record`, thread-safe: the fully-async
Rollouter and the one-step-off generation score in their own threads) — that keeps the first
traceback of each distinct error. The loop closes each trainer step with
:meth:`RewardFailures.end_step` on the batch it trained (``batch["failed"]`` and the error and part
of each sample in ``batch["reward_info"]``; a skipped step falls back on what was scored since the
last step), logs the step's metrics, then calls :meth:`RewardFailures.check`, which raises
:class:`RewardFailureError` when at least ``max_frac`` of the trained samples failed in each of
``limit`` consecutive steps. sync, one_step_off and fully_async therefore abort at the same step for
the same failures. Tool failures (exceptions, non-text returns, timeouts, malformed calls) do not
fail a trajectory (the model reads them) but are counted and printed the same way.

A failed :class:`~rlzoo.kernel.protocols.RewardResult` names its part in ``info["failed_part"]``
(``"scorer math"``, ``"environment guess_number"``, ``"reward_manager naive"``: the kind first) and
may carry ``info["traceback"]``, which :meth:`record` takes out (the batch carries only the text).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import RewardResult

logger = logging.getLogger("rlzoo")

#: distinct errors printed in full and kept in failures.jsonl per run; later new ones are counted
MAX_LOGGED_ERRORS = 50
#: characters of one traceback kept in failures.jsonl
MAX_TRACEBACK_CHARS = 20_000
#: characters of one error message kept (a message is also a key: a huge one is cut)
MAX_MESSAGE_CHARS = 2_000
#: the file, in the run directory
FAILURES_FILE = "failures.jsonl"
#: the part of a failed result that named none
UNKNOWN_PART = "reward unknown"


class RewardFailureError(RlzooError):
    """(Nearly) every trained sample failed (environment or scorer) in too many consecutive steps."""


@dataclass
class DistinctError:
    """One distinct error (its part and text) and how often it was seen in trained batches."""

    number: int  # 1, 2, ... in the order first seen
    kind: str  # environment | scorer | reward_manager | tool | reward
    part: str  # "scorer math", "tool calc" (kind first)
    message: str
    count: int = 0  # in trained batches (tools: calls in trained trajectories)
    first_step: int | None = None
    last_step: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "kind": self.kind,
            "part": self.part,
            "message": self.message,
            "count": self.count,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text) - n} more characters)"


def failure_of(info: Mapping[str, Any]) -> tuple[str, str]:
    """``(part, message)`` of a failed sample's reward info."""
    part = str(info.get("failed_part") or UNKNOWN_PART)
    message = str(info.get("error", "the scorer's result was not a finite number"))
    return part, _cut(message, MAX_MESSAGE_CHARS)


def tool_failures_of(agent: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """``(part, message)`` of each failed tool call of a trajectory record (``Sample.agent``): its
    ``tool_failures`` (failure records ``{kind, part, message, traceback}``, or ``[tool, text]``; the
    first few), then one unnamed entry for each
    further call counted in ``tool_errors``."""
    if not agent:
        return []
    named = []
    for f in agent.get("tool_failures") or []:
        if isinstance(f, Mapping):  # the rollout's failure record: {kind, part, message, traceback}
            named.append((str(f.get("part") or "tool"), _cut(str(f.get("message")), MAX_MESSAGE_CHARS)))
        else:
            tool, text = f
            named.append((f"tool {tool}", _cut(str(text), MAX_MESSAGE_CHARS)))
    rest = int(agent.get("tool_errors") or 0) - len(named)
    unnamed = ("tool (text not kept)", "a failed tool call beyond the texts its trajectory keeps")
    return named + [unnamed] * max(rest, 0)


class RewardFailures:
    """Per-step failure counts over the trained batch, each distinct error printed once, the abort rule.

    Args:
        limit: abort when ``max_frac`` of the trained samples failed in this many consecutive steps
            (0: never).
        max_frac: the failed share of a step's trained samples that counts it toward ``limit``
            (1.0: only a step in which every sample failed).
    """

    def __init__(self, limit: int, max_frac: float = 1.0) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if not 0 < max_frac <= 1:
            raise ValueError(f"max_frac must be in (0, 1], got {max_frac}")
        self.limit = limit
        self.max_frac = max_frac
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str] | None] = []  # scored since the last step (None: fine)
        self._tracebacks: dict[tuple[str, str], str] = {}  # first traceback of each distinct error
        self._log_path: Path | None = None
        self._logged: set[tuple[str, str]] = set()  # in failures.jsonl
        self._log_lines = 0
        self.errors: dict[tuple[str, str], DistinctError] = {}
        self._last_error: str | None = None
        self.streak = 0  # consecutive steps in which at least max_frac of the trained samples failed
        self._streak_frac = 1.0  # the lowest failed share in the current streak
        self.total_failed = 0  # failed samples in trained batches
        self.total_trained = 0
        self.total_tool_failed = 0
        self._step = 0
        #: samples a step trains (set by the session): the unit of the scored-streak backstop
        self.step_samples = 0
        self._scored_streak = 0  # scored samples in a row that failed, none succeeding in between

    # -- the run directory ------------------------------------------------------------------------
    def open_log(self, run_dir: Path) -> None:
        """Keep each distinct error's first traceback in ``run_dir/failures.jsonl`` (appended; a
        resumed run adds to it; at most :data:`MAX_LOGGED_ERRORS` lines, one per distinct error)."""
        self._log_path = Path(run_dir) / FAILURES_FILE
        if self._log_path.is_file():
            with self._log_path.open("rb") as fh:
                self._log_lines = sum(1 for _ in fh)

    def _append(self, entry: dict[str, Any]) -> None:
        """One JSON line, written with one ``write`` on an O_APPEND descriptor: a reader (or a
        crash) sees the whole line or none of it."""
        if self._log_path is None or self._log_lines >= MAX_LOGGED_ERRORS:
            return
        data = (json.dumps(entry, default=str) + "\n").encode()
        try:
            fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:  # a full disk must not hide the failure being recorded
            logger.warning("could not write %s: %s", self._log_path, exc)
            return
        self._log_lines += 1

    # -- scoring side (any thread) ----------------------------------------------------------------
    def record(self, results: Sequence[RewardResult]) -> None:
        """Count one scored batch (the fallback of a skipped step); take each failed result's
        traceback out of its info and keep the first of each distinct error in failures.jsonl."""
        with self._lock:
            for r in results:
                tb = r.info.pop("traceback", None)
                if not r.failed:
                    self._pending.append(None)
                    self._scored_streak = 0
                    continue
                self._scored_streak += 1
                key = failure_of(r.info)
                self._pending.append(key)
                if key not in self._logged and len(self._logged) < MAX_LOGGED_ERRORS:
                    self._logged.add(key)
                    self._append(
                        {
                            "time": time.time(),
                            "kind": key[0].split(" ", 1)[0],
                            "part": key[0],
                            "message": key[1],
                            "traceback": _cut(str(tb), MAX_TRACEBACK_CHARS) if tb else None,
                        }
                    )

    def check_scored(self) -> None:
        """The backstop for failures no trained batch shows (a sample filter drops every all-failed
        group, so fully_async would draw the whole dataset and stop "early", exit 0): raise
        :class:`RewardFailureError` once ``limit`` steps' worth of scored samples in a row failed,
        none succeeding. Called by the scoring side (any thread: the fully-async Rollouter's error
        reaches the trainer as the queue's failure)."""
        with self._lock:
            n, last = self._scored_streak, (self._pending[-1] if self._pending else None)
        # 2 x limit + 2 steps' worth: the loop's own check (after `limit` trained steps) comes first
        # whenever batches do come, one_step_off's generation one step ahead and fully_async's
        # staleness window included
        if self.limit and self.step_samples and n >= (2 * self.limit + 2) * self.step_samples:
            where = f"{last[0]}: {last[1]}" if last else "unknown"
            raise RewardFailureError(
                f"the last {n} scored samples all failed ({2 * self.limit + 2} steps of "
                f"{self.step_samples}: twice reward.max_failed_steps={self.limit}, plus 2), though no "
                f"trained batch showed it (a sample filter dropped them); the last error: {where}"
            )

    def record_tools(self, agents: Sequence[Mapping[str, Any] | None]) -> None:
        """Keep the first text of each distinct tool failure of scored trajectories in failures.jsonl."""
        with self._lock:
            for rec in agents:
                for key in tool_failures_of(rec):
                    if key not in self._logged and len(self._logged) < MAX_LOGGED_ERRORS:
                        self._logged.add(key)
                        self._append({"time": time.time(), "kind": "tool", "part": key[0], "message": key[1]})

    # -- trainer side (the loop) ------------------------------------------------------------------
    def end_step(
        self, step: int, batch: Any = None, write: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """Close ``step`` on the batch it trained (None: skipped; then what was scored since the
        previous step counts). Prints each distinct error once in full with its count, and a count
        line when errors repeat; returns ``reward/failed_frac`` (of the trained samples),
        ``reward/failed_streak``, ``reward/failed/<kind>`` and ``tool/failed``. Call
        :meth:`check` after logging them."""
        write = write or (lambda line: logger.warning("%s", line))
        with self._lock:
            pending, self._pending = self._pending, []
        failures: list[tuple[str, str] | None]
        if batch is not None and batch.get("failed") is not None:
            infos = batch.get("reward_info") or [{} for _ in batch["failed"]]
            failures = [failure_of(info) if bad else None for bad, info in zip(batch["failed"], infos)]
        else:
            failures = pending
        tools: list[tuple[str, str]] = []
        if batch is not None:
            for rec in batch.get("agent") or []:
                tools += tool_failures_of(rec)
        n = len(failures)
        failed = [f for f in failures if f is not None]
        self.total_trained += n
        self.total_failed += len(failed)
        self.total_tool_failed += len(tools)
        if failed:  # the step's distinct errors, most frequent first (ties: the first seen first)
            counts: dict[tuple[str, str], int] = {}
            for key in failed:
                counts[key] = counts.get(key, 0) + 1
            top = sorted(counts.items(), key=lambda kv: -kv[1])[:2]
            self._last_error = "; ".join(f"{p}: {m} ({c}x)" for (p, m), c in top)
        if n:
            frac = len(failed) / n
            if frac >= self.max_frac and failed:
                self._streak_frac = min(self._streak_frac, frac) if self.streak else frac
                self.streak += 1
            else:
                self.streak = 0
        self._step = step
        out = {
            "reward/failed_frac": len(failed) / n if n else 0.0,
            "reward/failed_streak": float(self.streak),
        }
        by_kind: dict[str, int] = {}
        for part, _ in failed:
            kind = part.split(" ", 1)[0]
            by_kind[kind] = by_kind.get(kind, 0) + 1
        out.update({f"reward/failed/{k}": float(v) for k, v in sorted(by_kind.items())})
        if tools or (batch is not None and batch.get("agent") is not None):
            out["tool/failed"] = float(len(tools))
        self._report(step, failed, n, "trained samples failed", write)
        self._report(step, tools, None, "tool calls failed", write)
        return out

    def _report(
        self,
        step: int,
        keys: Sequence[tuple[str, str]],
        n: int | None,
        what: str,
        write: Callable[[str], None],
    ) -> None:
        if not keys:
            return
        counts: dict[tuple[str, str], int] = {}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        repeated: list[str] = []
        new_lines: list[str] = []
        unshown: dict[str, list[int]] = {}  # part -> [calls, distinct errors] past the cap
        for key, c in counts.items():
            err = self.errors.get(key)
            if err is None:
                if len(self.errors) >= MAX_LOGGED_ERRORS:
                    calls_errors = unshown.setdefault(key[0], [0, 0])
                    calls_errors[0] += c
                    calls_errors[1] += 1
                    continue
                kind = key[0].split(" ", 1)[0]
                err = self.errors[key] = DistinctError(
                    len(self.errors) + 1, kind, key[0], key[1], first_step=step
                )
                where = f" (traceback in {self._log_path})" if self._log_path is not None else ""
                new_lines.append(
                    f"rlzoo: failure #{err.number}, {key[0]}, {c}x at step {step}: {key[1]}{where}"
                )
            else:
                repeated.append(f"{c}x #{err.number} ({key[0]})")
            err.count += c
            err.last_step = step
        for part, (c, k) in unshown.items():  # one entry a part, however many new errors it had
            errors = "a new error" if k == 1 else f"{k} new errors"
            repeated.append(f"{c}x {part} ({errors}, not shown: {MAX_LOGGED_ERRORS} shown already)")
        total = f"{len(keys)} of {n}" if n is not None else f"{len(keys)}"
        for line in new_lines:
            write(line)
        if repeated:
            write(f"rlzoo: step {step}: {total} {what}: " + ", ".join(repeated))

    def check(self) -> None:
        """Raise :class:`RewardFailureError` once ``limit`` steps in a row had ``max_frac`` of their
        trained samples fail."""
        if self.limit and self.streak >= self.limit:
            share = (
                "every trained sample"
                if self._streak_frac >= 1.0
                else f"at least {self._streak_frac:.0%} of the trained samples (reward.max_failed_frac={self.max_frac:g})"
            )
            raise RewardFailureError(
                f"{share} failed in {self.streak} consecutive steps (up to step {self._step}; "
                f"limit reward.max_failed_steps={self.limit}); the last step's errors: {self._last_error}"
            )

    def summary(self) -> dict[str, Any]:
        """For ``summary.json``: totals, failed samples per part, each distinct error with its count."""
        by_part: dict[str, int] = {}
        for err in self.errors.values():
            by_part[err.part] = by_part.get(err.part, 0) + err.count
        return {
            "trained_samples": self.total_trained,
            "failed_samples": self.total_failed,
            "failed_tool_calls": self.total_tool_failed,
            "by_part": dict(sorted(by_part.items(), key=lambda kv: -kv[1])),
            "errors": [e.as_dict() for e in sorted(self.errors.values(), key=lambda e: -e.count)],
            "tracebacks": str(self._log_path) if self._log_path is not None and self._logged else None,
        }
