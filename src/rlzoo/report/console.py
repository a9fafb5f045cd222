"""What ``rlzoo train`` prints: third-party progress bars silenced, and a short end-of-run summary.

The full summary stays in the run directory (``summary.json``); the console gets the few lines a
person reads after a run: how far it went, whether it learned, where everything is, and how to
continue it.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: environment switches that turn off the Hugging Face libraries' own progress bars (weight loading,
#: shard writing, dataset maps); set before those libraries are imported, and inherited by workers
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}

#: the per-step metric whose first and last values the summary compares
REWARD_KEY = "critic/score/mean"
VAL_KEY = "val/mean"


def quiet_third_party_progress() -> None:
    """Silence transformers / huggingface_hub / datasets progress bars; rlzoo's own bar stays."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    try:  # already-imported libraries read the environment only once
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a runtime dependency
        pass
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    with path.open() as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[Any, float]]:
    """``(step, value)`` of every row with a finite ``key``."""
    out: list[tuple[Any, float]] = []
    for r in rows:
        v = _finite(r.get(key))
        if v is not None:
            out.append((r.get("step"), v))
    return out


def _fmt_seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def resume_command(run_dir: Path | str, recipe: str | None) -> str:
    """The command that continues this run from its last complete checkpoint."""
    words = ["rlzoo", "train"]
    if recipe:
        words.append(recipe)
    words += ["resume=true", f"run.output_dir={run_dir}"]
    return " ".join(shlex.quote(w) for w in words)


#: distinct errors the printed summary lists (summary.json has them all)
SHOWN_ERRORS = 5


def failure_lines(summary: Mapping[str, Any]) -> list[str]:
    """What failed in the run (``summary["failures"]``, :meth:`rlzoo.train.failures.RewardFailures.summary`):
    the totals, then the most frequent distinct errors by part and message; nothing when none did."""
    f = summary.get("failures")
    if not isinstance(f, Mapping) or not (f.get("failed_samples") or f.get("failed_tool_calls")):
        return []
    lines = [
        f"  failures: {f.get('failed_samples', 0)} of {f.get('trained_samples', 0)} trained samples failed"
        + (f", {f['failed_tool_calls']} tool calls failed" if f.get("failed_tool_calls") else "")
    ]
    errors = list(f.get("errors") or [])
    for e in errors[:SHOWN_ERRORS]:
        message = str(e.get("message", ""))
        message = message if len(message) <= 160 else message[:160] + "..."
        lines.append(
            f"    {e.get('count')}x {e.get('part')} (steps {e.get('first_step')}-{e.get('last_step')}): {message}"
        )
    if len(errors) > SHOWN_ERRORS:
        lines.append(f"    ... {len(errors) - SHOWN_ERRORS} more distinct errors in summary.json")
    if f.get("tracebacks"):
        lines.append(f"  tracebacks: {f['tracebacks']}")
    return lines


def summary_lines(
    summary: Mapping[str, Any], *, recipe: str | None = None, wall_s: float | None = None
) -> list[str]:
    """A short, human summary of a finished (or interrupted) run.

    Reads the run's ``metrics.jsonl`` for the reward curve and the best validation score, so it
    says the same thing whichever runner produced the run.
    """
    run_dir = Path(str(summary.get("run_dir", ".")))
    rows = _read_metrics(run_dir / "metrics.jsonl")
    steps = summary.get("steps", rows[-1].get("step") if rows else 0)
    lines = [f"rlzoo: finished {steps} steps in {run_dir}"]
    rewards = _series(rows, REWARD_KEY)
    if rewards:
        (s0, r0), (s1, r1) = rewards[0], rewards[-1]
        lines.append(f"  reward ({REWARD_KEY}): {r0:.3f} at step {s0} -> {r1:.3f} at step {s1}")
    vals = _series(rows, VAL_KEY)
    if vals:
        best_step, best = max(vals, key=lambda sv: sv[1])
        first = vals[0][1]
        lines.append(f"  validation ({VAL_KEY}): {first:.3f} first, best {best:.3f} at step {best_step}")
    lines += failure_lines(summary)
    wall = wall_s if wall_s is not None else _finite(summary.get("wall_time_s"))
    if wall is not None:
        lines.append(f"  wall time: {_fmt_seconds(wall)}")
    if (run_dir / "metrics.jsonl").is_file():
        lines.append(f"  metrics: {run_dir / 'metrics.jsonl'} (full summary: {run_dir / 'summary.json'})")
    else:  # run.loggers without jsonl: say so rather than point at files that are not there
        lines.append(
            f"  metrics: no metrics.jsonl (run.loggers has no jsonl); summary: {run_dir / 'summary.json'}"
        )
    if (run_dir / "tensorboard").exists():
        lines.append(f"  TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}")
    if (run_dir / "metrics.jsonl").is_file():  # rlzoo plot reads it
        lines.append(f"  plots: rlzoo plot {run_dir}")
    final = run_dir / "final"
    if final.exists():
        lines.append(f"  model: {final} (a Hugging Face folder: AutoModelForCausalLM.from_pretrained)")
    resume = summary.get("resume_command") or resume_command(run_dir, recipe)
    lines.append(f"  resume: {resume}")
    return lines


def print_summary(
    summary: Mapping[str, Any], *, recipe: str | None = None, wall_s: float | None = None
) -> None:
    print("\n".join(summary_lines(summary, recipe=recipe, wall_s=wall_s)), flush=True)
