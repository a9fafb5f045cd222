"""Vision-language prompts through the native rollout engine and train backend, on a CPU.

A tiny Qwen2.5-VL (built from its config, ~100k parameters) and a Qwen2.5-VL processor built
offline (:func:`rlzoo.models.tiny.build_tiny_qwen2_5_vl`): image tokens are expanded, M-RoPE
positions come from the model's rope index, the engine prefills with pixels and decodes at
``pos + rope_delta``, and the trainer's forward gives the rollout's log-probs.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlzoo.kernel.errors import ConfigError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL")

from rlzoo.backends.native import multimodal as mm  # noqa: E402
from rlzoo.backends.native.engine import NativeEngine  # noqa: E402
from rlzoo.backends.native.train import NativeTrainBackend  # noqa: E402
from rlzoo.backends.native.train_params import NativeTrainParams  # noqa: E402
from rlzoo.kernel.protocols import SamplingParams  # noqa: E402
from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec  # noqa: E402
from rlzoo.models.processor import expand_prompt, has_vision_config  # noqa: E402
from rlzoo.models.tiny import build_tiny_qwen2_5_vl, png_bytes  # noqa: E402
from rlzoo.train.batching import make_requests, samples_to_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vl() -> tuple[Any, Any]:
    return build_tiny_qwen2_5_vl(seed=0)


def image(color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(color, size)))


def render(processor: Any, text: str) -> str:
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    return processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def item(processor: Any, text: str, color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> dict:
    """A dataset item as PromptDataset(processor=...) yields it (unexpanded ids, rendered text)."""
    prompt_text = render(processor, text)
    ids = processor.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    return {"prompt_ids": ids, "prompt_text": prompt_text, "images": [image(color, size)], "index": 0}


#: four prompts: two sizes of image, two prompts with the same text and other images
PROMPTS = (
    ("Find x", (200, 0, 0), (56, 56)),
    ("Find x the is 3 4", (0, 0, 200), (112, 56)),
    ("Find x", (0, 200, 0), (56, 56)),
    ("x is 7", (90, 90, 90), (56, 112)),
)


def requests(processor: Any, sampling: SamplingParams, prefix: str = "r") -> list:
    items = [item(processor, *p) for p in PROMPTS]
    return make_requests(items, sampling, prefix, processor=processor)


def engine(model: Any, processor: Any, **kw: Any) -> NativeEngine:
    tok = processor.tokenizer
    return NativeEngine(model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, **kw)


# ---------------------------------------------------------------------------------------------
# the helpers
# ---------------------------------------------------------------------------------------------
def test_expand_prompt_puts_one_token_per_merged_patch(vl: tuple[Any, Any]) -> None:
    model, processor = vl
    # 56x56 -> 4x4 patches of 14 px; 2x2 merge -> 4 image tokens. 112x56 -> 8x4 patches -> 8 tokens
    for size, n_tokens in (((56, 56), 4), ((112, 56), 8)):
        ids, inputs = expand_prompt(processor, render(processor, "Find x"), [image((1, 2, 3), size)])
        assert ids.count(model.config.image_token_id) == n_tokens
        grid = inputs["image_grid_thw"]
        assert grid.tolist()[0][0] == 1 and int(grid.prod()) // 4 == n_tokens
        assert inputs["pixel_values"].shape[0] == int(grid.prod())


def test_rope_positions_of_text_only_rows_are_plain_positions(vl: tuple[Any, Any]) -> None:
    model, _ = vl
    ids = torch.tensor([[0, 0, 20, 21, 22], [20, 21, 22, 23, 24]])  # row 0 left-padded by 2 (text tokens)
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos, deltas = mm.rope_position_ids(model, ids, attn, None)
    assert pos.shape == (3, 2, 5)
    assert pos[:, 0, 2:].tolist() == [[0, 1, 2]] * 3 and pos[:, 1].tolist() == [[0, 1, 2, 3, 4]] * 3
    assert deltas.flatten().tolist() == [0, 0]


def test_make_requests_expands_images_with_a_processor(vl: tuple[Any, Any]) -> None:
    model, processor = vl
    sp = SamplingParams(n=1, max_new_tokens=4)
    it = item(processor, "Find x", (1, 2, 3))
    (plain,) = make_requests([it], sp, "t")  # no processor: ids as tokenized, images passed through
    assert plain.prompt_ids == it["prompt_ids"] and set(plain.multi_modal) == {"images"}
    (req,) = make_requests([it], sp, "t", processor=processor)
    assert req.prompt_ids.count(model.config.image_token_id) == 4  # 56x56: 4 merged patches
    assert len(req.prompt_ids) == len(it["prompt_ids"]) + 3
    assert set(req.multi_modal) == {"images", "pixel_values", "image_grid_thw"}
    assert req.multi_modal["image_grid_thw"].tolist() == [[1, 4, 4]]


# ---------------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------------
def _greedy(model: Any, processor: Any, reqs: list, **kw: Any) -> list:
    eng = engine(model, processor, **kw)
    try:
        return eng.generate(reqs)
    finally:
        eng.shutdown()


def test_engine_continuous_batching_matches_each_prompt_alone(vl: tuple[Any, Any]) -> None:
    """Two slots for four image prompts of different lengths: rows leave and join mid-flight, and
    every greedy sample (tokens and log-probs) equals decoding its prompt alone; with
    max_prefill_tokens small, joins are prefilled in several chunks."""
    model, processor = vl
    reqs = requests(processor, SamplingParams(n=1, max_new_tokens=6, greedy=True))
    reqs[0].sampling = SamplingParams(n=1, max_new_tokens=2, greedy=True)  # leaves early: a slot frees
    alone = [_greedy(model, processor, [r])[0] for r in reqs]
    eng = engine(model, processor, max_num_seqs=2, max_prefill_tokens=24)
    batched = eng.generate(reqs)
    assert eng.stats["prefill_forwards"] >= 3  # the second pair joined while the first ran
    eng.shutdown()
    no_cache = _greedy(model, processor, reqs, use_kv_cache=False)
    for a, b, c in zip(alone, batched, no_cache):
        assert a.response_ids == b.response_ids == c.response_ids
        assert len(a.response_ids) == (2 if a.request_id == reqs[0].request_id else 6)
        torch.testing.assert_close(b.rollout_log_probs, a.rollout_log_probs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(c.rollout_log_probs, a.rollout_log_probs, atol=1e-5, rtol=1e-5)
        assert b.multi_modal is not None and "pixel_values" in b.multi_modal
    # prompts 0 and 2 have the same tokens and other images: they were not prefilled as one
    assert reqs[0].prompt_ids == reqs[2].prompt_ids
    assert batched[0].rollout_log_probs[:2] != batched[2].rollout_log_probs[:2]


def test_samples_of_a_prompt_share_its_prefill_and_reprefill_after_update(vl: tuple[Any, Any]) -> None:
    """n=3 samples of one image prompt: one prefill row; an update_weights mid-flight re-prefills
    the running rows with their pixels and continues exactly (same weights: same tokens)."""
    model, processor = vl
    reqs = requests(processor, SamplingParams(n=3, max_new_tokens=5, temperature=1.0, seed=7))[:2]
    ref = _greedy(model, processor, reqs)
    eng = engine(model, processor, max_num_seqs=8)
    eng.submit(reqs)
    eng.step()
    eng.step()
    assert eng.stats["prefill_forwards"] == 1  # 2 prompts x 3 samples: one prefill of 2 rows
    eng.update_weights([(k, v.clone()) for k, v in model.state_dict().items()], version=1)
    got = list(eng.stream())
    assert eng.stats["recomputes"] == 1
    eng.shutdown()
    got.sort(key=lambda s: (s.request_id, s.index))
    for a, b in zip(ref, got):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(b.rollout_log_probs, a.rollout_log_probs, atol=1e-5, rtol=1e-5)
        n = len(b.versions)  # a sample may stop (sample its EOS) within the first two steps
        assert b.versions == ([0, 0] + [1] * n)[:n]
    assert max(len(b.versions) for b in got) > 2  # some ran on after the update


def test_engine_rejects_image_prompts_without_pixels(vl: tuple[Any, Any]) -> None:
    model, processor = vl
    sp = SamplingParams(n=1, max_new_tokens=2)
    (req,) = make_requests([item(processor, "Find x", (1, 2, 3))], sp, "t")  # no processor: no pixels
    eng = engine(model, processor)
    with pytest.raises(ValueError, match="pixel_values"):
        eng.submit([req])
    eng.shutdown()


# ---------------------------------------------------------------------------------------------
# engine -> train backend
# ---------------------------------------------------------------------------------------------
def _trainer(model: Any, **spec: Any) -> NativeTrainBackend:
    params = NativeTrainParams(device="cpu")
    settings = {"optim": OptimSettings(lr=1e-2), "micro_batch": MicroBatchSettings(size=3, log_prob_size=3)}
    return NativeTrainBackend.from_module(
        copy.deepcopy(model), params, TrainSpec(model_path="", **settings, **spec)
    )


@pytest.fixture(scope="module")
def sampled(vl: tuple[Any, Any]) -> list:
    model, processor = vl
    reqs = requests(processor, SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=3))
    return _greedy(model, processor, reqs, max_num_seqs=3)


def test_engine_log_probs_equal_the_train_backend_and_depend_on_the_image(
    vl: tuple[Any, Any], sampled: list
) -> None:
    model, processor = vl
    batch = samples_to_batch(sampled, None, processor.tokenizer.pad_token_id)
    assert len(batch["multi_modal"]) == 8 and all("pixel_values" in m for m in batch["multi_modal"])
    assert len({len(s.response_ids) for s in sampled}) > 1  # response padding in the batch
    backend = _trainer(model, need_reference=True)
    lp, ent = backend.compute_log_probs(batch, with_entropy=True)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp[mask], batch["rollout_log_probs"][mask], atol=1e-4, rtol=1e-4)
    assert (lp[~mask] == 0).all() and ent is not None and (ent[mask] > 0).all() and (ent[~mask] == 0).all()
    ref_lp, _ = backend.compute_log_probs(batch, model="ref")
    torch.testing.assert_close(ref_lp, lp)

    # other pixels for row 0 (same token ids): its log-probs change, the other rows' do not
    other = expand_prompt(processor, render(processor, "Find x"), [image((0, 255, 255))])[1]
    swapped = batch.select(list(range(len(batch))))
    swapped["multi_modal"] = [other, *batch["multi_modal"][1:]]
    lp2, _ = backend.compute_log_probs(swapped)
    assert not torch.allclose(lp2[0][mask[0]], lp[0][mask[0]], atol=1e-4)
    torch.testing.assert_close(lp2[1:], lp[1:])


def test_update_policy_trains_the_vision_tower(vl: tuple[Any, Any], sampled: list) -> None:
    model, processor = vl
    batch = samples_to_batch(sampled, None, processor.tokenizer.pad_token_id)
    backend = _trainer(model)
    visual = {n: p.detach().clone() for n, p in backend.actor.named_parameters() if "visual" in n}

    class MeanLogProb:  # a declared rlzoo.kernel.protocols.Objective
        needs_entropy = False

        def __call__(self, mb: Any, log_probs: Any, entropy: Any) -> tuple[Any, dict]:
            return -(log_probs * mb["response_mask"]).sum() / batch["response_mask"].sum(), {}

    metrics = backend.update_policy(batch, MeanLogProb())
    assert metrics["actor/skipped_steps"] == 0.0 and metrics["actor/num_micro_batches"] == 3.0
    after = dict(backend.actor.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in visual.items())  # the vision tower learned too


def test_freeze_vision_tower_keeps_it_fixed_and_trains_the_rest(vl: tuple[Any, Any], sampled: list) -> None:
    model, processor = vl
    batch = samples_to_batch(sampled, None, processor.tokenizer.pad_token_id)
    backend = NativeTrainBackend.from_module(
        copy.deepcopy(model),
        NativeTrainParams(device="cpu", freeze_vision_tower=True),
        TrainSpec(
            model_path="",
            optim=OptimSettings(lr=1e-2),
            micro_batch=MicroBatchSettings(size=3, log_prob_size=3),
        ),
    )
    before = {n: p.detach().clone() for n, p in backend.actor.named_parameters()}
    visual = {n for n in before if "visual" in n}
    assert visual and all(not backend.actor.get_parameter(n).requires_grad for n in visual)
    in_optimizer = {id(p) for g in backend.optimizer.param_groups for p in g["params"]}
    assert not any(id(backend.actor.get_parameter(n)) in in_optimizer for n in visual)

    class MeanLogProb:  # a declared rlzoo.kernel.protocols.Objective
        needs_entropy = False

        def __call__(self, mb: Any, log_probs: Any, entropy: Any) -> tuple[Any, dict]:
            return -(log_probs * mb["response_mask"]).sum() / batch["response_mask"].sum(), {}

    metrics = backend.update_policy(batch, MeanLogProb())
    assert metrics["actor/skipped_steps"] == 0.0
    after = dict(backend.actor.named_parameters())
    assert all(torch.equal(after[n], before[n]) for n in visual)  # the tower did not move
    assert any(not torch.equal(after[n], v) for n, v in before.items() if n not in visual)  # the rest learned


def test_freeze_vision_tower_on_a_text_model_is_refused() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    with pytest.raises(
        ConfigError, match=r"freeze_vision_tower=true needs a vision-language model.*LlamaForCausalLM"
    ):
        NativeTrainBackend.from_module(
            LlamaForCausalLM(cfg), NativeTrainParams(device="cpu", freeze_vision_tower=True)
        )


def test_vl_critic_is_not_supported(vl: tuple[Any, Any]) -> None:
    with pytest.raises(NotImplementedError, match=r"critic.*vision-language"):
        _trainer(vl[0], need_critic=True)


# ---------------------------------------------------------------------------------------------
# loading from a folder, and a recipe end to end
# ---------------------------------------------------------------------------------------------
def test_backends_and_processor_load_a_vl_folder(tmp_path: Path) -> None:
    from rlzoo.backends.native.rollout import NativeRolloutBackend
    from rlzoo.backends.native.rollout_params import NativeRolloutParams
    from rlzoo.kernel.settings import RolloutSpec
    from rlzoo.models.tiny import build_tiny_qwen2
    from rlzoo.train.inputs import load_processor

    build_tiny_qwen2_5_vl(tmp_path / "vl")
    build_tiny_qwen2(tmp_path / "text")
    assert has_vision_config(str(tmp_path / "vl")) and not has_vision_config(str(tmp_path / "text"))

    def cfg(path: Path) -> Any:
        return SimpleNamespace(
            model=SimpleNamespace(path=str(path), tokenizer_path=None, trust_remote_code=False)
        )

    assert load_processor(cfg(tmp_path / "text")) is None
    processor = load_processor(cfg(tmp_path / "vl"))
    ids, inputs = expand_prompt(processor, render(processor, "Find x"), [image((5, 5, 5))])
    assert ids.count(processor.image_token_id) == 4 and inputs["image_grid_thw"].tolist() == [[1, 4, 4]]

    spec = RolloutSpec(model_path=str(tmp_path / "vl"), tokenizer_path=str(tmp_path / "vl"))
    rollout = NativeRolloutBackend(NativeRolloutParams(background_thread=False), spec)
    trainer = NativeTrainBackend(NativeTrainParams(device="cpu"), TrainSpec(model_path=str(tmp_path / "vl")))
    for m in (rollout.model, trainer.actor):
        assert type(m).__name__ == "Qwen2_5_VLForConditionalGeneration" and mm.is_multimodal_model(m)
    rollout.shutdown()


@pytest.mark.slow
def test_tiny_grpo_geo3k_vl_trains_two_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rlzoo train grpo_geo3k_vl +tiny=grpo_geo3k_vl trainer.total_steps=2`` on the tiny Qwen2.5-VL."""
    import datasets

    from rlzoo.models.tiny import build_tiny
    from rlzoo.recipe.compose import build_run

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RLZOO_TINY_DIR", str(tmp_path / "tiny"))
    base = build_tiny("grpo_geo3k_vl", tmp_path / "tiny")
    assert has_vision_config(str(base / "model"))
    run = build_run(
        "grpo_geo3k_vl",
        ["+tiny=grpo_geo3k_vl", "trainer.total_steps=2", f"run.output_dir={tmp_path / 'run'}"],
    )
    summary = run.train()
    assert summary["steps"] == 2
    import json

    recs = {
        r["step"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    }
    for step in (1, 2):
        r = recs[step]
        assert isinstance(r["actor/pg_loss"], float) and isinstance(r["actor/kl_loss"], float)
        assert r["prompt_length/mean"] > 4  # the expanded image tokens are in the prompts
        assert r["actor/skipped_steps"] == 0.0
        # the rollout's log-probs are the trainer's (same weights before the update)
        assert r["rollout_corr/log_ppl_abs_diff"] < 1e-4
    assert isinstance(recs[2]["val/mean"], float)
