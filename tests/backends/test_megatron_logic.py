"""The megatron backend's pure tensor code on CPU (no megatron-core): HF ↔ megatron weight
conversion with TP / PP sharding, the config mapping, vocab-parallel log-probs, the attention mask."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rlzoo.backends.megatron import MegatronParams
from rlzoo.backends.megatron.convert import (
    ModelDims,
    gpt_model_kwargs,
    hf_to_mcore,
    mcore_to_hf,
    merge_pp,
    merge_tp,
    padded_vocab_size,
    shard_tp,
    split_pp,
    transformer_config_kwargs,
)
from rlzoo.backends.megatron.train import attention_mask
from rlzoo.backends.megatron.vocab_parallel import simulate_vocab_parallel


def qwen2(tie: bool = False, layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=100,  # not a multiple of 128: exercises vocab padding
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,  # GQA: 4 query heads per group
        intermediate_size=48,
        tie_word_embeddings=tie,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-5,
    )
    model = AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():  # HF inits biases to 0: make them visible to the round trip
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_()
    return cfg, model


def hf_state(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if "rotary" not in k}


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


# -- config ---------------------------------------------------------------------------------------
def test_dims_and_transformer_config_from_hf() -> None:
    cfg, _ = qwen2()
    d = ModelDims.from_hf(cfg)
    assert (d.num_layers, d.hidden_size, d.ffn_hidden_size) == (2, 32, 48)
    assert (d.num_attention_heads, d.num_query_groups, d.head_dim, d.heads_per_group) == (8, 2, 4, 4)
    assert d.rope_theta == 1_000_000.0 and d.rms_norm_eps == 1e-5 and d.qkv_bias and not d.tie_word_embeddings
    kw = transformer_config_kwargs(d, tensor_model_parallel_size=2)
    assert kw["num_query_groups"] == 2 and kw["kv_channels"] == 4 and kw["ffn_hidden_size"] == 48
    assert kw["normalization"] == "RMSNorm" and kw["layernorm_epsilon"] == 1e-5
    assert kw["gated_linear_unit"] and kw["activation_func"] is torch.nn.functional.silu
    assert kw["add_qkv_bias"] and not kw["add_bias_linear"] and kw["tensor_model_parallel_size"] == 2
    g = gpt_model_kwargs(d, tp=2)
    assert g["vocab_size"] == 256 and g["rotary_base"] == 1_000_000 and g["position_embedding_type"] == "rope"
    assert g["share_embeddings_and_output_weights"] is False and g["parallel_output"] is True


def test_padded_vocab_by_hand() -> None:
    # multiples of 128 * tp: 100 → 128 (tp 1), 256 (tp 2). Qwen2's 151936 = 1187 * 128 stays at
    # tp 1; at tp 4 the unit is 512 and 151936 / 512 = 296.75 → 297 * 512 = 152064
    assert padded_vocab_size(100, 1) == 128 and padded_vocab_size(100, 2) == 256
    assert padded_vocab_size(151936, 1) == 151936 and padded_vocab_size(151936, 4) == 152064


# -- conversion -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("spec", ["local", "te"])
def test_hf_mcore_round_trip_tp1_tp2_pp2(tie: bool, spec: str) -> None:
    cfg, model = qwen2(tie=tie)
    d = ModelDims.from_hf(cfg)
    hf = hf_state(model)
    for tp in (1, 2):
        full = hf_to_mcore(hf, d, layer_spec=spec, vocab_padded=padded_vocab_size(d.vocab_size, tp))
        assert full["embedding.word_embeddings.weight"].shape == (padded_vocab_size(100, tp), 32)
        assert ("output_layer.weight" in full) == (not tie)
        shards = shard_tp(full, tp)
        assert_same(merge_tp(shards), full)
        stages = split_pp(full, d.num_layers, 2)
        assert sorted(k for k in stages[0] if "layers" in k) == sorted(
            k for k in stages[1] if "layers" in k
        )  # both stages number their layer from 0
        assert_same(merge_pp(stages, d.num_layers), full)
        back = mcore_to_hf(merge_tp(shards), d, layer_spec=spec)
        assert_same(back, hf)


def test_fused_qkv_matches_megatrons_split_by_group() -> None:
    """megatron: mixed = x @ W_qkv^T, viewed [.., G, (q+2)D], split [qD, D, D] per group
    (attention.py get_query_key_value_tensors). That must give HF's q, k, v projections."""
    cfg, model = qwen2()
    d = ModelDims.from_hf(cfg)
    full = hf_to_mcore(hf_state(model), d)
    x = torch.randn(3, 32)
    attn = model.model.layers[0].self_attn
    mixed = (
        x @ full["decoder.layers.0.self_attention.linear_qkv.weight"].T
        + full["decoder.layers.0.self_attention.linear_qkv.bias"]
    )  # [3, G(q+2)D]
    q, k, v = mixed.view(3, d.num_query_groups, -1).split(
        [d.heads_per_group * d.head_dim, d.head_dim, d.head_dim], -1
    )
    with torch.no_grad():
        torch.testing.assert_close(q.reshape(3, -1), attn.q_proj(x))
        torch.testing.assert_close(k.reshape(3, -1), attn.k_proj(x))
        torch.testing.assert_close(v.reshape(3, -1), attn.v_proj(x))


def test_tp_shards_by_hand() -> None:
    """TP=2 with G=2: rank r holds group r's q heads, k, v; fc1 holds [gate_r; up_r]; row-parallel
    o_proj / down_proj are split by input columns; norms replicated; vocab rows split in halves."""
    cfg, model = qwen2()
    d = ModelDims.from_hf(cfg)
    hf = hf_state(model)
    full = hf_to_mcore(hf, d, vocab_padded=256)
    r0, r1 = shard_tp(full, 2)
    L = "decoder.layers.1."
    qkv1 = r1[L + "self_attention.linear_qkv.weight"]  # group 1: 4 q heads (16 rows), k (4), v (4)
    assert torch.equal(qkv1[:16], hf["model.layers.1.self_attn.q_proj.weight"][16:])
    assert torch.equal(qkv1[16:20], hf["model.layers.1.self_attn.k_proj.weight"][4:])
    assert torch.equal(qkv1[20:], hf["model.layers.1.self_attn.v_proj.weight"][4:])
    fc1 = r1[L + "mlp.linear_fc1.weight"]  # [2 * 24, 32]
    assert torch.equal(fc1[:24], hf["model.layers.1.mlp.gate_proj.weight"][24:])
    assert torch.equal(fc1[24:], hf["model.layers.1.mlp.up_proj.weight"][24:])
    assert torch.equal(r0[L + "mlp.linear_fc2.weight"], hf["model.layers.1.mlp.down_proj.weight"][:, :24])
    assert torch.equal(
        r1[L + "self_attention.linear_proj.weight"], hf["model.layers.1.self_attn.o_proj.weight"][:, 16:]
    )
    assert r0[L + "input_layernorm.weight"] is r1[L + "input_layernorm.weight"]
    emb1 = r1["embedding.word_embeddings.weight"]  # rows 128..255: all padding (vocab 100)
    assert emb1.shape == (128, 32) and not emb1.any()
    with pytest.raises(ValueError, match="divisible"):
        shard_tp({"decoder.layers.0.mlp.linear_fc2.weight": torch.zeros(4, 5)}, 2)


def test_megatron_layout_reproduces_the_hf_forward() -> None:
    """A hand-written forward over the megatron tensors (RMSNorm, fused QKV split per group, GQA,
    rotary, SwiGLU from linear_fc1 halves) gives HF's logits: the layout is not only invertible
    but means what megatron's modules compute."""
    cfg, model = qwen2(layers=1)
    d = ModelDims.from_hf(cfg)
    mc = hf_to_mcore(hf_state(model), d, vocab_padded=128)
    ids = torch.tensor([[5, 9, 2, 77, 31]])
    S, _H, G, q, D = 5, 32, d.num_query_groups, d.heads_per_group, d.head_dim

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + d.rms_norm_eps) * w

    x = mc["embedding.word_embeddings.weight"][ids[0]]  # [S, H]
    p = "decoder.layers.0."
    h = rms(x, mc[p + "input_layernorm.weight"])
    mixed = h @ mc[p + "self_attention.linear_qkv.weight"].T + mc[p + "self_attention.linear_qkv.bias"]
    qh, kh, vh = mixed.view(S, G, -1).split([q * D, D, D], -1)  # [S, G, qD], [S, G, D], [S, G, D]
    qh = qh.reshape(S, G * q, D)  # heads ordered by group
    kh = kh.repeat_interleave(q, 1)  # [S, G*q, D]
    vh = vh.repeat_interleave(q, 1)
    inv = 1.0 / (d.rope_theta ** (torch.arange(0, D, 2).float() / D))
    ang = torch.arange(S)[:, None].float() * inv[None]  # [S, D/2]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]

    def rot(t):
        return t * cos + torch.cat([-t[..., D // 2 :], t[..., : D // 2]], -1) * sin

    qh, kh = rot(qh), rot(kh)
    scores = torch.einsum("shd,thd->hst", qh, kh) / D**0.5
    scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    att = torch.einsum("hst,thd->shd", scores.softmax(-1), vh).reshape(S, -1)
    x = x + att @ mc[p + "self_attention.linear_proj.weight"].T
    h = rms(x, mc[p + "pre_mlp_layernorm.weight"])
    gate, up = (h @ mc[p + "mlp.linear_fc1.weight"].T).chunk(2, -1)
    x = x + (torch.nn.functional.silu(gate) * up) @ mc[p + "mlp.linear_fc2.weight"].T
    logits = rms(x, mc["decoder.final_layernorm.weight"]) @ mc["output_layer.weight"].T  # [S, 128]
    with torch.no_grad():
        want = model(input_ids=ids).logits[0]  # [S, 100]
    torch.testing.assert_close(logits[:, :100], want, atol=1e-4, rtol=1e-4)
    assert not mc["output_layer.weight"][100:].any()  # padding rows: zero


# -- vocab-parallel log-probs ---------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vocab_parallel_log_probs_equal_full_log_softmax(tp: int) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 16, requires_grad=True)
    targets = torch.randint(0, 16, (3, 5))
    lp, ent = simulate_vocab_parallel(logits, targets, tp, temperature=0.7, with_entropy=True)
    ref = torch.log_softmax(logits / 0.7, -1)  # [3, 5, 16]
    want = ref.gather(-1, targets[..., None])[..., 0]
    want_ent = -(ref.exp() * ref).sum(-1)
    torch.testing.assert_close(lp, want)
    torch.testing.assert_close(ent, want_ent)
    # gradients flow through the simulated all-reduces as through the real (differentiable) ones
    (g,) = torch.autograd.grad((lp.sum() + ent.sum()), logits)
    (g_ref,) = torch.autograd.grad((want.sum() + want_ent.sum()), logits)
    torch.testing.assert_close(g, g_ref)


def test_vocab_parallel_masks_padding_rows() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 8)
    logits[..., 6:] = 100.0  # padding rows with huge logits must not count
    targets = torch.randint(0, 6, (2, 3))
    lp, ent = simulate_vocab_parallel(logits, targets, 2, with_entropy=True, vocab_size=6)
    ref = torch.log_softmax(logits[..., :6], -1)
    torch.testing.assert_close(lp, ref.gather(-1, targets[..., None])[..., 0])
    torch.testing.assert_close(ent, -(ref.exp() * ref).sum(-1))


def test_vocab_parallel_entropy_gradient_is_finite_with_padding_rows() -> None:
    """The masked padding columns are -inf: the entropy's backward gave NaN gradients (a megatron
    quickstart run with entropy_coeff > 0 got NaN weights) although its forward was right."""
    torch.manual_seed(2)
    logits = torch.randn(2, 3, 8, requires_grad=True)
    targets = torch.randint(0, 6, (2, 3))
    lp, ent = simulate_vocab_parallel(logits, targets, 2, with_entropy=True, vocab_size=6)
    (g,) = torch.autograd.grad(lp.sum() + ent.sum(), logits)
    ref = torch.log_softmax(logits[..., :6], -1)
    want = ref.gather(-1, targets[..., None])[..., 0].sum() - (ref.exp() * ref).sum()
    (g_ref,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g, g_ref)  # padding columns: zero gradient


def test_vocab_parallel_by_hand() -> None:
    # logits [0, ln 3 | 0, 0] over 2 shards: softmax = [1, 3, 1, 1] / 6; token 1 → log(1/2)
    logits = torch.tensor([[0.0, torch.log(torch.tensor(3.0)), 0.0, 0.0]])
    lp, _ = simulate_vocab_parallel(logits, torch.tensor([1]), 2)
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.5])))


# -- attention mask and params --------------------------------------------------------------------
def test_attention_mask_causal_and_key_padding() -> None:
    attn = torch.tensor([[0, 1, 1]])  # one left-padding column
    m = attention_mask(attn)  # True = masked
    assert m.shape == (1, 1, 3, 3)
    assert m[0, 0].tolist() == [[True, True, True], [True, False, True], [True, False, False]]


def test_params_validation() -> None:
    MegatronParams()
    with pytest.raises(ValueError) as e:
        MegatronParams(layer_spec="xx", sequence_parallel=True, dtype="float16")
    msg = str(e.value)
    assert "layer_spec" in msg and "sequence_parallel" in msg and "dtype" in msg


def test_registered_without_importing_megatron() -> None:
    from rlzoo.kernel.plugins import get_plugin_manager

    comp = get_plugin_manager().get("train_backend", "megatron")
    assert list(comp.capabilities["devices"]) == ["cuda", "cpu"] and comp.capabilities["distributed"] is True
    comp.load()  # the implementation imports megatron only when a backend is built
