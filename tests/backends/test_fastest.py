"""The fastest-settings chooser (rlzoo.train_kit.fastest): micro-batch sizes from memory, bf16 from CPU flags.

Expected sizes are computed by hand from the memory model in the module docstring:
fixed = 20 B x params + 1 GiB + 3 x chunk x vocab x 4 B, per token = 20 x layers x hidden x 4 B,
the update may use 3/4 of the available memory.
"""

from __future__ import annotations

import json

import pytest

from rlzoo.system.machine import available_memory_bytes, cpu_bf16_flags
from rlzoo.train_kit import fastest
from rlzoo.train_kit.fastest import ModelShape, choose_bf16, choose_micro_batch, model_shape, resolve_autocast

GIB = 1024**3
# 100M params, 10 layers of width 1000, vocab 1000:
# fixed = 2e9 + 1,073,741,824 + 3,072,000 = 3,076,813,824 B; per token 960,000 B (24 floats x 10 x 1000 x 4 B)
SHAPE = ModelShape(params=100_000_000, layers=10, hidden=1000, vocab=1000)


def test_micro_batch_is_the_largest_power_of_two_that_fits() -> None:
    # 16 GiB: budget 12,884,901,888 B, 9,808,088,064 B beside the fixed part
    # 100 tokens a sample = 96 MB -> 102.2 samples fit -> 64; log-prob passes 2 x 64 capped at the 64 rows
    c = choose_micro_batch(16 * GIB, SHAPE, seq_len=100, rows=64)
    assert (c.size, c.log_prob_size) == (64, 64)
    # 400 tokens a sample = 384 MB -> 25.5 fit -> 16; log-prob 32
    c = choose_micro_batch(16 * GIB, SHAPE, seq_len=400, rows=64)
    assert (c.size, c.log_prob_size) == (16, 32)
    assert "16.0 GiB available" in c.reason and "100M params" in c.reason


def test_smollm2_at_256_new_tokens_on_a_24_gb_machine_takes_16_rows() -> None:
    """The measured point (docs/performance.md): SmolLM2-135M, 64 + 256 tokens, 22.6 GiB available.
    32 rows peaked at 19.8 GB, over TRL's 13.0 GB, and were no faster than 16 rows (10.8 GB); the model
    of 20 floats a token chose 32."""
    smollm2 = ModelShape(params=134_515_008, layers=30, hidden=576, vocab=49_152)
    c = choose_micro_batch(int(22.6 * GIB), smollm2, seq_len=320, rows=64)
    assert (c.size, c.log_prob_size) == (16, 32)


def test_micro_batch_is_capped_at_the_mini_batch_and_floored_at_one() -> None:
    c = choose_micro_batch(16 * GIB, SHAPE, seq_len=100, rows=8)  # 102.2 fit, 8 rows
    assert (c.size, c.log_prob_size) == (8, 8) and "capped" in c.reason
    c = choose_micro_batch(3 * GIB, SHAPE, seq_len=100, rows=64)  # budget 2.25 GiB < fixed 2.87 GiB
    assert (c.size, c.log_prob_size) == (1, 2) and "exceeds" in c.reason


def test_micro_batch_falls_back_when_memory_or_model_is_unknown() -> None:
    assert (
        choose_micro_batch(None, SHAPE, 100, 64).size,
        choose_micro_batch(None, SHAPE, 100, 64).log_prob_size,
    ) == (4, 8)
    c = choose_micro_batch(16 * GIB, None, 100, 64)
    assert (c.size, c.log_prob_size) == (4, 8) and "unknown" in c.reason


def test_model_shape_counts_smollm2_135m(tmp_path) -> None:
    # SmolLM2-135M's config: 30 layers, width 576, MLP 1536, 9 heads / 3 KV heads of 64, vocab 49,152, tied
    cfg = {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = model_shape(str(tmp_path))
    # per layer: q, o 2 x 576 x 576 + k, v 2 x 576 x 192 + MLP 3 x 576 x 1536 = 3,538,944; 30 layers
    # = 106,168,320 + embeddings 49,152 x 576 = 28,311,552 -> 134,479,872 (the published 135M)
    assert shape == ModelShape(params=134_479_872, layers=30, hidden=576, vocab=49152)
    assert model_shape(str(tmp_path / "missing")) is None


def test_machine_facts_parse_proc_files() -> None:
    assert available_memory_bytes("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2048 * 1024
    assert available_memory_bytes("MemTotal: 100 kB\n") is None
    flags = "processor: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n"
    assert cpu_bf16_flags(flags) == ("avx512_bf16",)
    assert cpu_bf16_flags("flags : fpu sse avx2\n") == ()


def test_bf16_only_where_the_device_has_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert choose_bf16("cpu", ("amx_bf16",)) == (True, "the CPU has amx_bf16")
    assert choose_bf16("cpu", ())[0] is False
    assert choose_bf16("cuda:0", ())[0] is True
    assert resolve_autocast(None, "cpu") is False and resolve_autocast("bfloat16", "cpu") is True
    assert capsys.readouterr().out == ""  # explicit settings: nothing chosen, nothing printed


def _recipe(tmp_path, *overrides: str):
    from rlzoo.recipe.config import load_config

    cfg = {
        "hidden_size": 1000,
        "num_hidden_layers": 10,
        "vocab_size": 1000,
        "intermediate_size": 3950,
        "num_attention_heads": 10,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_config(
        "quickstart",
        [
            f"model.path={tmp_path}",
            "model.device=cpu",
            "data.max_prompt_length=36",
            "data.max_response_length=64",
            "data.train_batch_size=8",
            "rollout.n=8",
            "trainer.ppo_mini_batch_size=8",
            *overrides,
        ],
    )


def test_run_start_chooses_prints_and_explicit_wins(tmp_path, monkeypatch, capsys) -> None:
    from rlzoo.train.inputs import micro_batch_settings

    monkeypatch.setattr(fastest, "available_memory_bytes", lambda: 8 * GIB)
    # this config.json: 10 x (4 x 1000^2 + 3 x 1000 x 3950) + 1000^2 = 159.5M params ->
    # fixed 3,190,000,000 + 1,073,741,824 + 3,072,000 = 4,266,813,824; 100 tokens = 80 MB a sample;
    # (6,442,450,944 - 4,266,813,824) / 80e6 = 27.2 -> 16 of the 64 rows; log-prob 32
    mb = micro_batch_settings(_recipe(tmp_path))
    assert (mb.size, mb.log_prob_size) == (16, 32)
    out = capsys.readouterr().out
    assert "rlzoo: trainer.micro_batch: size 16, log_prob_size 32 -- chosen: 8.0 GiB available" in out
    mb = micro_batch_settings(_recipe(tmp_path, "trainer.micro_batch.size=3"))
    assert (mb.size, mb.log_prob_size) == (3, 32)  # the set one wins, the other is still chosen
    assert "size 3 (set)" in capsys.readouterr().out
    mb = micro_batch_settings(
        _recipe(tmp_path, "trainer.micro_batch.size=3", "trainer.micro_batch.log_prob_size=5")
    )
    assert (mb.size, mb.log_prob_size) == (3, 5)
    assert capsys.readouterr().out == ""  # both set: nothing chosen
