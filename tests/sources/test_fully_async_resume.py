"""kill -9 with work in flight, then resume, under fully_async (issue 38): no prompt lost or trained
twice, and the trained prompts' responses are the uninterrupted run's, so their length distribution
is too (no skew toward the short ones that happened to finish before the kill).

The task has long-tailed lengths (the simulated engine's log-normal, sigma 1.5: mean 12, up to the
cap of 128 tokens), so at any moment the groups in flight are the long ones; partial rollout is on,
so they span weight pushes. A request's responses are a function of its request id (loader batch,
attempt, position: the seeds), so a prompt trained by both runs under the same request id must have
the same response lengths, and a prompt the resume regenerated from the checkpoint must too.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import QUIET

import rlzoo
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.samples import read_samples

STEPS = 8
GROUPS = 8  # prompts per trainer step (R x M = 1 x 8), also the loader's batch
N = 8  # responses per prompt
ARGS = [
    *QUIET,
    "trainer.test_freq=-1",
    "~rollout.backend",
    "+rollout.backend={name:simulated,decode_step_s:0.001,mean_response_length:12,sigma:1.5}",
    "~trainer.backend",
    "+trainer.backend={name:simulated,update_s_per_token:2e-6,forward_s_per_token:2e-7}",
    "data.max_response_length=128",
    f"data.train_batch_size={GROUPS}",
    f"trainer.ppo_mini_batch_size={GROUPS}",
    f"rollout.n={N}",
    "trainer.save_freq=2",
    f"trainer.total_steps={STEPS}",
    "run.samples.max_per_step=1000",  # every trained sample kept: the record compared below
    "~runner",
    "+runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,require_batches:1,"
    "partial_rollout:true}",
]
REQUEST = re.compile(r"^s(\d+)r(\d+)-(\d+)$")  # s{loader batch}r{attempt}-{position in the batch}


def _trained(run_dir: Path) -> dict[str, list[int]]:
    """Request id -> the response lengths trained for it, over steps 1..STEPS (each step's file once)."""
    out: dict[str, list[int]] = defaultdict(list)
    for step in range(1, STEPS + 1):
        rows = read_samples(run_dir, step)
        assert rows, f"no samples file for step {step}"
        for r in rows:
            out[r["request_id"]].append(int(r["response_length"]))
    return {k: sorted(v) for k, v in out.items()}


def _prompt(request_id: str) -> tuple[int, int]:
    m = REQUEST.match(request_id)
    assert m, request_id
    return int(m.group(1)), int(m.group(3))  # (loader batch, position): the prompt, whatever the attempt


def _outstanding(run_dir: Path, step: int) -> tuple[set[tuple[int, int]], int]:
    """The prompts a checkpoint holds as drawn but not trained, and its loader position (epoch 0)."""
    data = json.loads((run_dir / "checkpoints" / f"step_{step}" / "rlzoo_checkpoint.json").read_text())
    state: dict[str, Any] = data["payload"]["data"]
    assert state["loader"]["epoch"] == 0
    return {(b, j) for _, _, b, j, _ in state["pending"] + state["buffer"]}, int(state["loader"]["position"])


def _ks(a: list[int], b: list[int]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = sorted(a), sorted(b)
    return max(
        abs(bisect.bisect_right(a, x) / len(a) - bisect.bisect_right(b, x) / len(b)) for x in set(a + b)
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_in_flight_then_resume_keeps_every_prompt_and_the_length_distribution(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    ref, out = tmp_path / "ref", tmp_path / "run"
    args = [f"data.dir={quickstart_dir}", *ARGS]
    rlzoo.build_run("quickstart", [*args, f"run.output_dir={ref}"], pm=pm).train()  # never killed

    # killed right after step 5's row: the last checkpoint is step 4's, groups are in flight
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "RLZOO_KILL_AT": "metrics:after@5"}
    cmd = [sys.executable, "-m", "rlzoo.cli", "train", "quickstart", *args, f"run.output_dir={out}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == -9, done.stderr[-3000:]
    at_kill, _ = _outstanding(out, 4)
    assert at_kill  # drawn, not trained at the checkpoint: in flight, queued, or buffered
    rlzoo.build_run("quickstart", ["resume=latest", f"run.output_dir={out}"], pm=pm).train()

    a, b = _trained(ref), _trained(out)
    # nothing trained twice: each prompt under one request id, n responses, STEPS x GROUPS prompts
    prompts_b = [_prompt(k) for k in b]
    assert len(set(prompts_b)) == len(prompts_b) == STEPS * GROUPS
    assert all(len(v) == N for v in b.values())
    # nothing lost: trained + still outstanding at the end == the loader's order so far
    left, position = _outstanding(out, STEPS)
    assert not left & set(prompts_b)
    assert sorted([*prompts_b, *left]) == sorted((p // GROUPS + 1, p % GROUPS) for p in range(position))
    # the prompts in flight at the checkpoint were regenerated with their own seeds: trained (or
    # still outstanding) with the uninterrupted run's responses
    by_prompt_a = {_prompt(k): (k, v) for k, v in a.items()}
    by_prompt_b = {_prompt(k): (k, v) for k, v in b.items()}
    for p in at_kill:
        assert p in by_prompt_b or p in left, f"prompt {p} in flight at the kill was lost"
    # every prompt both runs trained under the same request id (same seeds) has the same lengths
    same = [p for p in by_prompt_a.keys() & by_prompt_b.keys() if by_prompt_a[p][0] == by_prompt_b[p][0]]
    assert at_kill & set(same), "no prompt in flight at the kill to compare"
    for p in same:
        assert by_prompt_a[p][1] == by_prompt_b[p][1], (p, by_prompt_a[p], by_prompt_b[p])
    # and the length distributions agree: KS distance below its 1% critical value (c = 1.63)
    la = [x for v in a.values() for x in v]
    lb = [x for v in b.values() for x in v]
    assert len(la) == len(lb) == STEPS * GROUPS * N
    critical = 1.63 * math.sqrt((len(la) + len(lb)) / (len(la) * len(lb)))
    assert _ks(la, lb) <= critical, (_ks(la, lb), critical)
    assert max(la) > 4 * sum(la) / len(la)  # the tail is there: the longest is over 4x the mean
