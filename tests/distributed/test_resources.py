"""Pools from the placement section, checked against the cluster before any actor starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlzoo.distributed.resources import PoolPlan, check_pools, plan_pools
from rlzoo.kernel.errors import ConfigError
from rlzoo.recipe.types import PlacementSection

from .conftest import free_cpus_after_release


def _placement(colocate: bool, trainer=(1, 0, 1), rollout=(1, 0, 1)) -> SimpleNamespace:
    def pool(t):
        return SimpleNamespace(nnodes=t[0], n_gpus_per_node=t[1], n_workers_per_node=t[2])

    defaults = PlacementSection()  # the settings this test does not vary, at their declared defaults
    return SimpleNamespace(
        colocate=colocate,
        trainer=pool(trainer),
        rollout=pool(rollout),
        address=None,
        bucket_size_mb=defaults.bucket_size_mb,
        sync_timeout_s=defaults.sync_timeout_s,
    )


def test_plans() -> None:
    assert [p.name for p in plan_pools(_placement(True))] == ["trainer"]
    t, r = plan_pools(_placement(False, trainer=(2, 4, 1), rollout=(1, 0, 3)))
    assert (t.world_size, t.totals()) == (8, {"CPU": 8.0, "GPU": 8.0})  # 2 nodes x 4 GPUs
    assert (r.world_size, r.totals()) == (3, {"CPU": 3.0})  # 1 node x 3 CPU workers
    with pytest.raises(ConfigError, match=r"placement.trainer.nnodes must be an integer >= 1"):
        plan_pools(_placement(True, trainer=(0, 0, 1)))


def test_gpu_shortfall_names_asked_and_available() -> None:
    pools = [PoolPlan("trainer", "placement.trainer", 1, 8, 1)]
    with pytest.raises(ConfigError) as e:
        check_pools(pools, {"CPU": 16.0, "GPU": 4.0}, colocate=True)
    msg = str(e.value)
    assert "asks for GPU=8" in msg and "the cluster has CPU=16, GPU=4" in msg


def test_split_pools_that_only_fit_by_sharing_overlap() -> None:
    pools = plan_pools(_placement(False, trainer=(1, 4, 1), rollout=(1, 4, 1)))
    check_pools(pools, {"CPU": 16.0, "GPU": 8.0}, [{"CPU": 16.0, "GPU": 8.0}], colocate=False)  # 4 + 4 <= 8
    with pytest.raises(ConfigError, match=r"the pools overlap.*GPU=8.*GPU=6"):
        check_pools(pools, {"CPU": 16.0, "GPU": 6.0}, [{"CPU": 16.0, "GPU": 6.0}], colocate=False)
    # 8 GPUs in total and each pool fits the 5-GPU node alone, but 4 + 4 cannot be packed on 5 + 3
    with pytest.raises(ConfigError, match="cannot be packed"):
        check_pools(pools, {"CPU": 32.0, "GPU": 8.0}, [{"GPU": 5.0}, {"GPU": 3.0}], colocate=False)


def test_per_node_gpu_check() -> None:
    pools = [PoolPlan("trainer", "placement.trainer", 2, 4, 1)]
    with pytest.raises(ConfigError, match="needs 2 node"):
        check_pools(pools, {"CPU": 64.0, "GPU": 8.0}, [{"GPU": 8.0}], colocate=True)


@pytest.mark.ray
def test_ray_placement_refuses_before_any_actor_starts(ray_cluster) -> None:
    ray = ray_cluster

    from rlzoo.distributed.ray_placement import RayPlacement

    before = free_cpus_after_release(ray)  # actors of earlier tests are released asynchronously
    too_many = SimpleNamespace(placement=_placement(True, trainer=(1, 0, 6)))
    with pytest.raises(ConfigError, match=r"asks for CPU=6 but the cluster has CPU=4"):
        RayPlacement(too_many.placement)  # type: ignore[arg-type]
    gpus = SimpleNamespace(placement=_placement(True, trainer=(1, 2, 1)))
    with pytest.raises(ConfigError, match=r"asks for GPU=2 but the cluster has CPU=4, GPU=0"):
        RayPlacement(gpus.placement)  # type: ignore[arg-type]
    overlap = SimpleNamespace(placement=_placement(False, trainer=(1, 0, 3), rollout=(1, 0, 2)))
    with pytest.raises(ConfigError, match="the pools overlap"):
        RayPlacement(overlap.placement)  # type: ignore[arg-type]
    assert ray.is_initialized()  # a Ray it did not start is left running
    assert ray.available_resources().get("CPU", 0.0) == before  # nothing reserved, no actor started
