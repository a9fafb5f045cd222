"""What `rlzoo train` prints at the end, and the CLI under a closed pipe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from rlzoo.report.console import summary_lines


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    rows = [
        {"step": 0, "val/mean": 0.10},
        {"step": 1, "critic/score/mean": 0.25},
        {"step": 2, "critic/score/mean": 0.50, "val/mean": 0.60},
        {"step": 3, "critic/score/mean": 0.75, "val/mean": 0.55},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_summary_is_short_and_says_what_a_person_needs(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    lines = summary_lines(
        {"run_dir": str(run), "steps": 3, "final": {"x": 1}}, recipe="quickstart", wall_s=75
    )
    text = "\n".join(lines)
    assert len(lines) <= 12  # not the ~70-line JSON dump
    assert "finished 3 steps" in text
    assert "0.250 at step 1 -> 0.750 at step 3" in text  # first -> last reward
    assert "best 0.600 at step 2" in text  # best validation, not the last one
    assert "1 min 15 s" in text
    assert f"tensorboard --logdir {run / 'tensorboard'}" in text
    assert f"rlzoo plot {run}" in text
    assert f"rlzoo train quickstart resume=true run.output_dir={run}" in text
    assert "model:" not in text  # no final/ folder in this run: not advertised


def test_summary_names_the_exported_model_and_the_runners_resume_command(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "final").mkdir()
    text = "\n".join(summary_lines({"run_dir": str(run), "resume_command": "rlzoo train x resume=latest"}))
    assert f"model: {run / 'final'}" in text
    assert "resume: rlzoo train x resume=latest" in text


def test_closed_pipe_ends_quietly() -> None:
    """`rlzoo components --json | head` ends without a BrokenPipeError traceback."""
    exe = shutil.which("rlzoo") or f"{sys.executable} -m rlzoo.cli"
    proc = subprocess.run(
        f"{exe} components --json | head -c 20", shell=True, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.startswith("[")
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_a_run_without_metrics_files_points_at_none(tmp_path: Path) -> None:
    """Before: `run.loggers=[]` still printed where metrics.jsonl and the plots were (issue 23)."""
    run = tmp_path / "run"
    run.mkdir()
    text = "\n".join(summary_lines({"run_dir": str(run), "steps": 2}))
    assert "no metrics.jsonl (run.loggers has no jsonl)" in text
    assert "rlzoo plot" not in text and "tensorboard" not in text.lower()


FAILURES = {  # what rlzoo.train.failures.RewardFailures.summary() writes into summary.json
    "trained_samples": 64,
    "failed_samples": 12,
    "failed_tool_calls": 3,
    "by_part": {"environment maze": 10, "scorer math": 2},
    "errors": [
        {
            "part": "environment maze",
            "message": "environment: step: KeyError: 'door'",
            "count": 10,
            "first_step": 1,
            "last_step": 4,
        },
        {
            "part": "scorer math",
            "message": "ValueError: no boxed answer",
            "count": 2,
            "first_step": 3,
            "last_step": 3,
        },
    ],
    "tracebacks": "/runs/x/failures.jsonl",
}


def test_the_summary_lists_failures_by_part_and_message(tmp_path: Path) -> None:
    # issue 39: a run whose environment failed on most trajectories printed a silent summary
    run = _run_dir(tmp_path)
    text = "\n".join(summary_lines({"run_dir": str(run), "failures": FAILURES}))
    assert "12 of 64 trained samples failed, 3 tool calls failed" in text
    assert "10x environment maze (steps 1-4): environment: step: KeyError: 'door'" in text
    assert "2x scorer math (steps 3-3): ValueError: no boxed answer" in text
    assert "tracebacks: /runs/x/failures.jsonl" in text
    clean = "\n".join(
        summary_lines(
            {"run_dir": str(run), "failures": {**FAILURES, "failed_samples": 0, "failed_tool_calls": 0}}
        )
    )
    assert "failures" not in clean  # a run without failures says nothing about them
