"""Router replay on the megatron backend (issue 37): the actor routes every token to the experts the
rollout recorded (``trainer.backend.router_replay``).

The reference is a plain transformers forward of the same tiny MoE whose routers are forced by
hand to the recorded experts, with HF's own weights formula at them: ``p = softmax(gate logits)``,
``w = p[experts]``, divided by ``w.sum()`` when ``norm_topk_prob`` (Qwen3-MoE), as is (Qwen2-MoE).
The recorded experts are drawn at random, so the trainer's own top-k would differ from them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlzoo.backends.megatron import MegatronParams
from rlzoo.backends.megatron.replay import replay_indices

from .megatron_moe_models import EXPERTS, save_tiny_moe

HAVE_MCORE = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
pytestmark = pytest.mark.usefixtures("one_thread")
TOPK, LAYERS = 2, 2


# -- pure tensor code -----------------------------------------------------------------------------
def test_replay_indices_in_the_routers_token_order_by_hand() -> None:
    """routes [b=2, S=2, layers=3, k=2]; megatron's router sees tokens [S, b] flattened: (s0,b0),
    (s0,b1), (s1,b0), (s1,b1). Stage with layers 1..2; -1 and a repeated expert become 0, 1."""
    r = torch.tensor(
        [
            [[[0, 1], [2, 3], [1, 0]], [[3, 2], [-1, -1], [0, 2]]],  # sample 0: s0, s1
            [[[1, 2], [0, 3], [3, 1]], [[2, 0], [1, 1], [2, 3]]],  # sample 1: s0, s1
        ]
    )
    got = replay_indices(r, first_layer=1, num_layers=2, num_experts=4)
    assert len(got) == 2 and got[0].dtype == torch.int64
    assert got[0].tolist() == [[2, 3], [0, 3], [0, 1], [0, 1]]  # layer 1: b0s0, b1s0, b0s1 (-1), b1s1 (1,1)
    assert got[1].tolist() == [[1, 0], [3, 1], [0, 2], [2, 3]]  # layer 2
    sp = replay_indices(
        r, first_layer=1, num_layers=2, num_experts=4, tp=2, tp_rank=1, sequence_parallel=True
    )
    assert sp[1].tolist() == [[0, 2], [2, 3]]  # TP rank 1's half of the sequence: s1 only
    assert replay_indices(r, first_layer=0, num_layers=1, num_experts=2)[0].tolist() == [[0, 1]] * 4  # >= E


def test_router_replay_settings_validated() -> None:
    with pytest.raises(
        ValueError, match="router_replay with recompute_activations and pipeline_model_parallel"
    ):
        MegatronParams(router_replay=True, recompute_activations=True, pipeline_model_parallel_size=2)
    MegatronParams(router_replay=True, recompute_activations=True)  # PP 1: a micro-batch at a time

    def cfg(name: str, records: bool, record: bool | None) -> Any:
        params = SimpleNamespace() if record is None else SimpleNamespace(record_routes=record)
        backend = SimpleNamespace(name=name, caps=SimpleNamespace(records_routes=records), params=params)
        return SimpleNamespace(rollout=SimpleNamespace(backend=backend))

    on = MegatronParams(router_replay=True)
    assert on.check(cfg("native", True, True)) == []
    assert MegatronParams().check(cfg("vllm", False, None)) == []
    (problem,) = on.check(cfg("vllm", False, None))
    assert "rollout backend 'vllm' does not record the experts" in problem and "router_replay" in problem
    (problem,) = on.check(cfg("native", True, False))
    assert "set rollout.backend.record_routes: true" in problem


def test_recipe_validation_names_both_settings() -> None:
    """Through the real registry: the vllm rollout backend declares no route recording."""
    from rlzoo.kernel.plugins import get_plugin_manager

    caps = {c.name: c.caps.records_routes for c in get_plugin_manager().registry("rollout_backend")}
    assert caps["native"] is True and caps["vllm"] is False


# -- against megatron-core ------------------------------------------------------------------------
def _batch_with_routes(seed: int) -> Any:
    from rlzoo.testing.backends import _random_batch

    batch = _random_batch(seed)
    B, S = batch["input_ids"].shape
    g = torch.Generator().manual_seed(seed)
    routes = torch.rand(B, S, LAYERS, EXPERTS, generator=g).argsort(-1)[..., :TOPK]  # distinct experts
    batch["routed_experts"] = torch.where(batch["attention_mask"][..., None, None].bool(), routes, -1).short()
    return batch


@torch.no_grad()
def _forced_log_probs(model: Any, batch: Any, temperature: float) -> torch.Tensor:
    """HF forward with every router forced to the batch's experts (padding: experts 0, 1)."""
    from rlzoo.testing.backends import reference_batch_log_probs

    routes = batch["routed_experts"].long()  # [B, S, layers, k]
    routes = torch.where(routes < 0, torch.arange(TOPK), routes)
    norm = model.config.norm_topk_prob
    originals = []
    for li, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate
        forced = routes[:, :, li].reshape(-1, TOPK)  # HF flattens [B, S] row-major

        def forward(h: torch.Tensor, gate: Any = gate, forced: torch.Tensor = forced) -> tuple[Any, ...]:
            logits = h.reshape(-1, gate.hidden_dim) @ gate.weight.T  # [N, E]
            w = logits.softmax(-1).gather(1, forced)  # [N, k]
            if norm:
                w = w / w.sum(-1, keepdim=True)
            return logits, w.to(logits.dtype), forced

        originals.append((gate, gate.forward))
        gate.forward = forward
    try:
        return reference_batch_log_probs(model.eval(), batch, temperature)
    finally:
        for gate, f in originals:
            gate.forward = f


def _backend(path: Path, router_replay: bool) -> Any:
    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import OptimSettings, TrainSpec

    params = MegatronParams(
        device="cpu", dtype="float32", use_distributed_optimizer=False, router_replay=router_replay
    )
    spec = TrainSpec(
        model_path=str(path),
        total_steps=2,
        temperature=0.9,
        optim=OptimSettings(lr=1e-2),
        need_reference=True,
    )
    return MegatronTrainBackend(params, spec)


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_replayed_routing_equals_the_recorded_experts_and_hf_forced_forward(
    family: str, tmp_path: Path
) -> None:
    from megatron.core.transformer.moe.router import TopKRouter

    from rlzoo.testing.backends import TokenMeanObjective, reference_batch_log_probs

    path = save_tiny_moe(tmp_path / family, family)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch = _batch_with_routes(0)
    forced = _forced_log_probs(hf, batch, 0.9)
    plain = reference_batch_log_probs(hf.eval(), batch, 0.9)
    assert (forced - plain).abs().max() > 1e-2  # the recorded routing is not the model's own

    b = _backend(path, router_replay=True)
    try:
        maps: list[torch.Tensor] = []
        routers = [m for m in b.actor.modules() if isinstance(m, TopKRouter)]
        hooks = [r.register_forward_hook(lambda m, a, out: maps.append(out[1].detach())) for r in routers]
        lp, _ = b.compute_log_probs(batch)
        for h in hooks:
            h.remove()
        torch.testing.assert_close(lp, forced, atol=1e-4, rtol=0)
        # the experts each router used: the recorded ones at every real token ([S, B] order)
        real = batch["attention_mask"].T.reshape(-1).bool()  # [S*B]
        for li, used in enumerate(maps):  # [S*B, E] bool, one per layer
            want = torch.zeros_like(used).scatter(
                1,
                batch["routed_experts"][:, :, li].long().clamp(min=0).transpose(0, 1).reshape(-1, TOPK),
                True,
            )
            assert torch.equal(used[real], want[real]), li
        gate_before = dict(b.export_weights())["model.layers.0.mlp.gate.weight"].clone()
        batch["old_log_probs"] = lp
        metrics = b.update_policy(batch, TokenMeanObjective(batch))
        assert not metrics["actor/skipped_steps"]
        gate_after = dict(b.export_weights())["model.layers.0.mlp.gate.weight"]
        assert (gate_after - gate_before).abs().max() > 1e-3  # the router learns through the replayed weights
        ref_lp, _ = b.compute_log_probs(batch, model="ref")
        torch.testing.assert_close(ref_lp, plain, atol=1e-4, rtol=0)  # the reference routes itself
        with pytest.raises(ValueError, match="the batch has no routed_experts"):
            del batch.tensors["routed_experts"]
            b.compute_log_probs(batch)
    finally:
        b.shutdown()

    off = _backend(path, router_replay=False)
    try:
        lp_off, _ = off.compute_log_probs(_batch_with_routes(0))
    finally:
        off.shutdown()
    torch.testing.assert_close(lp_off, plain, atol=1e-4, rtol=0)  # without replay: its own routing
    assert (lp_off - forced).abs().max() > 1e-2


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_router_replay_on_a_dense_model_refused_before_a_group_starts(tmp_path: Path) -> None:
    import torch.distributed as dist

    from rlzoo.testing.backends import save_tiny_qwen2

    if dist.is_initialized():
        pytest.skip("a process group was started outside this test")
    with pytest.raises(ValueError, match=r"router_replay needs a MoE model; model.path .* is dense"):
        _backend(save_tiny_qwen2(tmp_path / "dense"), router_replay=True)
    assert not dist.is_initialized()


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_native_rollout_routes_replayed_by_megatron_give_the_rollout_log_probs(tmp_path: Path) -> None:
    """End to end: the native engine samples from the tiny Qwen3-MoE recording its routes, the batch
    builder lays them out, the megatron actor replays them: its log-probs equal the rollout's (same
    weights, fp32: the replayed experts are the ones the engine used). The same routes shifted by one
    position (a misalignment) give other log-probs: the alignment is what is checked."""
    from rlzoo.backends.native.engine import NativeEngine
    from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
    from rlzoo.testing.backends import PAD
    from rlzoo.train.batching import samples_to_batch

    path = save_tiny_moe(tmp_path / "qwen3_moe", "qwen3_moe")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = NativeEngine(hf, max_num_seqs=3, record_routes=True, pad_token_id=PAD)
    g = torch.Generator().manual_seed(0)
    reqs = [
        GenerationRequest(
            f"r{i}",
            torch.randint(2, 60, (n,), generator=g).tolist(),
            SamplingParams(n=2, temperature=0.9, max_new_tokens=6, seed=i),
        )
        for i, n in enumerate((2, 6, 4))
    ]
    batch = samples_to_batch(engine.generate(reqs), None, pad_token_id=PAD)
    mask = batch["response_mask"].bool()
    b = _backend(path, router_replay=True)
    try:
        lp, _ = b.compute_log_probs(batch)
        torch.testing.assert_close(lp[mask], batch["rollout_log_probs"][mask], atol=1e-4, rtol=0)
        batch["routed_experts"] = batch["routed_experts"].roll(1, dims=1)
        shifted, _ = b.compute_log_probs(batch)
    finally:
        b.shutdown()
    assert (shifted[mask] - lp[mask]).abs().max() > 1e-3
