"""Trainer -> rollout weight sync on CPU: bucketed gloo broadcast between 2 Ray actors vs torch.save/load.

    python benchmarks/weight_sync.py                  # 10M, 50M, 200M float32 params
    python benchmarks/weight_sync.py --sizes 10 50 --bucket-mb 64 --repeats 3

For each size, a state dict of float32 tensors shaped like a transformer (square-ish matrices and
vectors) lives in a "trainer" actor; a "receiver" actor gets it by

- ``broadcast``: :mod:`rlzoo.distributed.weight_sync` over a gloo group between the two actors
  (what ``placement.name=ray`` does on CPU): ``export_weights()`` -> buckets -> broadcast ->
  unflatten -> copied into the receiver's own tensors (like ``update_weights``);
- ``torch.save/load``: the trainer writes the state dict to a file in /tmp, the receiver loads it
  and copies it into its tensors (the naive checkpoint hand-off).

Times are the best of ``--repeats`` after one warm-up; bytes/s = state-dict bytes / seconds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any


def make_state(n_params: int, seed: int = 0) -> dict[str, Any]:
    """float32 tensors totalling ~``n_params``: [d, d] matrices (d = 1024) and a [d] vector each."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = 1024
    out: dict[str, Any] = {}
    i = 0
    left = n_params
    while left > 0:
        rows = max(1, min(d, (left - d) // d)) if left > d else 1
        out[f"layers.{i}.weight"] = (
            torch.randn(rows, d, generator=g) if left > d else torch.randn(left, generator=g)
        )
        left -= out[f"layers.{i}.weight"].numel()
        if left > d:
            out[f"layers.{i}.bias"] = torch.randn(d, generator=g)
            left -= d
        i += 1
    return out


class Member:
    """One side of the benchmark (a Ray actor)."""

    def __init__(self, n_params: int, seed: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.state = make_state(n_params, seed)

    def info(self) -> tuple[str, int]:
        import ray

        from rlzoo.distributed.weight_sync import free_port

        return ray.util.get_node_ip_address(), free_port()

    def init(self, host: str, port: int, rank: int) -> None:
        from rlzoo.distributed.weight_sync import TorchSyncGroup

        self.group = TorchSyncGroup(host, port, rank, 2)

    def send(self, bucket_bytes: int) -> float:
        t0 = time.perf_counter()
        for _ in self.group.send(iter(self.state.items()), bucket_bytes):
            pass
        return time.perf_counter() - t0

    def receive(self) -> float:
        t0 = time.perf_counter()
        for name, t in self.group.receive():
            self.state[name].copy_(t)
        return time.perf_counter() - t0

    def save(self, path: str) -> float:
        import torch

        t0 = time.perf_counter()
        torch.save(self.state, path)
        return time.perf_counter() - t0

    def load(self, path: str) -> float:
        import torch

        t0 = time.perf_counter()
        for name, t in torch.load(path).items():
            self.state[name].copy_(t)
        return time.perf_counter() - t0

    def checksum(self) -> float:
        return float(sum(float(t.double().sum()) for t in self.state.values()))


def bench(size_m: int, bucket_mb: float, repeats: int) -> dict[str, float]:
    import ray

    n = size_m * 1_000_000
    cls = ray.remote(num_cpus=1)(Member)
    a, b = cls.remote(n, 0), cls.remote(n, 1)  # type: ignore[attr-defined]
    try:
        host, port = ray.get(a.info.remote())
        ray.get([a.init.remote(host, port, 0), b.init.remote(host, port, 1)])
        nbytes = n * 4
        sync = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            ray.get([a.send.remote(int(bucket_mb * 2**20)), b.receive.remote()])
            sync.append(time.perf_counter() - t0)
        assert ray.get(a.checksum.remote()) == ray.get(b.checksum.remote()), "broadcast changed the weights"
        disk = []
        fd, path = tempfile.mkstemp(suffix=".pt", dir="/tmp")
        os.close(fd)
        try:
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                ray.get(a.save.remote(path))
                ray.get(b.load.remote(path))
                disk.append(time.perf_counter() - t0)
        finally:
            os.unlink(path)
        s, d = min(sync[1:]), min(disk[1:])
        return {
            "params_m": size_m,
            "mb": nbytes / 1e6,
            "sync_s": s,
            "disk_s": d,
            "sync_bps": nbytes / s,
            "disk_bps": nbytes / d,
        }
    finally:
        ray.kill(a)
        ray.kill(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 200], help="millions of float32 params")
    ap.add_argument("--bucket-mb", type=float, default=64.0, help="bucket size of the broadcast")
    ap.add_argument("--repeats", type=int, default=3, help="timed repetitions (best is reported)")
    args = ap.parse_args()
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = [bench(s, args.bucket_mb, args.repeats) for s in args.sizes]
    if started:
        ray.shutdown()
    print(f"weight sync, CPU, 2 Ray actors, gloo, bucket {args.bucket_mb:g} MB (best of {args.repeats})")
    head = f"| {'params':>7} | {'MB':>7} | {'broadcast s':>11} | {'broadcast GB/s':>14} | {'save/load s':>11} | {'save/load GB/s':>14} | {'speedup':>7} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        print(
            f"| {r['params_m']:>6}M | {r['mb']:>7.0f} | {r['sync_s']:>11.3f} | {r['sync_bps'] / 1e9:>14.2f} | "
            f"{r['disk_s']:>11.3f} | {r['disk_bps'] / 1e9:>14.2f} | {r['disk_s'] / r['sync_s']:>6.1f}x |"
        )


if __name__ == "__main__":
    main()
