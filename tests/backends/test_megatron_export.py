"""``export_hf`` of the megatron train backend against the real megatron-core on CPU (gloo, fp32).

The exported folder is loaded with plain transformers (``AutoModelForCausalLM.from_pretrained``) and
its token log-probs, from a bare HF forward, must equal the backend's ``compute_log_probs`` after an
update step: the conversion back to HF names (fused QKV / gate-up split, TP / PP gathered, vocabulary
padding dropped, tied or untied ``lm_head``) is checked by the numbers of the model that loads, not
by the code under test. TP=2 and PP=2 run in two gloo processes (``megatron_export_dist.py``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlzoo.testing.backends import reference_batch_log_probs

from .conftest import torchrun

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core not installed",
    ),
    pytest.mark.usefixtures("one_thread"),
]


def build(model_dir: Path, **params: Any) -> Any:
    from rlzoo.backends.megatron import MegatronParams
    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import OptimSettings, TrainSpec

    spec = TrainSpec(
        model_path=str(model_dir),
        total_steps=10,
        temperature=0.9,
        optim=OptimSettings(lr=1e-2, grad_clip=0.0),
    )
    cpu = {"device": "cpu", "dtype": "float32", "use_distributed_optimizer": False}
    return MegatronTrainBackend(MegatronParams(**{**cpu, **params}), spec)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_export_loads_in_transformers_with_the_trainers_log_probs(tmp_path: Path, tie: bool) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlzoo.testing.backends import VOCAB, TokenMeanObjective, _random_batch, save_tiny_qwen2
    from rlzoo.train.export import export_model

    src = save_tiny_qwen2(tmp_path / "base", seed=1, tie=tie)
    batch = _random_batch(3)
    be = build(src)
    try:
        assert be.vocab_padded > VOCAB  # 64 real rows padded to 128: the export must drop the padding
        m = be.update_policy(batch, TokenMeanObjective(batch))
        assert not m["actor/skipped_steps"] and be.version == 1
        out = export_model(be, src, tmp_path / "final")
        trainer_lp, _ = be.compute_log_probs(batch)
        temperature = be.temperature
    finally:
        be.shutdown()

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.testing.assert_close(
        reference_batch_log_probs(model, batch, temperature), trainer_lp, atol=1e-5, rtol=0
    )
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    assert not torch.allclose(
        reference_batch_log_probs(base, batch, temperature), trainer_lp, atol=1e-3
    )  # trained

    # a standard folder: the base config (tying as it does), real vocabulary rows, tokenizer, generation
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is tie and cfg["vocab_size"] == VOCAB
    weights = load_file(out / "model.safetensors")
    assert weights["model.embed_tokens.weight"].shape[0] == VOCAB
    assert ("lm_head.weight" in weights) is not tie
    if not tie:
        assert weights["lm_head.weight"].shape[0] == VOCAB
    assert set(weights) == set(load_file(src / "model.safetensors"))
    assert not (out / "COMPLETE").exists() and (out / "generation_config.json").is_file()
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(src).get_vocab()


def test_a_mismatching_base_config_is_refused_before_writing(tmp_path: Path) -> None:
    """Strict: tensors that do not fit the base model's class fail loudly and leave no folder."""
    from rlzoo.backends.megatron.hf import hf_model
    from rlzoo.testing.backends import save_tiny_qwen2

    src = save_tiny_qwen2(tmp_path / "base")
    be = build(src)
    try:
        state = dict(be.export_weights())
        state.pop("model.norm.weight")
        with pytest.raises(RuntimeError, match=r"missing \['model.norm.weight'\]"):
            hf_model(state, be.spec, dims=be.dims, dtype=be.dtype)
        state = dict(be.export_weights())
        state["model.embed_tokens.weight"] = torch.zeros(be.vocab_padded, be.dims.hidden_size)  # padded
        with pytest.raises(RuntimeError, match="size mismatch"):
            hf_model(state, be.spec, dims=be.dims, dtype=be.dtype)
    finally:
        be.shutdown()
    assert not (tmp_path / "final").exists()


def test_vision_language_export_keeps_the_vision_tower(tmp_path: Path) -> None:
    """This backend trains a Qwen2.5-VL model's text decoder only: the export is the base model's
    class with the trained decoder (under ``model.language_model``) and the base's vision tower."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from rlzoo.models.tiny import build_tiny_qwen2_5_vl
    from rlzoo.train.export import export_model

    src = tmp_path / "vl"
    _, processor = build_tiny_qwen2_5_vl(src)
    be = build(src)
    try:
        with torch.no_grad():  # move the decoder away from the base weights
            for p in be.actor.parameters():
                p.add_(0.01)
        decoder = {k: v.clone() for k, v in be.export_weights()}
        out = export_model(be, src, tmp_path / "final", tokenizer=processor.tokenizer, processor=processor)
    finally:
        be.shutdown()
    mine, base = load_file(out / "model.safetensors"), load_file(src / "model.safetensors")
    assert mine.keys() == base.keys()
    vision = [k for k in mine if "visual." in k]
    assert vision and all(torch.equal(mine[k], base[k]) for k in vision)
    loaded = AutoModelForImageTextToText.from_pretrained(out).state_dict()
    base_model = AutoModelForImageTextToText.from_pretrained(src).state_dict()
    for name, t in decoder.items():
        hf_name = name if name in loaded else "model.language_model." + name[len("model.") :]
        torch.testing.assert_close(loaded[hf_name], t, atol=0, rtol=0)
        assert not torch.equal(loaded[hf_name], base_model[hf_name])


# -- TP=2 / PP=2: two gloo processes under torchrun; rank 0 loads the folder and compares ------------
DIST_SCRIPT = Path(__file__).with_name("megatron_export_dist.py")


@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_export_in_two_processes(layout: str, tmp_path: Path) -> None:
    torchrun(str(DIST_SCRIPT), layout, str(tmp_path), timeout=600, what=f"{layout}: torchrun")
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["max_abs_diff"] <= 1e-5 and result["vocab_rows"] == 64, result


# -- a whole run: final/, export/step_K/ and `rlzoo export` from its checkpoints --------------------
def test_a_megatron_run_exports_and_rlzoo_export_rebuilds_it(tmp_path: Path) -> None:
    """The quickstart recipe trained by the megatron backend (CPU, 2 steps): ``final/`` loads in
    plain transformers with the log-probs of the backend restored from the last checkpoint, and
    ``rlzoo export`` (which rebuilds the backend from ``config.yaml``) writes the same weights as the
    run did at each step."""
    import torch.distributed as dist
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rlzoo.cli import main
    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.recipe.compose import build_run
    from rlzoo.tasks._quickstart import prepare
    from rlzoo.tasks.quickstart import QuickstartDataParams
    from rlzoo.testing.backends import make_train_batch
    from rlzoo.train.export import load_run_config
    from rlzoo.train.inputs import train_spec

    if dist.is_initialized():
        pytest.skip("a process group was started outside this test")
    prepare(tmp_path / "data", QuickstartDataParams())
    run_dir = tmp_path / "run"
    overrides = [
        "run.progress=false",
        "run.loggers=[jsonl]",
        "trainer.val_before_train=false",
        f"data.dir={tmp_path / 'data'}",
        "trainer.total_steps=2",
        "trainer.save_freq=1",
        "run.export_every=1",
        f"run.output_dir={run_dir}",
        "trainer.backend=megatron",
        "trainer.backend.device=cpu",
        "trainer.backend.dtype=float32",
    ]
    build_run("quickstart", overrides).train()
    assert not dist.is_initialized()  # the run's backend tore down the group it started

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["actor/skipped_steps"] == 0.0 for r in rows if "actor/skipped_steps" in r)
    final = load_file(run_dir / "final" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in final.values())

    # rlzoo export: checkpoint 1 → the run's export/step_1; the latest (2) → final/
    for step, theirs in ((["--step", "1"], run_dir / "export" / "step_1"), ([], run_dir / "final")):
        out = tmp_path / f"cli{len(step)}"
        assert main(["export", str(run_dir), *step, "--out", str(out)]) == 0
        mine, want = load_file(out / "model.safetensors"), load_file(theirs / "model.safetensors")
        assert mine.keys() == want.keys()
        for k in mine:
            torch.testing.assert_close(mine[k], want[k], atol=0, rtol=0)
    assert not dist.is_initialized()

    # final/'s log-probs == the backend's after the last step (restored from checkpoint 2)
    cfg = load_run_config(run_dir)
    tok = load_tokenizer(run_dir / "final")
    rng = torch.Generator().manual_seed(0)
    V = len(tok)
    prompts = [torch.randint(2, V, (n,), generator=rng).tolist() for n in (3, 5, 2)]
    responses = [torch.randint(2, V, (n,), generator=rng).tolist() for n in (2, 1, 3)]
    batch = make_train_batch(prompts, responses)
    be = cfg.trainer.backend.fn(cfg.trainer.backend.params, train_spec(cfg, 2, tok))
    try:
        be.load_checkpoint(run_dir / "checkpoints" / "step_2")
        trainer_lp, _ = be.compute_log_probs(batch)
        temperature = be.temperature
    finally:
        be.shutdown()
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final", dtype=torch.float32).eval()
    torch.testing.assert_close(
        reference_batch_log_probs(model, batch, temperature), trainer_lp, atol=1e-5, rtol=0
    )
    base = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32).eval()
    assert not torch.allclose(reference_batch_log_probs(base, batch, temperature), trainer_lp, atol=1e-4)
