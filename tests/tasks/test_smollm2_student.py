"""smollm2_arith_student: a fresh student of SmolLM2's architecture with fewer, narrower layers and the
teacher's tokenizer; its size by the Llama parameter count worked by hand; written once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlzoo.tasks.smollm2 import SmolLM2ArithStudentParams


def llama_params(v: int, h: int, layers: int, heads: int, kv: int, inner: int) -> int:
    """Parameters of a Llama with tied embeddings: embedding V*h; per layer q and o (h*h each), k and v
    (h * kv * h/heads each), gate / up / down (3*h*inner), two RMSNorm weights (2h); the final norm h."""
    head = h // heads
    per_layer = 2 * h * h + 2 * h * kv * head + 3 * h * inner + 2 * h
    return v * h + layers * per_layer + h


def test_default_student_is_19m_with_smollm2s_vocabulary() -> None:
    p = SmolLM2ArithStudentParams()
    n = llama_params(49152, p.hidden_size, p.num_layers, p.num_heads, p.num_kv_heads, p.intermediate_size)
    assert 10e6 <= n <= 30e6  # the 10-30M (18.88M: 12.58M of it the tied embedding)


def test_student_has_the_teachers_tokenizer_and_its_own_sizes(tmp_path: Path, gguf_file: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlzoo.tasks._smollm2 import prepare_arith_student

    params = SmolLM2ArithStudentParams(
        gguf_file=str(gguf_file),
        hidden_size=16,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=24,
    )
    files = prepare_arith_student(tmp_path, params)
    teacher_cfg = json.loads((files["model"] / "config.json").read_text())
    student = AutoModelForCausalLM.from_pretrained(files["student"])
    cfg = student.config
    assert (cfg.model_type, cfg.vocab_size, cfg.eos_token_id) == (
        teacher_cfg["model_type"],
        teacher_cfg["vocab_size"],
        teacher_cfg["eos_token_id"],
    )
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (16, 2, 2)
    want = llama_params(teacher_cfg["vocab_size"], 16, 2, 4, 2, 24)
    assert sum(t.numel() for t in student.parameters()) == want
    t_tok, s_tok = (
        AutoTokenizer.from_pretrained(files["model"]),
        AutoTokenizer.from_pretrained(files["student"]),
    )
    assert s_tok.get_vocab() == t_tok.get_vocab() and s_tok.chat_template == t_tok.chat_template
    before = (files["student"] / "model.safetensors").stat().st_mtime_ns
    prepare_arith_student(tmp_path, params)  # kept, not written again
    assert (files["student"] / "model.safetensors").stat().st_mtime_ns == before


def test_sizes_that_do_not_split_into_heads_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of num_heads"):
        SmolLM2ArithStudentParams(hidden_size=250, num_heads=4)
