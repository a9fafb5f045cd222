"""Worker groups on a real local Ray cluster: proxies, weight sync correctness, failures."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, RolloutSpec, TrainSpec

pytestmark = pytest.mark.ray

TRAIN = "rlzoo.backends.native.train:NativeTrainBackend"
ROLLOUT = "rlzoo.backends.native.rollout:NativeRolloutBackend"
VOCAB = 96
#: trainer settings of every train backend built here (TrainSpec.optim / .micro_batch)
SETTINGS: dict[str, Any] = {
    "optim": OptimSettings(lr=5e-2),
    "micro_batch": MicroBatchSettings(size=64, log_prob_size=64),
}


def _train_params() -> Any:
    from rlzoo.backends.native.train_params import NativeTrainParams

    return NativeTrainParams(device="cpu")


def _rollout_params() -> Any:
    from rlzoo.backends.native.rollout_params import NativeRolloutParams

    return NativeRolloutParams(max_num_seqs=32)


def _rollout_spec(path: Path) -> RolloutSpec:
    return RolloutSpec(
        model_path=str(path), tokenizer_path=str(path), max_response_length=6, max_prompt_length=16
    )


def _requests(n: int, prefix: str, greedy: bool = False) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(len(prefix) + n)
    out = []
    for i in range(n):
        prompt = torch.randint(0, VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        sp = SamplingParams(n=2, max_new_tokens=6, greedy=greedy, seed=i, temperature=1.0)
        out.append(GenerationRequest(request_id=f"{prefix}-{i}", prompt_ids=prompt, sampling=sp))
    return out


def _batch(samples: list[Any]) -> Any:
    from rlzoo.train.batching import samples_to_batch

    return samples_to_batch(samples, None, pad_token_id=0)


def _generated_batch(model_dir: Path, prefix: str) -> Any:
    """A batch of 4 responses the in-process native rollout backend generates."""
    from rlzoo.backends.native.rollout import NativeRolloutBackend

    rollout = NativeRolloutBackend(_rollout_params(), _rollout_spec(model_dir))
    try:
        return _batch(rollout.generate(_requests(4, prefix)))
    finally:
        rollout.shutdown()


def _group(name: str, n: int) -> Any:
    from rlzoo.distributed.worker_group import WorkerSet

    return WorkerSet(name, n)


def _build(ws: Any, role: str, target: str, params: Any, spec: Any) -> None:
    ws.wait([a.build.remote(role, target, params, spec) for a in ws.actors], "build")


@pytest.fixture
def groups(ray_cluster: Any) -> Any:
    made: list[Any] = []

    def make(name: str, n: int) -> Any:
        ws = _group(name, n)
        made.append(ws)
        return ws

    yield make
    for ws in made:
        ws.kill()


def test_env_and_spmd_calls(groups: Any) -> None:
    from rlzoo.distributed.worker_group import TrainGroup

    ws = groups("trainer", 2)
    _build(ws, "train", "distributed.helpers:SleepyBackend", None, None)
    envs = ws.call_all("train", "env")
    assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert (
        envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    )
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]  # one node
    proxy = TrainGroup(ws)
    assert proxy.compute_log_probs(0.0) == (0, None)  # rank 0's result
    assert proxy.version == 0


def test_native_group_matches_in_process(groups: Any, tiny_model_dir: Path) -> None:
    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.distributed.worker_group import TrainGroup

    spec = TrainSpec(model_path=str(tiny_model_dir), **SETTINGS)
    ws = groups("trainer", 1)
    _build(ws, "train", TRAIN, _train_params(), spec)
    proxy = TrainGroup(ws)
    batch = _generated_batch(tiny_model_dir, "a")
    local = NativeTrainBackend(_train_params(), spec)
    want, _ = local.compute_log_probs(batch)
    got, _ = proxy.compute_log_probs(batch)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


HAS_FSDP2 = importlib.util.find_spec("rlzoo.backends.fsdp2.train") is not None
needs_fsdp2 = pytest.mark.skipif(
    not HAS_FSDP2,
    reason="the fsdp2 backend (rlzoo.backends.fsdp2.train) is not available; native is one process",
)
FSDP2 = "rlzoo.backends.fsdp2.train:FSDP2TrainBackend"


def _fsdp2_params() -> Any:
    from rlzoo.backends.fsdp2 import FSDP2Params

    return FSDP2Params(device="cpu")


@needs_fsdp2
def test_fsdp2_group_of_two_matches_in_process(groups: Any, tiny_model_dir: Path) -> None:
    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.distributed.worker_group import TrainGroup

    spec = TrainSpec(model_path=str(tiny_model_dir), **SETTINGS)
    ws = groups("trainer", 2)  # two SPMD ranks over gloo, each takes its shard of the same batch
    _build(ws, "train", FSDP2, _fsdp2_params(), spec)
    proxy = TrainGroup(ws)
    batch = _generated_batch(tiny_model_dir, "f")
    want, _ = NativeTrainBackend(_train_params(), spec).compute_log_probs(batch)
    got, _ = proxy.compute_log_probs(batch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _check_sync(train: Any, rollout: Any) -> None:
    """Update the trainer, sync, and compare rollout log-probs with trainer log-probs."""
    from distributed.helpers import MeanLogProbObjective

    batch = _batch(rollout.generate(_requests(6, "pre")))
    before, _ = train.compute_log_probs(batch)
    metrics = train.update_policy(batch, MeanLogProbObjective())
    assert train.version == 1, metrics
    after, _ = train.compute_log_probs(batch)
    assert (after - before).abs().max() > 1e-3  # the update changed the policy
    rollout.update_weights(train.export_weights(), train.version)
    assert rollout.last_sync["path"] == "broadcast" and rollout.last_sync["bytes"] > 0
    samples = rollout.generate(_requests(8, "post"))
    assert {v for s in samples for v in s.versions} == {1}
    b = _batch(samples)
    trainer_lp, _ = train.compute_log_probs(b)
    torch.testing.assert_close(b["rollout_log_probs"] * b["response_mask"], trainer_lp, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    "backend", ["native", pytest.param("fsdp2", marks=needs_fsdp2)], ids=["native-1+2", "fsdp2-2+1"]
)
def test_weight_sync_split(groups: Any, tiny_model_dir: Path, backend: str) -> None:
    from rlzoo.distributed.worker_group import RolloutGroup, TrainGroup

    if backend == "native":  # 1 trainer, 2 rollout replicas
        tw, rw = groups("trainer", 1), groups("rollout", 2)
        _build(tw, "train", TRAIN, _train_params(), TrainSpec(model_path=str(tiny_model_dir), **SETTINGS))
    else:  # 2 SPMD trainer ranks (rank 1 takes part in the export), 1 rollout replica
        tw, rw = groups("trainer", 2), groups("rollout", 1)
        _build(tw, "train", FSDP2, _fsdp2_params(), TrainSpec(model_path=str(tiny_model_dir), **SETTINGS))
    _build(rw, "rollout", ROLLOUT, _rollout_params(), _rollout_spec(tiny_model_dir))
    train = TrainGroup(tw)
    rollout = RolloutGroup(rw, train=train, bucket_size_mb=0.05)  # ~50 kB buckets: several rounds
    _check_sync(train, rollout)
    assert rollout.last_sync["buckets"] > 3 and rollout.last_sync["members"] == 1 + rw.world_size


def test_weight_sync_colocated_and_stream(groups: Any, tiny_model_dir: Path) -> None:
    from rlzoo.distributed.worker_group import RolloutGroup, TrainGroup

    ws = groups("trainer", 2)  # each worker: a native trainer (identical, same seed) + a rollout replica
    _build(ws, "train", TRAIN, _train_params(), TrainSpec(model_path=str(tiny_model_dir), **SETTINGS))
    _build(ws, "rollout", ROLLOUT, _rollout_params(), _rollout_spec(tiny_model_dir))
    train = TrainGroup(ws)
    rollout = RolloutGroup(ws, train=train, colocated=True, bucket_size_mb=1)
    _check_sync(train, rollout)
    # streaming over both replicas: every sample exactly once
    reqs = _requests(5, "stream")
    rollout.submit(reqs)
    got = sorted(s.uid for s in rollout.stream(timeout=30))
    assert got == sorted(f"{r.request_id}/{i}" for r in reqs for i in range(2))
    assert rollout.num_pending() == 0


def test_worker_error_surfaces_traceback(groups: Any) -> None:
    from rlzoo.distributed.worker_group import TrainGroup, WorkerError

    ws = groups("trainer", 2)
    _build(ws, "train", "distributed.helpers:SleepyBackend", None, None)
    with pytest.raises(
        WorkerError, match=r"(?s)trainer worker \d raised during train.compute_values\(\).*ValueError: boom"
    ):
        TrainGroup(ws).compute_values(None)


def test_killed_worker_fails_fast(groups: Any) -> None:
    import ray

    from rlzoo.distributed.worker_group import TrainGroup, WorkerError

    ws = groups("trainer", 2)
    _build(ws, "train", "distributed.helpers:SleepyBackend", None, None)
    proxy = TrainGroup(ws)
    threading.Timer(1.0, lambda: ray.kill(ws.actors[1], no_restart=True)).start()
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"trainer worker 1 died during train.compute_log_probs\(\)"):
        proxy.compute_log_probs(120.0)  # rank 0 would sleep for 2 minutes
    assert time.monotonic() - t0 < 30
    with pytest.raises(WorkerError, match="unusable after an earlier failure"):
        proxy.compute_log_probs(0.0)


def test_split_pools_get_their_threads(ray_cluster: Any) -> None:
    """``placement.<pool>.threads`` sets torch's threads in each worker of that pool (a split CPU run
    shares the cores: the trainer every one, the engine one)."""
    from rlzoo.distributed.ray_placement import RayPlacement
    from rlzoo.recipe.types import PlacementSection, PoolSection

    pc = PlacementSection(
        name="ray", colocate=False, trainer=PoolSection(threads=3), rollout=PoolSection(threads=1)
    )
    placement = RayPlacement(pc)
    try:
        got = {}
        for pool in ("trainer", "rollout"):
            ws = placement.workers(pool)
            _build(ws, "train", "distributed.helpers:SleepyBackend", None, None)
            got[pool] = ws.call_all("train", "process")[0]
    finally:
        placement.shutdown()
    # both 1 before (the cluster's OMP_NUM_THREADS)
    assert got["trainer"]["threads"] == 3 and got["rollout"]["threads"] == 1
