"""verl's megatron context / expert parallelism sizes in ``rlzoo from-verl`` (issue 37): context
parallelism 1 is accepted (nothing to map), larger refused with the reason docs/backends/megatron.md
gives (what megatron-core itself refuses, tests/backends/test_megatron_parallel.py); expert
parallelism maps to the megatron backend's own sizes, which its params validate."""

from __future__ import annotations

import pytest
from rlzoo_from_verl import convert, parse_overrides

from rlzoo.kernel.errors import RlzooError

ACT = "actor_rollout_ref.actor.megatron."


def _convert(text: str):
    return convert(parse_overrides(text.split()))


def test_megatron_cp_size_refused_with_the_reason() -> None:
    key, reason = "context_parallel_size", "'Context parallelism is only supported by TEDotProductAttention!'"
    conv = _convert(f"actor_rollout_ref.actor.strategy=megatron {ACT}{key}=1")
    assert any(k == ACT + key for k, _, _ in conv.skipped)
    with pytest.raises(RlzooError) as e:
        _convert(f"actor_rollout_ref.actor.strategy=megatron {ACT}{key}=2")
    assert ACT + key in str(e.value) and reason in str(e.value)


def test_megatron_expert_parallel_sizes_map_to_the_backend() -> None:
    """Failed before (refused: 'converts dense Qwen2 checkpoints only'); the recipe's sizes are the
    backend's params (which refuse ETP ≠ TP by name: tests/backends/test_megatron_moe.py)."""
    from rlzoo.backends.megatron import MegatronParams

    conv = _convert(
        f"actor_rollout_ref.actor.strategy=megatron {ACT}expert_model_parallel_size=8 "
        f"{ACT}expert_tensor_parallel_size=1"
    )
    backend = conv.recipe["trainer"]["backend"]
    assert backend["expert_parallel_size"] == 8 and backend["expert_tensor_parallel_size"] == 1
    MegatronParams(**{k: v for k, v in backend.items() if k != "name"})  # TP 1: valid


RR, ROLL_RR = (
    "actor_rollout_ref.actor.router_replay.mode",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay",
)


def test_router_replay_r3_maps_to_the_megatron_setting() -> None:
    """Failed before (refused: 'rlzoo has no MoE router replay'). R3 with the rollout's recording ->
    ``trainer.backend.router_replay``; vLLM records no routes, which the conversion says (and
    validate refuses: tests/backends/test_megatron_replay.py)."""
    from rlzoo.backends.megatron import MegatronParams

    conv = _convert(f"actor_rollout_ref.actor.strategy=megatron {RR}=R3 {ROLL_RR}=True")
    backend = conv.recipe["trainer"]["backend"]
    assert backend["router_replay"] is True
    MegatronParams(**{k: v for k, v in backend.items() if k != "name"})
    assert "record_routes" not in conv.recipe["rollout"]["backend"]  # vllm has no such param
    assert any("rollout backend 'vllm' does not record the experts" in n for n in conv.notes)
    off = _convert(f"actor_rollout_ref.actor.strategy=megatron {RR}=disabled {ROLL_RR}=False")
    assert "router_replay" not in off.recipe["trainer"]["backend"]
    assert {k for k, _, _ in off.skipped} >= {RR, ROLL_RR}


@pytest.mark.parametrize(
    ("words", "key", "reason"),
    [
        (f"{RR}=R2", RR, "R2 (the updates replay the routing of the trainer's own old-log-prob forward)"),
        (f"{RR}=R3", ROLL_RR, "set enable_rollout_routing_replay=True"),
        (f"{RR}=R3 {ROLL_RR}=True actor_rollout_ref.actor.strategy=fsdp", RR, "megatron train backend"),
        (f"{RR}=R9", RR, "disabled, R2 and R3"),
    ],
)
def test_router_replay_modes_rlzoo_lacks_refused_by_name(words: str, key: str, reason: str) -> None:
    if "strategy" not in words:
        words = f"actor_rollout_ref.actor.strategy=megatron {words}"
    with pytest.raises(RlzooError) as e:
        _convert(words)
    assert key in str(e.value) and reason in str(e.value)
