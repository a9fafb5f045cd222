"""MoE models (Qwen3-MoE, Qwen2-MoE) on the megatron train backend (issue 37).

Pure tensor code first (no megatron-core): the MoE fields of the config mapping, HF → megatron → HF
of the router, the experts (fused in memory, one tensor per expert on disk), the shared expert and
the query / key norms, and the expert-parallel split checked by hand. Then against the real
megatron-core on CPU: megatron's top-k routing equals HF's router formula, and the whole train
contract (log-probs equal a plain transformers forward of the tiny MoE, export into a fresh HF model,
checkpoints, gradient accumulation) on a tiny Qwen3-MoE and a tiny Qwen2-MoE.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlzoo.backends.megatron import MegatronParams
from rlzoo.backends.megatron.convert import (
    ModelDims,
    hf_to_mcore,
    mcore_to_hf,
    merge_ep,
    merge_tp,
    shard_ep,
    shard_tp,
    transformer_config_kwargs,
)
from rlzoo.testing.backends import TrainBackendContract

from .conftest import torchrun
from .megatron_moe_models import EXPERTS, moe_config, save_tiny_moe

HAVE_MCORE = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
pytestmark = pytest.mark.usefixtures("one_thread")


def moe_model(family: str, seed: int = 0, **overrides: object) -> tuple[object, dict[str, torch.Tensor]]:
    cfg = moe_config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():  # HF starts the router and biases at zero: make every tensor visible
        for p in model.parameters():
            p.normal_()
    return cfg, {k: v for k, v in model.state_dict().items() if "rotary" not in k}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


# -- config ---------------------------------------------------------------------------------------
def test_moe_dims_and_transformer_config_from_hf() -> None:
    """Qwen3-MoE renormalises its top-k (norm_topk_prob): megatron's softmax over the top-k logits
    (pre_softmax off); Qwen2-MoE does not: softmax over all experts, then top-k (pre_softmax on),
    plus a gated shared expert. The load-balancing loss is HF's only when it adds it to the loss."""
    d3 = ModelDims.from_hf(moe_config("qwen3_moe"))
    assert (d3.num_experts, d3.moe_topk, d3.moe_ffn_hidden_size) == (EXPERTS, 2, 24)
    assert d3.norm_topk_prob and d3.qk_layernorm and not d3.qkv_bias and d3.shared_expert_size == 0
    kw = transformer_config_kwargs(d3)
    assert (kw["num_moe_experts"], kw["moe_router_topk"], kw["moe_ffn_hidden_size"]) == (EXPERTS, 2, 24)
    assert kw["moe_router_pre_softmax"] is False and kw["qk_layernorm"] is True
    assert kw["moe_router_load_balancing_type"] == "none" and kw["moe_aux_loss_coeff"] == 0.0
    assert "moe_shared_expert_intermediate_size" not in kw

    d2 = ModelDims.from_hf(moe_config("qwen2_moe", output_router_logits=True, router_aux_loss_coef=0.01))
    assert d2.qkv_bias and not d2.qk_layernorm and not d2.norm_topk_prob and d2.shared_expert_size == 40
    kw = transformer_config_kwargs(d2)
    assert kw["moe_router_pre_softmax"] is True and kw["moe_shared_expert_gate"] is True
    assert kw["moe_shared_expert_intermediate_size"] == 40
    assert kw["moe_router_load_balancing_type"] == "aux_loss" and kw["moe_aux_loss_coeff"] == 0.01


def test_moe_layouts_megatron_cannot_hold_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[1\].*not supported"):
        ModelDims.from_hf(moe_config("qwen3_moe", mlp_only_layers=[1]))
    with pytest.raises(ValueError, match="decoder_sparse_step=2"):
        ModelDims.from_hf(moe_config("qwen2_moe", decoder_sparse_step=2))
    from transformers import DeepseekV3Config, MixtralConfig

    with pytest.raises(ValueError, match=r"model_type 'deepseek_v3' \(with 8 experts\) is not one of them"):
        ModelDims.from_hf(
            DeepseekV3Config(n_routed_experts=8, hidden_size=32, num_attention_heads=4, num_key_value_heads=4)
        )
    with pytest.raises(ValueError, match=r"model_type 'mixtral'.*not one of them"):
        ModelDims.from_hf(
            MixtralConfig(num_local_experts=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
        )


# -- conversion -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_round_trip_through_tp_and_ep_shards(family: str) -> None:
    """HF (fused experts) → megatron → EP=2 × TP=2 shards → merged → HF: identical tensors."""
    cfg, hf = moe_model(family)
    d = ModelDims.from_hf(cfg)
    full = hf_to_mcore(hf, d, vocab_padded=128)
    assert_same(mcore_to_hf(full, d), hf)
    for ep, tp in ((2, 1), (2, 2), (4, 1)):
        shards = [shard_tp(s, tp) for s in shard_ep(full, d.num_experts, ep)]
        merged = merge_ep([merge_tp(s) for s in shards], d.num_experts)
        assert_same(merged, full)
        assert_same(mcore_to_hf(merged, d), hf)


def test_per_expert_checkpoint_names_read_as_the_fused_ones(tmp_path: Path) -> None:
    """transformers' safetensors hold one tensor per expert (``experts.{e}.gate_proj.weight``);
    read as they are, they convert to the same megatron tensors as the model's fused state dict."""
    from rlzoo.backends.megatron.hf import load_hf_state_dict

    path = save_tiny_moe(tmp_path / "m", "qwen2_moe")
    disk = load_hf_state_dict(str(path))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in disk  # the on-disk layout this reads
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    fused = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    d = ModelDims.from_hf(model.config)
    assert_same(hf_to_mcore(disk, d), hf_to_mcore(fused, d))


def test_expert_weights_and_ep_shards_by_hand() -> None:
    """Expert e's fc1 is [gate_e; up_e] (HF's fused gate_up_proj[e] holds the same), fc2 its
    down_proj; the router is HF's gate; EP=2 of 4 experts: rank 1 holds experts 2, 3 as 0, 1 and
    the router / norms / shared expert like rank 0."""
    cfg, hf = moe_model("qwen2_moe")
    d = ModelDims.from_hf(cfg)
    full = hf_to_mcore(hf, d)
    L, H = "decoder.layers.1.mlp.", "model.layers.1.mlp."
    gate_up = hf[H + "experts.gate_up_proj"]  # [E, 2F, H]
    assert torch.equal(full[L + "experts.local_experts.2.linear_fc1.weight"], gate_up[2])
    assert torch.equal(full[L + "experts.local_experts.2.linear_fc2.weight"], hf[H + "experts.down_proj"][2])
    assert torch.equal(full[L + "router.weight"], hf[H + "gate.weight"])
    assert torch.equal(full[L + "shared_experts.gate_weight"], hf[H + "shared_expert_gate.weight"])
    shared_fc1 = full[L + "shared_experts.linear_fc1.weight"]  # [2*40, 32]
    assert torch.equal(shared_fc1[40:], hf[H + "shared_expert.up_proj.weight"])
    r0, r1 = shard_ep(full, EXPERTS, 2)
    assert torch.equal(r1[L + "experts.local_experts.0.linear_fc1.weight"], gate_up[2])
    assert torch.equal(r1[L + "experts.local_experts.1.linear_fc1.weight"], gate_up[3])
    assert L + "experts.local_experts.2.linear_fc1.weight" not in r1
    assert r0[L + "router.weight"] is r1[L + "router.weight"]
    with pytest.raises(ValueError, match=r"expert count \(4\) is not divisible by expert_parallel_size 3"):
        shard_ep(full, EXPERTS, 3)


def test_expert_parallel_sizes_validated() -> None:
    from rlzoo.backends.megatron.parallel import check_expert_parallel

    with pytest.raises(ValueError, match="expert_parallel_size must be >= 1"):
        MegatronParams(expert_parallel_size=0)
    with pytest.raises(
        ValueError, match="expert_tensor_parallel_size 1 differs from tensor_model_parallel_size 2"
    ):
        MegatronParams(tensor_model_parallel_size=2, expert_tensor_parallel_size=1)
    MegatronParams(expert_parallel_size=8, expert_tensor_parallel_size=1)  # verl's TP 1 layout
    check_expert_parallel(2, 1, tp=1, pp=1, world=2, num_experts=4)  # fits
    check_expert_parallel(1, 1, tp=1, pp=1, world=1, num_experts=0)  # dense, nothing asked
    with pytest.raises(ValueError, match="does not divide the model's 6 experts"):
        check_expert_parallel(4, 1, tp=1, pp=1, world=4, num_experts=6)
    with pytest.raises(
        ValueError, match=r"expert_parallel_size 4 × expert_tensor_parallel_size 1 does not divide"
    ):
        check_expert_parallel(4, 1, tp=1, pp=1, world=2, num_experts=8)
    with pytest.raises(ValueError, match="need a MoE model"):
        check_expert_parallel(2, 1, tp=1, pp=1, world=2, num_experts=0)
    with pytest.raises(ValueError, match="tensor_model_parallel_size 2 needs sequence_parallel"):
        check_expert_parallel(1, 2, tp=2, pp=1, world=2, num_experts=4)  # known once the model is


# -- against megatron-core ------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
@pytest.mark.parametrize("renormalise", [True, False])
def test_megatron_routing_equals_hfs_router_formula(renormalise: bool) -> None:
    """HF: p = softmax(logits); top-k of p; divided by their sum iff norm_topk_prob. megatron with
    ``pre_softmax = not norm_topk_prob``: the same experts and weights."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    logits = torch.randn(7, EXPERTS, generator=torch.Generator().manual_seed(0))
    p = logits.softmax(-1)  # [7, E]
    w, idx = p.topk(2, -1)  # [7, 2]
    if renormalise:
        w = w / w.sum(-1, keepdim=True)
    expected = torch.zeros_like(p).scatter(1, idx, w)  # [7, E]
    probs, routing_map = topk_routing_with_score_function(logits, 2, use_pre_softmax=not renormalise)
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=0)
    assert torch.equal(routing_map, expected > 0)


class TestMegatronQwen3MoeCPU(TrainBackendContract):
    """The train contract on a tiny Qwen3-MoE (4 experts, top-2, q/k norms), one process, fp32."""

    name = "megatron"
    requires = ("megatron.core", "psutil")
    params_overrides = {"device": "cpu", "dtype": "float32", "use_distributed_optimizer": False}
    lp_atol = 1e-4
    # 6×1 vs 1×6 micro-batches: every gradient agrees to ~1e-7 of its size (measured: largest
    # difference 8e-8), but Adam's first step is lr·g/(|g| + eps) ≈ lr·sign(g) down to |g| ~ eps,
    # and a few expert weights that few tokens reach have |g| ~ 1e-8, where rounding flips the
    # step: at eps 1e-8 the log-probs after it differed by 5e-5 on an AVX-512 CPU and 3.3e-4 on an
    # AVX2 one. eps 1e-6 shrinks those steps 100x and leaves the steps of every gradient above
    # 1e-5 as they were: what the check compares is the accumulated gradient (measured on the AVX2
    # CPU: 7e-6 for Qwen3-MoE, 1.5e-5 for Qwen2-MoE)
    contract_params = {**TrainBackendContract.contract_params, "eps": 1e-6}
    update_atol = 1e-4
    family = "qwen3_moe"

    def model_dir(self, seed: int = 0) -> Path:
        path = self._tmp / f"{self.family}-{seed}"
        if not path.exists():
            save_tiny_moe(path, self.family, seed=seed)
        return path


class TestMegatronQwen2MoeCPU(TestMegatronQwen3MoeCPU):
    """The train contract on a tiny Qwen2-MoE (4 experts, top-2 not renormalised, gated shared expert)."""

    family = "qwen2_moe"


@pytest.mark.slow  # ~1 min each on 2 busy cores (two backends built in each of two processes)
@pytest.mark.distributed
@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
@pytest.mark.parametrize(
    ("family", "layout"), [("qwen3_moe", "ep2"), ("qwen2_moe", "ep2"), ("qwen3_moe", "ep2_replay")]
)
def test_expert_parallel_equals_unsplit_in_the_backend(family: str, layout: str, tmp_path: Path) -> None:
    """Over 2 gloo ranks, ``expert_parallel_size: 2`` (data parallel 2): one update gives the same
    total loss, log-probs and exported parameters (all experts gathered) as the unsplit model
    (EP 1, data parallel 2; fp32, 1e-5); expert 3, on EP rank 1 only, moved
    (``megatron_moe_ep_dist.py``). ``ep2_replay``: both with ``router_replay`` and the batch's
    recorded experts (the tokens reach the experts of the other EP rank the record names)."""
    worker = Path(__file__).with_name("megatron_moe_ep_dist.py")
    out = torchrun(str(worker), str(tmp_path), family, layout, timeout=600, what=f"MoE {layout} ({family})")
    base = "unsplit_replay" if layout.endswith("_replay") else "unsplit"
    assert len(re.findall(rf"MOE BACKEND {layout} == {base} \({family}\) rank \d", out)) == 2, out[-3000:]


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_expert_parallel_on_a_dense_model_refused_before_a_group_starts(tmp_path: Path) -> None:
    import torch.distributed as dist

    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import TrainSpec
    from rlzoo.testing.backends import save_tiny_qwen2

    if dist.is_initialized():
        pytest.skip("a process group was started outside this test")
    spec = TrainSpec(model_path=str(save_tiny_qwen2(tmp_path / "dense")), total_steps=1)
    params = MegatronParams(device="cpu", dtype="float32", expert_parallel_size=2)
    with pytest.raises(
        ValueError, match="expert_parallel_size 2 / expert_tensor_parallel_size 1 need a MoE model"
    ):
        MegatronTrainBackend(params, spec)
    assert not dist.is_initialized()


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_dense_qwen3_log_probs_equal_transformers(tmp_path: Path) -> None:
    """Qwen3's query / key norms on a dense model too (before, a Qwen3 config converted without
    them): the backend's log-probs equal a plain transformers forward (fp32)."""
    from transformers import Qwen3Config

    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import TrainSpec
    from rlzoo.testing.backends import _random_batch, reference_batch_log_probs, save_tiny_qwen2

    path = save_tiny_qwen2(tmp_path / "m")  # the tokenizer; the model is replaced below
    cfg = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)  # visible q / k norms (HF starts them at 1)
    model.save_pretrained(str(path))
    batch = _random_batch(0)
    params = MegatronParams(device="cpu", dtype="float32", use_distributed_optimizer=False)
    b = MegatronTrainBackend(params, TrainSpec(model_path=str(path), total_steps=1, temperature=0.9))
    try:
        lp, _ = b.compute_log_probs(batch)
    finally:
        b.shutdown()
    torch.testing.assert_close(lp, reference_batch_log_probs(model.eval(), batch, 0.9), atol=1e-4, rtol=0)
