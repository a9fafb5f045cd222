"""A busy machine: the sync quickstart with another process keeping one core busy, before → after.

Runs ``rlzoo train quickstart`` (``--steps`` steps, no validation) in a fresh subprocess, on a
quiet machine and with a synthetic competing load (``--busy`` busy-loop processes, default 1:
one of 2 cores lost), for each thread setting:

- ``before``: libgomp's own waiting (``RLZOO_OMP_WAIT_POLICY=keep``: a thread spins 300,000 times
  in a barrier before it sleeps; rlzoo's default until issue 25);
- ``after``: rlzoo's default (:data:`rlzoo.system.threads.DEFAULT_WAIT_POLICY`, ``short``:
  ``GOMP_SPINCOUNT=1000``, set when a run is built, before torch loads); default threads;
- ``passive``: ``RLZOO_OMP_WAIT_POLICY=passive`` (``OMP_WAIT_POLICY=PASSIVE``: sleep at once);
- ``spin 10k``: ``GOMP_SPINCOUNT=10000``, a longer spin;
- ``1 thread``: ``OMP_NUM_THREADS=1`` (the reference point: no barrier to wait at).

Printed: wall seconds of the training (model load excluded: ``timing_s/step`` summed) and the
busy/quiet ratio. With one of 2 cores lost the fair ratio is about 2 (half the CPU); spinning
threads that wait for a descheduled partner make it several times worse.

    python benchmarks/busy.py                 # 30 steps, ~2-4 minutes on 2 cores
    python benchmarks/busy.py --steps 60 --busy 1

Run it alone on the machine (``flock /tmp/rlzoo-heavy.lock python benchmarks/busy.py``): the
quiet rows assume nothing else runs; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {
    "before": {"RLZOO_OMP_WAIT_POLICY": "keep"},
    "after": {},  # rlzoo's default
    "passive": {"RLZOO_OMP_WAIT_POLICY": "passive"},
    "spin 10k": {"GOMP_SPINCOUNT": "10000"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
}

_CHILD = """
import json, sys
import rlzoo
run = rlzoo.build_run("quickstart", sys.argv[2:])  # sets the OpenMP waiting; torch is not loaded yet
run.train()
import torch
from rlzoo.report.metrics import read_metrics
recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
print(json.dumps({"train_s": sum(r["timing_s/step"] for r in recs), "threads": torch.get_num_threads()}))
"""


def _busy_loop() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def quickstart(steps: int, env_extra: dict[str, str], tmp: Path) -> dict:
    out_dir = tmp / f"run{len(list(tmp.glob('run*')))}"  # a fresh run directory per run
    drop = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "RLZOO_OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra)
    args = [
        f"data.dir={tmp}/data",
        f"run.output_dir={out_dir}",
        "run.progress=false",
        f"trainer.total_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    ]
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, "--", *args], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"quickstart failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes in the busy rows")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ns = ap.parse_args()
    print(f"sync quickstart, {ns.steps} steps, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'setting':<9} {'threads':>7} | {'quiet s':>8} {'busy s':>8} {'busy/quiet':>10} {'load':>5}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        quickstart(1, {}, tmp)  # prepares the data once
        for name in ns.settings:
            env = SETTINGS[name]
            quiet = quickstart(ns.steps, env, tmp)
            loops = [_busy_loop() for _ in range(ns.busy)]
            try:
                busy = quickstart(ns.steps, env, tmp)
            finally:
                for p in loops:
                    p.kill()
                    p.wait()
            q, b = quiet["train_s"], busy["train_s"]
            load = os.getloadavg()[0]
            print(
                f"{name:<9} {quiet['threads']:>7} | {q:>8.1f} {b:>8.1f} {b / q:>10.2f} {load:>5.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
