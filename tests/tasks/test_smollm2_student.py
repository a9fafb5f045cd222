"""smollm2_arith_student: a fresh student of SmolLM2's architecture with fewer, narrower layers and the
teacher's tokenizer; its size by the Llama parameter count worked by hand; written once."""

from __future__ import annotations

import dataclasses
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


def _row(a: int, b: int, i: int) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"index": i},
    }


def test_demonstrations_keep_the_rows_with_a_right_finished_answer() -> None:
    """By hand: of three questions the teacher finished 2 + 3 right, finished 1 + 1 wrong, ran out of
    tokens on 4 + 4 with the right last number; only 2 + 3's rows (both, in order) get a response, its
    text cut at the stop token."""
    from rlzoo.tasks._smollm2 import demonstration_rows, right_answers

    distinct = [_row(2, 3, 0), _row(1, 1, 1), _row(4, 4, 2)]
    results = [
        {"index": 0, "responses": ["2 + 3 = 5<|im_end|>"], "finish_reason": ["stop"], "correct": [True]},
        {"index": 1, "responses": ["1 + 1 = 3<|im_end|>"], "finish_reason": ["stop"], "correct": [False]},
        {"index": 2, "responses": ["To find 4 + 4 we get 8"], "finish_reason": ["length"], "correct": [True]},
    ]
    answers = right_answers(results, distinct, "<|im_end|>")
    assert list(answers.values()) == ["2 + 3 = 5"]
    rows = [_row(2, 3, 0), _row(1, 1, 1), _row(2, 3, 2), _row(4, 4, 3)]
    demos = demonstration_rows(rows, answers)
    assert [(d["extra_info"]["index"], d["response"]) for d in demos] == [(0, "2 + 3 = 5"), (2, "2 + 3 = 5")]


def test_teacher_answers_from_rlzoo_eval_of_the_questions(tmp_path: Path, gguf_file: Path) -> None:
    """The tiny random model as the teacher: ``train_questions.parquet`` holds each training question
    once; ``rlzoo eval`` with :data:`EVAL_OVERRIDES` (the rollout backend) answers each once; none is
    right, and the preparation says so instead of writing an empty file. Without the answers' folder,
    the error gives the eval command."""
    import pyarrow.parquet as pq

    from rlzoo.kernel.errors import RlzooError
    from rlzoo.tasks._smollm2 import EVAL_OVERRIDES, QUESTIONS, TEACHER_DEMOS, prepare_arith_student
    from rlzoo.train.evaluate import EvalSettings, evaluate

    base = SmolLM2ArithStudentParams(
        gguf_file=str(gguf_file),
        **{"hidden_size": 16, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 24},
        max_operand=3,
        val_size=2,
        train_size=12,
    )
    files = prepare_arith_student(tmp_path, base)
    train = [r["prompt"][0]["content"] for r in pq.read_table(files["train"]).to_pylist()]
    questions = [r["prompt"][0]["content"] for r in pq.read_table(tmp_path / QUESTIONS).to_pylist()]
    assert questions == list(dict.fromkeys(train))  # each once, in the order of first appearance
    answers = tmp_path / "answers"
    with_answers = dataclasses.replace(base, teacher_answers=str(answers))
    with pytest.raises(RlzooError, match=r"rlzoo eval TEACHER --recipe grpo_smollm2_arith --split train"):
        prepare_arith_student(tmp_path, with_answers)
    settings = EvalSettings(
        n=1, temperature=0.0, seed=0, threshold=1.0, limit=None, batch=64, bootstrap=10, level=0.95
    )
    over = [o.format(questions=tmp_path / QUESTIONS) for o in EVAL_OVERRIDES]
    evaluate(
        [str(files["model"])],
        settings,
        out=answers,
        recipe="grpo_smollm2_arith",
        overrides=over,
        split="train",
        progress=False,
    )
    results = pq.read_table(answers / "results.parquet").to_pylist()
    assert sorted(r["index"] for r in results) == list(range(len(questions)))
    with pytest.raises(RlzooError, match=rf"answered none of the {len(questions)} training questions right"):
        prepare_arith_student(tmp_path, with_answers)
    assert not (tmp_path / TEACHER_DEMOS).exists()
