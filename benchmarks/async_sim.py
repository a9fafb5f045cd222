"""Sync vs one-step-off vs fully-async on the simulated backends, same resources. Prints tables.

    python benchmarks/async_sim.py [--preset seed|small] [--steps 16] [--configs sync,one_step_off]
    python benchmarks/async_sim.py --sweep [--plot docs/images/async_sweep.png]   # staleness x device split
    python benchmarks/async_sim.py --one-step-off 4+4,5+3,6+2,7+1                  # one_step_off per split
    python benchmarks/async_sim.py --bounds                                        # the cost model alone

The **real** runners, queue, Session and PolicyTrainer run; only the two backends are simulated
(:mod:`rlzoo.backends.simulated.backend`), with wall-clock costs:

- rollout: continuous batching over ``slots_per_device * devices`` slots; each decode step costs
  ``--decode-ms`` for the whole running batch; response lengths are log-normal (mean
  ``--mean-len``, shape ``--sigma``, capped at ``--max-len``): a long tail holds a synchronous
  batch until its longest response is done.
- train: log-probs and updates cost time proportional to tokens, divided by the pool's devices.

**Presets.** ``seed`` (the default) has the costs of the seed's DAPO run (4 + 4 devices, mean
response ~850 tokens, max 8,192) scaled down in time; ``small`` the earlier laptop-sized workload
(mean 64, cap 512). The seed's numbers fix three ratios, which the preset keeps:

1. *rollout vs training throughput*: the seed's training devices are 91-94% busy at 2,994
   tokens/GPU/s, so the rollout half produces tokens about as fast as the training half consumes
   them; here 16 slots x 4 devices / 2 ms = 32,000 tokens/s against the trainer's
   4 / (35 + 103) us = 29,000 tokens/s: the rollout half is 1.1x the training half.
2. *concurrency vs a step*: the seed's rollout holds 4 x 256 (vLLM's default max_num_seqs) = 1,024
   sequences against 2,048 responses per trainer step (128 prompts x n=16): half a step in flight;
   here 64 slots against 128 responses per step (32 prompts x n=4).
3. *the longest response vs a trainer step*: a trainer step of the seed is ~2,048 x ~1,000 tokens
   / (4 x 2,994 tokens/s) = 171 s; a 8,192-token response at 1,024 sequences / (4 x 2,994 x 1.1
   tokens/s) = 78 ms per decode step takes 640 s = 3.7 steps. Here 8,192 x 2 ms = 16.4 s against
   a step of 128 x ~850 x 138 us / 4 = 3.75 s: 4.4 steps.

Time runs ~46x faster than in the seed: trainer-side Python work (collation, metrics: ~0.3 s a
step on a loaded 2-core machine) is real and not scaled, so it weighs ~46x more than it would next
to GPU steps; the samples writer is off (``run.samples.every=0``: 1.9 s a step here for 64
responses of 850 tokens -- real work, now on a background thread, not a simulated cost).

Resources are the same for every config: ``--devices`` in all. **sync** is colocated: rollout and
training alternate on all devices. The asynchronous runners split them (``--split R+T``, default
half / half, as in the seed runs).

Columns: throughput in trained samples/s and tokens/s (steady state: after the first step),
trainer idle ratio (the seed's: the share of the trainer's wall-clock spent waiting for samples,
summed over the steady steps; for colocated sync, the share spent generating), staleness (policy
versions), dropped samples, partial ratio; then where the trainer's wall-clock goes: training, the
wait for samples at a window's first step (just after a push) and at other steps, the drain before
a push (no partial rollout), the push itself, and the rest (collation, metrics). The quickstart
task only provides prompts, a tokenizer and a scorer; nothing learns here.

**Bounds.** :class:`CostModel` replays the simulated backends' rules as arithmetic over drawn
batches (no clock, no runner) and the tables print its figures beside the measurements: for
fully_async the least wait at a window's first step (after a push at most ``floor(s*K*R*M)``
groups exist; the rest of the step is generated whole by the new weights), for one_step_off the
speed of each split and the bound no split passes (a batch's generation takes at least its
longest response, which is what colocated sync spends generating).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rlzoo.sources.params import window_budget

STEP_PROMPTS = 32  # prompts per trainer step (R x M for the async runners)
N = 4  # responses per prompt

PRESETS: dict[str, dict[str, float]] = {
    # the seed's DAPO run, scaled in time (module docstring); one simulated token stands for 8
    "seed": {
        "mean_len": 850.0,
        "max_len": 8192,
        "sigma": 1.0,
        "decode_ms": 2.0,
        "slots": 16,
        "token_scale": 8,
    },
    # the earlier laptop-sized workload
    "small": {
        "mean_len": 64.0,
        "max_len": 512,
        "sigma": 1.0,
        "decode_ms": 2.0,
        "slots": 16,
        "token_scale": 1,
    },
}
SWEEP_STALENESS = (0.0, 0.1, 0.25, 0.5, 1.0)
SWEEP_SPLITS = ("3+5", "4+4", "5+3")
OSD_SPLITS = ("4+4", "5+3", "6+2", "7+1")  # --one-step-off: rollout + train devices
BOUND_DRAWS = 400  # batches / windows drawn for the cost model's bounds (model_bounds)


def sim_args(args: argparse.Namespace) -> argparse.Namespace:
    """The costs the simulated backends get: lengths divided by ``--token-scale``, per-token costs
    (a decode step produces one token per sequence) multiplied by it."""
    k = max(1, int(args.token_scale))
    sim = argparse.Namespace(**vars(args))
    sim.mean_len, sim.max_len = args.mean_len / k, max(1, args.max_len // k)
    sim.decode_ms, sim.fwd_us, sim.upd_us = args.decode_ms * k, args.fwd_us * k, args.upd_us * k
    return sim


def split_of(args: argparse.Namespace, split: str | None = None) -> tuple[int, int]:
    """(rollout devices, training devices) of the asynchronous runners."""
    text = split or args.split
    if text:
        r, t = (int(x) for x in text.split("+"))
        return r, t
    half = max(1, args.devices // 2)
    return half, max(1, args.devices - half)


def backends(args: argparse.Namespace, roll_d: int, train_d: int) -> list[str]:
    args = args.sim
    roll = (
        f"{{name:simulated,devices:{roll_d},slots_per_device:{args.slots},decode_step_s:{args.decode_ms / 1000},"
        f"mean_response_length:{args.mean_len},sigma:{args.sigma}}}"
    )
    train = (
        f"{{name:simulated,devices:{train_d},forward_s_per_token:{args.fwd_us * 1e-6},"
        f"update_s_per_token:{args.upd_us * 1e-6}}}"
    )
    return ["~rollout.backend", "+rollout.backend=" + roll, "~trainer.backend", "+trainer.backend=" + train]


def fully_async(
    args: argparse.Namespace, s: float, k: int, r: int, partial: bool, split: str | None = None
) -> list[str]:
    roll_d, train_d = split_of(args, split)
    return [
        *backends(args, roll_d, train_d),
        "~runner",
        f"+runner={{name:fully_async,staleness_threshold:{s},trigger_parameter_sync_step:{k},"
        f"require_batches:{r},partial_rollout:{str(partial).lower()}{',early_push:true' if args.early_push else ''}}}",
        f"trainer.ppo_mini_batch_size={STEP_PROMPTS // r}",
    ]


def configs(args: argparse.Namespace) -> dict[str, list[str]]:
    roll_d, train_d = split_of(args)
    sp = f"({roll_d}+{train_d})"
    fa = lambda s, k, r, p: fully_async(args, s, k, r, p)  # noqa: E731
    return {
        f"sync (colocated, {args.devices} dev)": [*backends(args, args.devices, args.devices), "runner=sync"],
        f"one_step_off {sp}": [*backends(args, roll_d, train_d), "runner=one_step_off"],
        f"fully_async s=0 K=1 {sp}": fa(0.0, 1, 1, False),
        f"fully_async s=0.1 K=4 R=2 partial {sp}": fa(0.1, 4, 2, True),
        f"fully_async s=0.1 K=4 R=2 no-partial {sp}": fa(0.1, 4, 2, False),
        f"fully_async s=0.5 K=1 partial {sp}": fa(0.5, 1, 1, True),
        f"fully_async s=0.25 K=4 R=2 partial {sp}": fa(0.25, 4, 2, True),
        f"fully_async s=0.5 K=2 R=2 partial {sp}": fa(0.5, 2, 2, True),
        f"fully_async s=0.5 K=4 R=2 partial {sp}": fa(0.5, 4, 2, True),
    }


def sweep_configs(args: argparse.Namespace) -> dict[str, list[str]]:
    """The seed's K=4, R=2, partial rollout over staleness x device split, and the sync baseline."""
    out = {
        f"sync (colocated, {args.devices} dev)": [*backends(args, args.devices, args.devices), "runner=sync"]
    }
    for split in args.splits.split(",") if args.splits else SWEEP_SPLITS:
        for s in SWEEP_STALENESS:
            out[f"fully_async s={s:g} K=4 R=2 partial ({split})"] = fully_async(args, s, 4, 2, True, split)
    return out


def one_step_off_configs(args: argparse.Namespace) -> dict[str, list[str]]:
    """Colocated sync and one_step_off at each ``--one-step-off`` split of the same devices."""
    out = {
        f"sync (colocated, {args.devices} dev)": [*backends(args, args.devices, args.devices), "runner=sync"]
    }
    for split in args.one_step_off.split(","):
        roll_d, train_d = split_of(args, split)
        out[f"one_step_off ({roll_d}+{train_d})"] = [*backends(args, roll_d, train_d), "runner=one_step_off"]
    return out


def args_k(name: str) -> int:
    """K (steps per weight push) of a config, from its name (1 for sync / one-step-off)."""
    m = re.search(r"K=(\d+)", name)
    return int(m.group(1)) if m else 1


# ---------------------------------------------------------------------------------------------
# The cost model's bounds: the simulated backends' own rules as arithmetic (no wall clock, no runner)
# ---------------------------------------------------------------------------------------------
def draw_length(rng: random.Random, sim: argparse.Namespace) -> int:
    """One response length (simulated tokens) as the simulated rollout draws it: log-normal with mean
    ``mean_len`` and shape ``sigma``, capped at ``max_len``."""
    sigma = max(sim.sigma, 1e-6)
    mu = math.log(max(sim.mean_len, 1.0)) - sigma * sigma / 2  # E[lognormal] = exp(mu + sigma^2 / 2)
    return min(max(1, round(rng.lognormvariate(mu, sigma))), int(sim.max_len))


def group_done_steps(groups: list[list[int]], slots: int) -> list[int]:
    """Decode steps after which each group is complete (ascending), when ``groups`` (each group's
    response lengths) are submitted at once, in order, to an engine with ``slots`` free slots: every
    decode step gives one token to each running sequence; a finished sequence's slot goes to the
    next waiting one (the simulated rollout's continuous batching)."""
    seqs = [(g, n) for g, lens in enumerate(groups) for n in lens]
    left = [len(lens) for lens in groups]
    running: list[tuple[int, int]] = []  # (the step it finishes at, its group)
    done: list[int] = []
    i = step = 0
    while len(done) < len(groups):
        while i < len(seqs) and len(running) < slots:
            g, n = seqs[i]
            heapq.heappush(running, (step + n, g))
            i += 1
        step, g = heapq.heappop(running)
        left[g] -= 1
        if left[g] == 0:
            done.append(step)
    return done


class CostModel:
    """Expected times of the simulated backends for this workload, from ``BOUND_DRAWS`` drawn batches.

    ``prompt_len``: prompt tokens per response (the trainer's cost counts them; read from a run's
    ``prompt_length/mean``). Train time of a step: (prompt + response tokens) x (forward + update)
    per token / devices (the old log-probs need a forward: R x M groups make two mini-batches)."""

    def __init__(self, args: argparse.Namespace, prompt_len: float) -> None:
        self.args, self.sim, self.prompt_len = args, args.sim, prompt_len
        rng = random.Random(0)
        self.batches = [
            [[draw_length(rng, self.sim) for _ in range(N)] for _ in range(STEP_PROMPTS)]
            for _ in range(BOUND_DRAWS)
        ]

    def gen_s(self, batch: list[list[int]], devices: int) -> float:
        """Generation of one batch, submitted at once, on ``devices`` rollout devices."""
        return group_done_steps(batch, devices * self.args.slots)[-1] * self.sim.decode_ms / 1000

    def longest_s(self, batch: list[list[int]]) -> float:
        """The batch's longest response alone: no split generates the batch faster."""
        return max(max(g) for g in batch) * self.sim.decode_ms / 1000

    def train_s(self, batch: list[list[int]], devices: int) -> float:
        tokens = sum(n + self.prompt_len for g in batch for n in g)
        return tokens * (self.sim.fwd_us + self.sim.upd_us) * 1e-6 / devices

    def sync_step_s(self) -> tuple[float, float]:
        """(step, generation) seconds of colocated sync on every device."""
        d = self.args.devices
        gen = statistics.mean(self.gen_s(b, d) for b in self.batches)
        return gen + statistics.mean(self.train_s(b, d) for b in self.batches), gen

    def one_step_off(self, split: str) -> float:
        """Speed vs colocated sync of one_step_off at ``split`` with no overhead: a step's generation
        starts when the previous one ends and the step before trained (its weights), so the period
        is max(generation, training) per batch."""
        roll_d, train_d = split_of(self.args, split)
        period = statistics.mean(max(self.gen_s(b, roll_d), self.train_s(b, train_d)) for b in self.batches)
        return self.sync_step_s()[0] / period

    def one_step_off_bound(self) -> float:
        """Speed vs sync no split can pass: a batch's generation takes at least its longest response,
        so one_step_off's period is at least that; sync's step is its generation plus training."""
        return self.sync_step_s()[0] / statistics.mean(self.longest_s(b) for b in self.batches)

    def forward_s(self, split: str) -> float:
        """The old log-probs' forward of one step on the split's trainer: the part of a step that could
        run while the trainer waits for the rest of the batch (the weights do not change until the
        update), were the groups streamed into it."""
        train_d = split_of(self.args, split)[1]
        tokens = statistics.mean(sum(n + self.prompt_len for g in b for n in g) for b in self.batches)
        return tokens * self.sim.fwd_us * 1e-6 / train_d

    def window_start_wait(self, s: float, k: int, split: str) -> tuple[float, float]:
        """fully_async (R x M = STEP_PROMPTS groups a step, partial rollout): (seconds the trainer
        waits at a window's first step, its share of a window) at the least: after a push at most
        ``carry = window_budget - K*R*M`` groups exist; the other R*M - carry of the step must be
        generated whole by the new weights, counted here from empty slots with the carry complete
        (both optimistic) and no trainer overhead."""
        roll_d, train_d = split_of(self.args, split)
        carry = window_budget(s, k, STEP_PROMPTS) - k * STEP_PROMPTS
        need = STEP_PROMPTS - carry
        train = k * statistics.mean(self.train_s(b, train_d) for b in self.batches)
        if need <= 0:
            return 0.0, 0.0
        waits = []
        for w in range(0, len(self.batches) - k + 1, k):  # a window's fresh groups: K batches' worth
            groups = [g for b in self.batches[w : w + k] for g in b]
            waits.append(
                group_done_steps(groups, roll_d * self.args.slots)[need - 1] * self.sim.decode_ms / 1000
            )
        wait = statistics.mean(waits)
        return wait, wait / (wait + train)


def plugin_manager() -> Any:
    from rlzoo.kernel.plugins import PluginManager

    return PluginManager(load_entrypoints=False)  # the simulated backends are built in


def run_one(
    name: str, extra: list[str], args: argparse.Namespace, pm: Any, data_dir: str, out: Path
) -> dict[str, Any]:
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    run_dir = out / name.split(" ")[0].replace("=", "") / str(abs(hash(name)))
    common = [
        f"data.dir={data_dir}",
        f"run.output_dir={run_dir}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        "trainer.val_before_train=false",
        # the samples writer is real trainer-side work, not a simulated cost (--samples: on)
        f"run.samples.every={int(args.samples)}",
        "data.val_files=[]",
        "trainer.test_freq=1000000",
        "trainer.save_freq=1000000",
        f"trainer.total_steps={args.steps}",
        f"data.train_batch_size={STEP_PROMPTS}",
        "trainer.ppo_mini_batch_size=16",
        f"rollout.n={N}",
        f"data.max_response_length={args.sim.max_len}",
    ]
    run = rlzoo.build_run("quickstart", [*common, *extra], pm=pm)
    t0 = time.perf_counter()
    run.train()
    wall = time.perf_counter() - t0
    recs = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    push_every = args_k(name)
    # steady state: the whole sync windows after the first (which starts from an empty queue)
    last = push_every * (len(recs) // push_every)
    steady = [r for r in recs if push_every < r["step"] <= last] or recs[1:]
    span = steady[-1]["time"] - recs[recs.index(steady[0]) - 1]["time"]
    samples = sum(STEP_PROMPTS * N for _ in steady)
    tokens = args.token_scale * sum(r["perf/total_num_tokens"] for r in steady)  # seed tokens
    walls = sum(r["trainer/step_wall_s"] for r in steady)

    def total(key: str, rows: list[dict[str, Any]] = steady) -> float:
        return sum(r.get(key, 0.0) for r in rows)

    # where the trainer's wall-clock goes; a window's first step follows a push (steps count from 1)
    first = [r for r in steady if (r["step"] - 1) % push_every == 0]
    win_start = total("timing_s/wait_queue", first) + total("timing_s/sync_wait", first)
    # what a push carries into the next window: complete groups queued, groups still in flight
    pushed = [r for r in recs if r["step"] % push_every == 0 and r["step"] < args.steps]
    # runner.early_push: the next batch waits for the push in flight (timing_s/sync_wait)
    waits = total("timing_s/wait_queue") + total("timing_s/wait_gen") + total("timing_s/sync_wait")
    drain = total("timing_s/sync_drain")
    # the push (one_step_off waits for its generation inside it: that wait is counted as idle)
    sync = max(0.0, total("timing_s/sync_weights") - drain - total("timing_s/wait_gen"))
    compute = sum(
        total(f"timing_s/{p}") for p in ("old_log_prob", "ref", "values", "update_actor", "update_critic")
    )
    if "runner=sync" in extra:  # colocated: the training devices wait while generating (and scoring)
        idle = (total("timing_s/gen") + total("timing_s/reward")) / total("timing_s/step")
    else:
        idle = (waits + drain) / walls
    return {
        "name": name,
        "samples_s": samples / span,
        "tokens_s": tokens / span,
        "idle": idle,
        "stale_mean": statistics.mean(r.get("staleness/mean", 0.0) for r in steady),
        "stale_max": max(r.get("staleness/max", 0.0) for r in steady),
        "dropped": steady[-1].get("rollouter/dropped_samples", 0.0),
        "partial": statistics.mean(r.get("rollout/partial_ratio", 0.0) for r in steady),
        "wall": wall,
        "train": compute / walls,
        "idle_window_start": win_start / walls,
        "idle_mid_window": (waits - win_start) / walls,
        "idle_drain": drain / walls,
        "sync": sync / walls,
        "samples_wait_s": total("timing_s/samples") / len(steady),  # the trainer waits for the samples writer
        "window_start_wait_s": win_start / max(1, len(first)),  # per window
        "busy_per_window_s": (walls - waits - drain) / max(1, len(first)),  # the trainer not waiting
        "carry_queued": statistics.mean(r.get("queue/carried_queued", 0.0) for r in pushed)
        if pushed
        else 0.0,
        "carry_in_flight": statistics.mean(r.get("queue/carried_in_flight", 0.0) for r in pushed)
        if pushed
        else 0.0,
        "prompt_len": statistics.mean(r.get("prompt_length/mean", 0.0) for r in recs),
        "load": os.getloadavg()[0],
    }


def print_tables(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    base = next((r for r in rows if r["name"].startswith("sync")), None)
    print()
    print(
        f"simulated workload ({args.preset}): {STEP_PROMPTS} prompts x n={N} per step, lengths log-normal mean "
        f"{args.mean_len:g} sigma {args.sigma:g} cap {args.max_len}, decode {args.decode_ms:g} ms/step x {args.slots} "
        f"slots/device, train {args.fwd_us:g}+{args.upd_us:g} us/token/device, {args.devices} devices, {args.steps} steps; "
        f"one simulated token = {args.token_scale} (tokens/s in these tokens)"
    )
    print(
        "| config | samples/s | tokens/s | vs sync | trainer idle | staleness mean / max | dropped | partial | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speed = f"{r['tokens_s'] / base['tokens_s']:.2f}x" if base else "-"
        print(
            f"| {r['name']} | {r['samples_s']:.1f} | {r['tokens_s']:.0f} | {speed} | {100 * r['idle']:.1f}% | "
            f"{r['stale_mean']:.2f} / {r['stale_max']:.0f} | {r['dropped']:.0f} | {r['partial']:.2f} | {r['wall']:.1f} |"
        )
    print()
    print("where the trainer's wall-clock goes (trainer idle = the three waits):")
    print("| config | train | wait, window's first step | wait, other steps | drain at push | push | other |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["name"].startswith("sync"):
            continue
        parts = [r[k] for k in ("train", "idle_window_start", "idle_mid_window", "idle_drain", "sync")]
        cells = " | ".join(f"{100 * v:.1f}%" for v in parts)
        print(f"| {r['name']} | {cells} | {100 * (1 - sum(parts)):.1f}% |")
    print_bounds(rows, args)


def parse_name(name: str) -> tuple[float, int, str] | None:
    """(s, K, split) of a fully_async config with partial rollout (the ones the window model covers)."""
    m = re.search(r"fully_async s=([\d.]+) K=(\d+)(?: R=\d+)? partial \((\d+\+\d+)\)", name)
    return (float(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def cost_model(rows: list[dict[str, Any]], args: argparse.Namespace) -> CostModel:
    lens = [r["prompt_len"] for r in rows if "prompt_len" in r]
    return CostModel(args, statistics.mean(lens) if lens else args.prompt_len)


def print_bounds(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The measurements next to what the cost model allows (``CostModel``)."""
    model = cost_model(rows, args)
    base = next((r for r in rows if r["name"].startswith("sync")), None)
    fa = [(r, parse_name(r["name"])) for r in rows]
    fa_rows = [(r, p) for r, p in fa if p is not None and p[1] > 1]
    if fa_rows:
        print()
        print(
            "fully_async, a window's first step: after a push at most floor(s*K*R*M) groups exist, the rest of "
            "the step is generated whole by the new weights (least wait: the cost model, carry complete, slots free; "
            "least idle: that wait against the run's own busy time per window)"
        )
        print(
            "| config | carried at push: queued / in flight | wait at window start, s: measured / least | "
            "trainer idle: measured / least |"
        )
        print("|---|---:|---:|---:|")
        for r, (s, k, split) in fa_rows:
            wait, _ = model.window_start_wait(s, k, split)
            share = wait / (wait + r["busy_per_window_s"]) if "busy_per_window_s" in r else 0.0
            print(
                f"| {r['name']} | {r.get('carry_queued', 0):.1f} / {r.get('carry_in_flight', 0):.1f} | "
                f"{r.get('window_start_wait_s', 0):.2f} / {wait:.2f} | {100 * r['idle']:.1f}% / {100 * share:.1f}% |"
            )
    osd = [r for r in rows if r["name"].startswith("one_step_off")]
    if osd:
        sync_step, sync_gen = model.sync_step_s()
        print()
        print(
            f"one_step_off vs colocated sync (model: sync step {sync_step:.2f} s of which generating {sync_gen:.2f} s; "
            "one_step_off's period max(generation, training) per batch, no overhead; bound: no split generates a batch "
            "faster than its longest response)"
        )
        print(
            "| config | measured | model | bound, model (every split) | bound, measured: sync step / its generation |"
        )
        print("|---|---:|---:|---:|---:|")
        measured_bound = f"{1 / base['idle']:.2f}x" if base and base["idle"] > 0 else "-"
        for r in osd:
            m = re.search(r"\((\d+\+\d+)\)", r["name"])
            speed = f"{r['tokens_s'] / base['tokens_s']:.2f}x" if base else "-"
            pred = f"{model.one_step_off(m.group(1)):.2f}x" if m else "-"
            print(
                f"| {r['name']} | {speed} | {pred} | {model.one_step_off_bound():.2f}x | {measured_bound} |"
            )


def print_model(args: argparse.Namespace) -> None:
    """The cost model alone: one_step_off per split and fully_async's least idle per staleness and split."""
    model = CostModel(args, args.prompt_len)
    sync_step, sync_gen = model.sync_step_s()
    print(
        f"colocated sync on {args.devices} devices: step {sync_step:.2f} s, generating {sync_gen:.2f} s "
        f"({100 * sync_gen / sync_step:.1f}%)"
    )
    print("| one_step_off split | speed vs sync (model) |")
    print("|---|---:|")
    for split in OSD_SPLITS:
        print(f"| {split} | {model.one_step_off(split):.2f}x |")
    print(f"| bound, every split | {model.one_step_off_bound():.2f}x |")
    print()
    print_least_idle(model)


def print_sweep(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    base = next((r for r in rows if r["name"].startswith("sync")), None)
    print()
    print(
        "sweep: fully_async K=4 R=2 partial rollout; cells: speed vs colocated sync / trainer idle / mean staleness"
    )
    print("| staleness_threshold | " + " | ".join(f"rollout+train {s}" for s in SWEEP_SPLITS) + " |")
    print("|---:|" + "---:|" * len(SWEEP_SPLITS))
    for s in SWEEP_STALENESS:
        cells = []
        for split in SWEEP_SPLITS:
            r = next((r for r in rows if r["name"] == f"fully_async s={s:g} K=4 R=2 partial ({split})"), None)
            if r is None:
                cells.append("-")
                continue
            speed = f"{r['tokens_s'] / base['tokens_s']:.2f}x" if base else "-"
            cells.append(f"{speed} / {100 * r['idle']:.0f}% / {r['stale_mean']:.2f}")
        print(f"| {s:g} | " + " | ".join(cells) + " |")
    print()
    print_least_idle(cost_model(rows, args))


def print_least_idle(model: CostModel) -> None:
    splits = sorted({*SWEEP_SPLITS, *OSD_SPLITS})
    print(
        "the least trainer idle the cost model allows at K=4, R=2, partial rollout (the wait at a window's first "
        "step against the trainer's compute; no overhead; in brackets: were the old log-probs' forward run "
        "during that wait):"
    )
    print(
        "| staleness_threshold | carry floor(s*K*R*M) | "
        + " | ".join(f"rollout+train {s}" for s in splits)
        + " |"
    )
    print("|---:|---:|" + "---:|" * len(splits))
    for s in SWEEP_STALENESS:
        carry = window_budget(s, 4, STEP_PROMPTS) - 4 * STEP_PROMPTS
        cells = []
        for split in splits:
            wait, share = model.window_start_wait(s, 4, split)
            train = wait / share - wait if share else 0.0
            hidden = max(0.0, wait - model.forward_s(split))  # old log-probs computed while waiting
            cells.append(f"{100 * share:.1f}% ({100 * hidden / (hidden + train) if share else 0.0:.1f}%)")
        print(f"| {s:g} | {carry} | " + " | ".join(cells) + " |")


def plot_sweep(rows: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next((r for r in rows if r["name"].startswith("sync")), None)
    model = cost_model(rows, args)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for split in SWEEP_SPLITS:
        pts = [
            (s, r)
            for s in SWEEP_STALENESS
            for r in rows
            if r["name"] == f"fully_async s={s:g} K=4 R=2 partial ({split})"
        ]
        if not pts:
            continue
        xs = [s for s, _ in pts]
        speed = [r["tokens_s"] / base["tokens_s"] if base else r["tokens_s"] for _, r in pts]
        (line,) = ax1.plot(xs, speed, marker="o", label=f"rollout + train = {split}")
        ax2.plot(xs, [100 * r["idle"] for _, r in pts], marker="o", label=f"rollout + train = {split}")
        least = [100 * model.window_start_wait(s, 4, split)[1] for s in xs]
        ax2.plot(xs, least, ls="--", color=line.get_color(), label=f"least (cost model), {split}")
    osd = [r for r in rows if r["name"].startswith("one_step_off")]
    if osd and base:
        best = max(osd, key=lambda r: r["tokens_s"])
        ax1.axhline(
            best["tokens_s"] / base["tokens_s"], color="black", ls=":", lw=1, label=f"best {best['name']}"
        )
        if base["idle"] > 0:  # one_step_off's period >= a batch's generation = sync's (its longest response)
            ax1.axhline(
                1 / base["idle"], color="grey", ls="--", lw=0.8, label="one_step_off bound (measured)"
            )
    ax1.set_xlabel("staleness_threshold")
    ax1.set_ylabel("throughput vs colocated sync (x)" if base else "tokens/s")
    ax1.axhline(1.0, color="grey", lw=0.5)
    ax2.set_xlabel("staleness_threshold")
    ax2.set_ylabel("trainer idle (%)")
    ax2.axhline(5.0, color="grey", ls=":", lw=0.8, label="5%")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("fully_async, K=4, R=2, partial rollout, 8 simulated devices (seed-scaled costs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="seed", help="workload (module docstring)")
    ap.add_argument("--steps", type=int, default=16, help="trainer steps per config")
    ap.add_argument("--devices", type=int, default=8, help="devices in all (sync: all of them, colocated)")
    ap.add_argument(
        "--split", default="", help="rollout+train devices of the async runners (default: half / half)"
    )
    ap.add_argument("--slots", type=int, default=None, help="decode slots per rollout device")
    ap.add_argument("--decode-ms", type=float, default=None, help="ms per decode step of the running batch")
    ap.add_argument("--mean-len", type=float, default=None, help="mean response length (log-normal)")
    ap.add_argument("--sigma", type=float, default=None, help="log-normal shape (tail)")
    ap.add_argument("--max-len", type=int, default=None, help="max_response_length")
    ap.add_argument(
        "--token-scale",
        type=int,
        default=None,
        help="one simulated token stands for this many (lengths / it, per-token costs x it): the same "
        "ratios with less per-token Python work, so a loaded machine distorts less",
    )
    ap.add_argument("--fwd-us", type=float, default=35.0, help="train forward, us per token on one device")
    ap.add_argument(
        "--upd-us", type=float, default=103.0, help="train forward+backward, us per token on one device"
    )
    ap.add_argument("--configs", default="", help="comma-separated name prefixes to run (default: all)")
    ap.add_argument(
        "--sweep", action="store_true", help="staleness x device split at K=4, R=2, partial rollout"
    )
    ap.add_argument("--splits", default="", help="with --sweep: these splits only (e.g. 3+5,4+4)")
    ap.add_argument(
        "--one-step-off",
        default="",
        metavar="SPLITS",
        help=f"run colocated sync and one_step_off at these rollout+train splits (e.g. {','.join(OSD_SPLITS)})",
    )
    ap.add_argument(
        "--bounds", action="store_true", help="print the cost model's bounds only (seconds; runs nothing)"
    )
    ap.add_argument("--plot", default="", help="with --sweep: write the sweep's plot here (PNG)")
    ap.add_argument(
        "--samples", action="store_true", help="keep the trained samples (run.samples.every=1; default off)"
    )
    ap.add_argument("--json", default="", help="write the rows here (JSON)")
    ap.add_argument(
        "--prompt-len",
        type=float,
        default=6.0,
        help="with --bounds: prompt tokens per response (quickstart: 6)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=[],
        help="print the tables (and --plot) of these --json files; run nothing",
    )
    ap.add_argument(
        "--early-push",
        action="store_true",
        help="fully_async with runner.early_push=true (the push on a thread, overlapping the step's tail)",
    )
    args = ap.parse_args()
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, type(v)(v))
    args.sim = sim_args(args)
    if args.bounds:
        print_model(args)
        return
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(Path(f).read_text())]
        print_tables(rows, args)
        print_sweep(rows, args)
        if args.plot:
            plot_sweep(rows, Path(args.plot), args)
        return

    import logging

    import torch

    torch.set_num_threads(1)  # the simulated costs are sleeps; keep torch's own threads out of the way
    logging.getLogger("rlzoo").setLevel(logging.WARNING)
    cache = os.environ.get("RLZOO_CACHE", os.path.join(tempfile.gettempdir(), "rlzoo-bench"))
    data_dir = os.path.join(cache, "quickstart")
    pm = plugin_manager()
    out = Path(tempfile.mkdtemp(prefix="rlzoo-async-sim-"))
    wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
    rows = []
    load = [os.getloadavg()[0]]
    table = (
        sweep_configs(args)
        if args.sweep
        else one_step_off_configs(args)
        if args.one_step_off
        else configs(args)
    )
    for name, extra in table.items():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        rows.append(run_one(name, extra, args, pm, data_dir, out))
        load.append(os.getloadavg()[0])
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print_tables(rows, args)
    if args.sweep:
        print_sweep(rows, args)
        if args.plot:
            plot_sweep(rows, Path(args.plot), args)
    if args.samples:
        for r in rows:
            print(f"{r['name']}: the trainer waits {r['samples_wait_s']:.3f} s a step for the samples writer")
    print(
        f"load average (1 min) at each config's start and at the end: {', '.join(f'{x:.1f}' for x in load)}"
    )


if __name__ == "__main__":
    main()
