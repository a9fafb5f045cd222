"""The native engine records a MoE model's routing per token (router replay, issue 37).

Reference: a plain forward of ``prompt + response[:-1]`` (batch of one, no cache, no padding) with
the router's formula applied by hand to each layer's gate input: ``topk(softmax(h @ W_gate^T), k)``
(transformers' Qwen3-MoE / Qwen2-MoE router); the engine's recorded indices equal it at every
position, through continuous batching, shared prefills, left padding and a weight update.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlzoo.backends.native.engine import NativeEngine
from rlzoo.kernel.protocols import GenerationRequest, Sample, SamplingParams
from rlzoo.train.batching import samples_to_batch

from .megatron_moe_models import moe_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
TOPK = 2


def _moe(family: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(moe_config(family)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate" in name or "experts" in name:
                p.normal_(0.0, 0.5)  # HF starts the router at zero: every expert would tie
    return model


@torch.no_grad()
def _routes_by_hand(model: nn.Module, tokens: list[int]) -> torch.Tensor:
    """``[len(tokens), layers, k]``: each MoE layer's top-k of softmax(gate logits), from the gate's input."""
    inputs: list[torch.Tensor] = []
    gates = [layer.mlp.gate for layer in model.model.layers]
    hooks = [
        g.register_forward_pre_hook(lambda m, a: inputs.append(a[0].reshape(-1, a[0].shape[-1])))
        for g in gates
    ]
    try:
        model(input_ids=torch.tensor([tokens]))
    finally:
        for h in hooks:
            h.remove()
    chosen = [
        (h @ g.weight.T).softmax(-1).topk(TOPK, -1).indices for h, g in zip(inputs, gates)
    ]  # [L, k] each
    return torch.stack(chosen, dim=1)  # [L, layers, k]


def _requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate((3, 7, 1, 5)):
        prompt = torch.randint(2, 60, (n,), generator=g).tolist()
        out.append(GenerationRequest(f"r{i}", prompt, SamplingParams(n=2, max_new_tokens=6, seed=i)))
    return out


def _check(model: nn.Module, samples: list[Sample]) -> None:
    assert samples
    for s in samples:
        assert s.routed_experts is not None
        fed = s.prompt_ids + s.response_ids[:-1]  # the last sampled token is never fed
        assert s.routed_experts.shape == (len(fed), 2, TOPK)
        expected = _routes_by_hand(model, fed)
        assert torch.equal(s.routed_experts.long().sort(-1).values, expected.sort(-1).values), s.uid


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
@pytest.mark.parametrize("cache", [True, False])
def test_recorded_routes_equal_the_router_formula_per_position(family: str, cache: bool) -> None:
    model = _moe(family)
    engine = NativeEngine(model, max_num_seqs=3, use_kv_cache=cache, record_routes=True, eos_token_ids=[1])
    _check(model, engine.generate(_requests()))  # 8 sequences through 3 slots: rows join and leave


def test_routes_after_a_weight_update_are_the_recomputed_ones() -> None:
    """A re-prefill with the new weights replaces the routes of the positions it recomputes."""
    model, other = _moe("qwen3_moe", 0), _moe("qwen3_moe", 1)
    engine = NativeEngine(model, max_num_seqs=8, record_routes=True)
    engine.submit(_requests())
    engine.step()
    engine.step()  # every row has a context and two sampled tokens (none stops before 6)
    engine.update_weights(other.state_dict().items(), version=1)
    assert engine._kv_stale
    while engine.num_running() or engine.num_waiting() or engine._inbox:
        engine.step()
    samples = [engine._out.get_nowait() for _ in range(engine._out.qsize())]
    assert len(samples) == 8 and all(s.versions[0] == 0 and s.versions[-1] == 1 for s in samples)
    _check(model, samples)  # model now holds the new weights: every position recomputed or decoded by them


def test_dense_model_refused_by_name() -> None:
    from rlzoo.models.tiny import tiny_qwen2_config

    dense = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(64, hidden_size=32))
    with pytest.raises(ValueError, match=r"record_routes: the model \(Qwen2ForCausalLM\) has no MoE router"):
        NativeEngine(dense, record_routes=True)


def test_batch_carries_routes_in_the_training_layout() -> None:
    """Prompt left-padded to P, response right-padded to T: routes at the same columns, -1 elsewhere."""
    r0 = torch.arange(4 * 2 * 2).reshape(4, 2, 2)  # prompt 2 + response 3: positions 0..3 fed
    r1 = 10 + torch.arange(3 * 2 * 2).reshape(3, 2, 2)  # prompt 3 + response 1: positions 0..2 fed
    req = [
        GenerationRequest("a", [5, 6], SamplingParams()),
        GenerationRequest("b", [5, 6, 7], SamplingParams()),
    ]
    s0 = Sample.of_request(req[0], 0, [8, 9, 1], [0.0] * 3, [0] * 3, "stop")
    s1 = Sample.of_request(req[1], 0, [1], [0.0], [0], "stop")
    s0.routed_experts, s1.routed_experts = r0, r1
    batch = samples_to_batch([s0, s1], None, pad_token_id=0)
    got = batch["routed_experts"]  # [2, P+T = 3+3, 2, 2]
    assert got.shape == (2, 6, 2, 2) and got.dtype == torch.int16
    assert (got[0, 0] == -1).all() and torch.equal(got[0, 1:5], r0.short()) and (got[0, 5] == -1).all()
    assert torch.equal(got[1, :3], r1.short()) and (got[1, 3:] == -1).all()
    mb = batch.select([1])
    assert torch.equal(mb["routed_experts"], got[1:2])
    s1.routed_experts = None
    with pytest.raises(ValueError, match="sample b/0 has no routed_experts while others of the batch do"):
        samples_to_batch([s0, s1], None, pad_token_id=0)
