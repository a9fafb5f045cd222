"""A run's model as a standard HF folder (rlzoo.train.export): final/, export/step_K/, rlzoo export.

The exported folder is loaded with plain transformers (``AutoModelForCausalLM``, ``AutoTokenizer``,
``AutoProcessor``) and its log-probs, computed here with a bare HF forward, must equal the trainer's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.errors import RlzooError
from rlzoo.train.export import HFExportable, export_model, load_run_config

QUIET = ["run.progress=false", "run.loggers=[jsonl]", "trainer.val_before_train=false"]


def hf_log_probs(model: Any, batch: Batch) -> torch.Tensor:
    """log p(response token | prefix) with a bare HF forward: logits at t predict token t + 1."""
    ids, attn = batch["input_ids"], batch["attention_mask"]  # [B, P + T]
    T = batch["responses"].shape[1]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()  # [B, P+T, V]
    logp = torch.log_softmax(logits[:, -T - 1 : -1], dim=-1)  # [B, T, V]
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1) * batch["response_mask"]  # [B, T]


def text_batch(tok: Any) -> Batch:
    from rlzoo.kernel.protocols import Sample
    from rlzoo.train.batching import samples_to_batch

    msgs = [[{"role": "user", "content": f"first of {a} {b}"}] for a, b in ((3, 7), (5, 1), (2, 2))]
    prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in msgs]
    prompts = [
        list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts
    ]
    eos = int(tok.eos_token_id)
    resps = [[tok.convert_tokens_to_ids("3"), eos], [tok.convert_tokens_to_ids("1")], [eos]]
    samples = [
        Sample(f"r{i}", 0, p, r, [0.0] * len(r), [0] * len(r), "stop")
        for i, (p, r) in enumerate(zip(prompts, resps))
    ]
    batch = samples_to_batch(samples, None, pad_token_id=int(tok.pad_token_id))
    return batch


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, quickstart_dir: Path) -> Path:
    """A 3-step quickstart run (native backend) with a checkpoint at steps 2 and 3 and exports."""
    from rlzoo.recipe.compose import build_run

    out = tmp_path_factory.mktemp("export") / "run"
    run = build_run(
        "quickstart",
        [
            *QUIET,
            f"data.dir={quickstart_dir}",
            "trainer.total_steps=3",
            "trainer.save_freq=2",
            "run.export_every=2",
            f"run.output_dir={out}",
        ],
    )
    run.train()
    return out


def test_final_loads_in_plain_transformers_and_matches_the_trainer(run_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.train.inputs import train_spec

    final = run_dir / "final"
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"):
        assert (final / name).is_file(), name
    assert (final / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (final / "tokenizer_config.json").read_text()
    )
    assert not (final / "COMPLETE").exists()  # an HF folder, not a checkpoint
    assert (run_dir / "export" / "step_2" / "model.safetensors").is_file()
    assert "timing_s/export" in json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])

    # the tokenizer: rlzoo's loader gives the run's tokenizer back; AutoTokenizer loads the same vocab
    rcfg = load_run_config(run_dir)
    run_tok = load_tokenizer(rcfg.model.path)
    src = load_tokenizer(final)
    text = run_tok.apply_chat_template([{"role": "user", "content": "last of 4 9"}], tokenize=False)
    assert src(text)["input_ids"] == run_tok(text)["input_ids"]
    assert src.chat_template == run_tok.chat_template and src.chat_template
    auto_tok = AutoTokenizer.from_pretrained(final)
    assert auto_tok.get_vocab() == run_tok.get_vocab()
    assert auto_tok.chat_template == run_tok.chat_template

    # the weights: the exported model's log-probs == the trainer's after the last step (checkpoint 3)
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    batch = text_batch(src)
    be = NativeTrainBackend(rcfg.trainer.backend.params, train_spec(rcfg, 3, src))
    be.load_checkpoint(run_dir / "checkpoints" / "step_3")
    trainer_lp, _ = be.compute_log_probs(batch)
    torch.testing.assert_close(hf_log_probs(model, batch), trainer_lp, atol=1e-5, rtol=0)
    # and they differ from the base model's: the export carries the trained weights
    base = AutoModelForCausalLM.from_pretrained(rcfg.model.path).eval()
    assert not torch.allclose(hf_log_probs(base, batch), trainer_lp, atol=1e-4)


def test_cli_export_from_a_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlzoo.cli import main

    out = tmp_path / "step2"
    assert main(["export", str(run_dir), "--step", "2", "--out", str(out)]) == 0
    AutoModelForCausalLM.from_pretrained(out)
    mine = load_file(out / "model.safetensors")
    during_run = load_file(run_dir / "export" / "step_2" / "model.safetensors")
    assert mine.keys() == during_run.keys()
    for k in mine:
        torch.testing.assert_close(mine[k], during_run[k], atol=0, rtol=0)
    latest = tmp_path / "latest"
    assert main(["export", str(run_dir), "--out", str(latest)]) == 0  # the latest checkpoint: step 3
    final = load_file(run_dir / "final" / "model.safetensors")
    for k, v in load_file(latest / "model.safetensors").items():
        torch.testing.assert_close(v, final[k], atol=0, rtol=0)


def test_cli_export_names_the_checkpoints_it_has(run_dir: Path, tmp_path: Path, capsys: Any) -> None:
    from rlzoo.cli import main

    assert main(["export", str(run_dir), "--step", "7", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 7" in err and "2, 3" in err
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_backend_without_export_hf_is_refused(tmp_path: Path) -> None:
    class NoExport:
        pass

    assert not isinstance(NoExport(), HFExportable)
    with pytest.raises(RlzooError, match="export_hf"):
        export_model(NoExport(), None, tmp_path / "out")


@pytest.mark.distributed
def test_fsdp2_export_is_the_gathered_model(tmp_path: Path) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend
    from rlzoo.kernel.settings import TrainSpec
    from rlzoo.models.tiny import build_tiny_qwen2

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    src = tmp_path / "base"
    _, tok = build_tiny_qwen2(src, seed=3)
    be = FSDP2TrainBackend(FSDP2Params(device="cpu"), TrainSpec(model_path=str(src)))
    try:
        with torch.no_grad():  # move the weights away from the base model's
            for p in be.actor.parameters():
                p.add_(0.01)
        out = export_model(be, src, tmp_path / "final", tokenizer=tok)
        batch = text_batch(tok)
        trainer_lp, _ = be.compute_log_probs(batch)
    finally:
        be.shutdown()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(hf_log_probs(model, batch), trainer_lp, atol=1e-5, rtol=0)
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tok.get_vocab()
    assert (out / "generation_config.json").is_file()


def test_vision_language_export_carries_the_processor(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoImageProcessor

    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.kernel.settings import TrainSpec
    from rlzoo.models.processor import load_processor
    from rlzoo.models.tiny import build_tiny_qwen2_5_vl

    src = tmp_path / "vl"
    _, processor = build_tiny_qwen2_5_vl(src)
    be = NativeTrainBackend(NativeTrainParams(device="cpu"), TrainSpec(model_path=str(src)))
    out = export_model(be, src, tmp_path / "final", tokenizer=processor.tokenizer, processor=processor)
    assert (out / "preprocessor_config.json").is_file() or (out / "processor_config.json").is_file()
    # AutoProcessor needs torchvision for Qwen's video processor; rlzoo's loader falls back to the
    # image-only processor exactly as it does for the source folder
    loaded = load_processor(str(out))
    assert type(loaded).__name__ == type(load_processor(str(src))).__name__
    from PIL import Image

    img = Image.new("RGB", (56, 56), (255, 0, 0))
    mine = AutoImageProcessor.from_pretrained(out)(images=[img], return_tensors="pt")
    theirs = processor.image_processor(images=[img], return_tensors="pt")
    torch.testing.assert_close(mine["pixel_values"], theirs["pixel_values"])
    assert loaded.tokenizer.get_vocab() == processor.tokenizer.get_vocab()
    assert AutoConfig.from_pretrained(out).model_type == AutoConfig.from_pretrained(src).model_type
    reloaded = type(be.actor).from_pretrained(out)
    theirs = be.actor.state_dict()
    for k, v in reloaded.state_dict().items():
        torch.testing.assert_close(v, theirs[k], atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# an export never deletes what is at --out (issue 23)
# ---------------------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_export_never_deletes_what_is_at_out(
    run_dir: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `--out DIR` deleted DIR's files (exit 0); `--out RUN` the run's own checkpoints;
    `--out .` crashed with "PosixPath('.') has an empty name"."""
    from rlzoo.cli import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    run_before = _tree(run_dir)
    for out in (mine, run_dir, run_dir.parent):
        assert main(["export", str(run_dir), "--out", str(out)]) == 2
        assert "already holds files rlzoo did not export there" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me" and _tree(run_dir) == run_before
    (tmp_path / "afile").write_text("x")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "afile")]) == 2
    assert "is a file" in capsys.readouterr().err
    monkeypatch.chdir(mine)
    assert main(["export", str(run_dir), "--out", "."]) == 2
    assert "is the current directory" in capsys.readouterr().err

    # a new folder, then again into it (an export of ours is replaced), then not once the user adds a file
    out = tmp_path / "model"
    assert main(["export", str(run_dir), "--step", "2", "--out", str(out)]) == 0
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert json.loads((out / "rlzoo_export.json").read_text())["step"] == 3
    (out / "README.md").write_text("my model card")
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    assert "README.md" in capsys.readouterr().err and (out / "README.md").read_text() == "my model card"
    assert not list(tmp_path.glob(".model.rlzoo-export-*"))  # no staging left behind
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", str(run_dir), "--out", str(empty)]) == 0


def test_exported_weights_are_readable_as_the_umask_allows(run_dir: Path) -> None:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    for f in (run_dir / "final").iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~mask, f


def test_a_kill_during_the_final_export_is_redone_by_the_resume(
    quickstart_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the last checkpoint was saved before the export, so a crash in the export left no
    final/ and the resume said "finished" at once."""
    import rlzoo.train.export
    from rlzoo.recipe.compose import build_run

    out = tmp_path / "run"
    common = [*QUIET, f"data.dir={quickstart_dir}", f"run.output_dir={out}", "trainer.save_freq=1"]
    real = rlzoo.train.export.check_hf_folder

    def crash(folder: Any) -> None:
        raise SystemExit("killed mid-export")

    monkeypatch.setattr(rlzoo.train.export, "check_hf_folder", crash)
    with pytest.raises(SystemExit):
        build_run("quickstart", [*common, "trainer.total_steps=2"]).train()
    assert not (out / "final").exists()
    monkeypatch.setattr(rlzoo.train.export, "check_hf_folder", real)
    summary = build_run(None, ["resume=latest", f"run.output_dir={out}"]).train()
    assert summary["start_step"] == 1 and summary["last_step"] == 2
    assert json.loads((out / "final" / "rlzoo_export.json").read_text())["step"] == 2
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_final_round_trips_in_plain_auto_tokenizer(run_dir: Path, quickstart_dir: Path) -> None:
    """The quickstart's ``final/`` in nothing but transformers: ``AutoTokenizer`` encodes every
    validation prompt (chat template applied) and the answers to the run's own token ids, and
    decodes them back; ``AutoModelForCausalLM`` loads it. Before: its tiny Qwen2 made transformers 5
    load the word-level tokenizer as Qwen2Tokenizer, which dropped words ("last" and "first")."""
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.tasks._quickstart import WORDS

    final = run_dir / "final"
    run_tok = load_tokenizer(load_run_config(run_dir).model.path)
    auto = AutoTokenizer.from_pretrained(final)
    rows = pq.read_table(quickstart_dir / "val.parquet").to_pylist()
    assert rows
    for row in rows:
        text = run_tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        assert auto.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) == text
        ids = run_tok(text)["input_ids"]
        assert run_tok.unk_token_id not in ids
        assert auto(text)["input_ids"] == ids, text
        answer = run_tok(row["reward_model"]["ground_truth"])["input_ids"]
        assert auto(row["reward_model"]["ground_truth"])["input_ids"] == answer
        assert auto.decode(ids, skip_special_tokens=True) == run_tok.decode(ids, skip_special_tokens=True)
    every_word = " ".join(WORDS)  # the task's whole vocabulary, "first" and "last" included
    assert auto(every_word)["input_ids"] == run_tok(every_word)["input_ids"]
    assert auto.decode(auto(every_word)["input_ids"]) == every_word
    assert "tokenizer" not in json.loads((final / "rlzoo_export.json").read_text())  # no warning due
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.vocab_size == len(auto)


def test_a_tokenizer_plain_autotokenizer_would_misread_is_flagged(tmp_path: Path) -> None:
    """A word-level tokenizer next to a Qwen2 config (the tiny recipes' models): transformers 5's
    AutoTokenizer loads it as Qwen2Tokenizer and loses words. Before: nothing said so (the
    quickstart's model, then a Qwen2, scored 0.0 instead of 0.42 with it). The export says how to
    load it, in its log and its record."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.kernel.settings import TrainSpec
    from rlzoo.models.tiny import build_tiny_qwen2

    src = tmp_path / "qwen2"
    _, run_tok = build_tiny_qwen2(src)
    be = NativeTrainBackend(NativeTrainParams(device="cpu"), TrainSpec(model_path=str(src)))
    final = export_model(be, src, tmp_path / "final", tokenizer=run_tok)
    text = "the x is 4 9"
    auto = AutoTokenizer.from_pretrained(final)
    assert auto(text)["input_ids"] != run_tok(text)["input_ids"]  # the transformers behaviour itself
    note = json.loads((final / "rlzoo_export.json").read_text())["tokenizer"]
    assert "PreTrainedTokenizerFast.from_pretrained(path)" in note and type(auto).__name__ in note
    assert PreTrainedTokenizerFast.from_pretrained(final)(text)["input_ids"] == run_tok(text)["input_ids"]


def test_a_file_the_user_edited_in_an_export_is_never_overwritten(
    run_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    """Issue 39, finding 10: an export of ours whose config.json the user then edited (same name, so
    listed in rlzoo_export.json). Before: the next export replaced it silently."""
    from rlzoo.cli import main

    out = tmp_path / "model"
    assert main(["export", str(run_dir), "--step", "2", "--out", str(out)]) == 0
    config = out / "config.json"
    edited = config.read_text().replace("{", '{\n  "my_note": "tuned by hand",', 1)
    config.write_text(edited)
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds files changed since rlzoo exported them (config.json)" in err
    assert config.read_text() == edited
    assert json.loads((out / "rlzoo_export.json").read_text())["step"] == 2
