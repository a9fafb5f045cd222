"""The teacher on a rollout engine (``algorithm.teacher.backend: rollout``): the trainer takes the
teacher's log-probs from the engine's prompt log-probs, and validate's rules for it. The engine
itself (vLLM) is checked in the vLLM venv (tests/backends/test_vllm_real.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.protocols import PromptLogProbSource
from rlzoo.recipe.config import load_config
from rlzoo.testing.backends import make_train_batch, save_tiny_qwen2


class HFPromptLogProbs:
    """A PromptLogProbSource over a HF causal LM: each sequence alone, unpadded, from position 0
    (what an engine sees), ``log_softmax`` of the full logits at each position."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.calls: list[tuple[list[list[int]], list[int]]] = []

    def prompt_log_probs(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> list[list[float]]:
        self.calls.append(([list(s) for s in sequences], list(starts)))
        out = []
        for seq, start in zip(sequences, starts):
            ids = torch.tensor([list(seq)])  # [1, L]
            with torch.no_grad():
                logp = torch.log_softmax(self.model(input_ids=ids).logits[0].double(), -1)  # [L, V]
            out.append([float(logp[j - 1, seq[j]]) for j in range(start, len(seq))])
        return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("engine-teacher")
    return save_tiny_qwen2(d / "student", seed=0), save_tiny_qwen2(d / "teacher", seed=1)


def test_the_engines_log_probs_land_where_the_train_backends_do(models: tuple[Path, Path]) -> None:
    """A batch in rlzoo's layout (left-padded prompts, right-padded responses, a row without a
    response) scored by an engine gives what the native train backend's teacher gives (temperature
    1, fp32, ≤ 1e-5); the engine sees each row's real tokens and the response's start."""
    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.kernel.settings import TeacherModel, TrainSpec
    from rlzoo.train.update import engine_teacher_log_probs

    student, teacher = models
    prompts, responses = [[3, 4, 5], [6, 7], [8]], [[9, 10, 11, 12], [13], []]
    batch = make_train_batch(prompts, responses)
    source = HFPromptLogProbs(teacher)
    assert isinstance(source, PromptLogProbSource)
    got = engine_teacher_log_probs(source, batch)  # [B, T]
    spec = TrainSpec(
        model_path=str(student), teacher=TeacherModel(path=str(teacher), dtype=None, trust_remote_code=False)
    )
    native = NativeTrainBackend(NativeTrainParams(device="cpu"), spec)
    want, _ = native.compute_log_probs(batch, model="teacher")
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)
    assert source.calls == [([[3, 4, 5, 9, 10, 11, 12], [6, 7, 13]], [3, 2])]  # the empty row: not sent
    assert got[2].abs().sum() == 0


class ActorOnly:
    """A train backend without a teacher: log-probs -1 from the actor; asked for the teacher, it fails."""

    def compute_log_probs(self, batch: Batch, *, model: str = "actor", **_: object):  # type: ignore[no-untyped-def]
        assert model == "actor", "the train backend was asked for the teacher"
        return torch.full(batch["response_mask"].shape, -1.0), None


class Constant:
    def prompt_log_probs(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> list[list[float]]:
        return [[-3.0] * (len(s) - st) for s, st in zip(sequences, starts)]


def test_the_trainer_asks_the_engine_not_the_train_backend(models: tuple[Path, Path]) -> None:
    from rlzoo.train.update import trainer_setup

    student, teacher = models
    cfg = load_config(
        "quickstart",
        [
            f"model.path={student}",
            "algorithm.advantage=distill_reverse_kl",
            f"+algorithm.teacher.model={teacher}",
        ],
    )
    trainer = trainer_setup(cfg).build(ActorOnly(), teacher=Constant())  # what the session passes
    b = make_train_batch([[3, 4], [5]], [[6, 7, 8], [9]])
    mask = b["response_mask"]
    batch = Batch(
        {
            **{
                k: b[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
            },
            "token_level_scores": torch.zeros_like(mask),
            "rollout_log_probs": -mask,
            "group_ids": torch.tensor([0, 0]),
        }
    )
    m = trainer.prepare(batch, lambda _: contextlib.nullcontext())
    torch.testing.assert_close(batch["teacher_log_probs"], -3.0 * mask)
    torch.testing.assert_close(batch["advantages"], -2.0 * mask)  # -(-1 - -3) on the trained tokens
    assert m["distill/reverse_kl"] == pytest.approx(2.0)


# -- validate ------------------------------------------------------------------------------------------
def problems_of(*args: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config("quickstart", list(args))
    return [p for p in e.value.problems if "teacher" in p]


def test_validate_refuses_what_an_engine_teacher_cannot_serve(models: tuple[Path, Path]) -> None:
    student, teacher = models
    base = (
        f"model.path={student}",
        f"+algorithm.teacher.model={teacher}",
        "algorithm.teacher.backend=rollout",
    )
    # a rollout backend without prompt log-probs: the ones with them are named
    (p,) = problems_of(*base, "algorithm.advantage=distill_reverse_kl")
    assert "'native'" in p and "supplies_prompt_log_probs" in p and "vllm" in p
    # gkd reads the whole distribution: refused by name
    (p,) = problems_of(*base, "rollout.backend=vllm", "algorithm.policy_loss=gkd")
    assert "'gkd'" in p and "needs_teacher_distribution" in p and "distill_reverse_kl" in p
    # the prompt log-probs are at temperature 1
    (p,) = problems_of(
        *base, "rollout.backend=vllm", "algorithm.teacher_kl_coef=0.1", "rollout.temperature=0.7"
    )
    assert "rollout.temperature is 0.7" in p
    # the engine lives in the trainer's process
    problems = problems_of(
        *base, "rollout.backend=vllm", "algorithm.teacher_kl_coef=0.1", "placement.name=ray"
    )
    assert any("placement 'ray'" in p for p in problems), problems


def test_an_engine_teacher_is_not_loaded_by_the_train_backend(models: tuple[Path, Path]) -> None:
    """train_spec has no teacher (the train backend loads none, and its supports_teacher is not
    asked); the teacher's engine spec is the rollout engine's with the teacher's folder."""
    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.train.inputs import rollout_spec, teacher_rollout_spec, train_spec

    student, teacher = models
    cfg = load_config(
        "quickstart",
        [
            f"model.path={student}",
            "algorithm.advantage=distill_reverse_kl",
            f"+algorithm.teacher.model={teacher}",
        ],
    )
    tok = load_tokenizer(str(student))
    assert (
        train_spec(cfg, 2, tok, announce=False).teacher is not None and teacher_rollout_spec(cfg, tok) is None
    )
    # backend: rollout (set after validate: vLLM, the one rollout backend that scores, is not installed here)
    cfg.algorithm.teacher = dataclasses.replace(cfg.algorithm.teacher, backend="rollout")
    assert train_spec(cfg, 2, tok, announce=False).teacher is None
    spec, engine = rollout_spec(cfg, tok), teacher_rollout_spec(cfg, tok)
    assert engine is not None and engine.model_path == str(teacher) and spec.model_path == str(student)
    assert engine.max_response_length == spec.max_response_length + 1  # room for the generated token
