"""Distillation in the training loop: the teacher on the train backend, its log-probs and divergence,
validate's rules, every runner, and a resume in the middle equal to an uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import rlzoo
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.errors import ConfigError
from rlzoo.recipe.config import load_config
from rlzoo.report.metrics import read_metrics

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def copy_model(src: Path, dst: Path, *, noise: float, seed: int) -> Path:
    """The quickstart model with its weights moved by ``noise`` (a teacher unlike the student), and
    the same tokenizer files."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    model.save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def teacher_dir(quickstart_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_model(quickstart_dir / "model", tmp_path_factory.mktemp("teacher"), noise=0.5, seed=1)


def overrides(tmp: Path, quickstart_dir: Path, teacher: Path, **kw: object) -> list[str]:
    base = {
        "data.dir": str(quickstart_dir),
        "run.output_dir": str(tmp / "run"),
        "run.loggers": "[jsonl]",
        "run.progress": "false",
        "algorithm.teacher.model": str(teacher),
        "trainer.total_steps": 2,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.val_before_train": "false",
        "data.train_batch_size": 8,
        "trainer.ppo_mini_batch_size": 4,
    }
    base.update(kw)
    return [f"{k}={v}" for k, v in base.items()]


# -- the teacher on the train backend ---------------------------------------------------------------
def test_teacher_log_probs_are_the_teacher_forward(quickstart_dir: Path, teacher_dir: Path) -> None:
    """compute_log_probs(model='teacher') on the chunked path equals log_softmax of the teacher's
    full logits at the sampled tokens (the published definition), and differs from the actor's."""
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.kernel.settings import MicroBatchSettings, TeacherModel, TrainSpec
    from rlzoo.testing.backends import padded_ids, response_logits

    spec = TrainSpec(
        model_path=str(quickstart_dir / "model"),
        teacher=TeacherModel(path=str(teacher_dir), dtype=None, trust_remote_code=False),
        micro_batch=MicroBatchSettings(log_prob_size=2, log_prob_chunk=3),
    )
    backend = NativeTrainBackend(NativeTrainParams(device="cpu"), spec)
    ids, attn = padded_ids([[3, 4, 5], [6, 7]], [[8, 9, 10, 11], [12]])
    T = 4
    batch = Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, -T:],
            "response_mask": attn[:, -T:].float(),
        }
    )
    got, _ = backend.compute_log_probs(batch, model="teacher")  # [B, T]
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    with torch.no_grad():
        logp = torch.log_softmax(response_logits(teacher, batch), -1)  # [B, T, V]
    want = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1) * batch["response_mask"]
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)
    actor, _ = backend.compute_log_probs(batch)
    assert not torch.allclose(actor, got)
    assert not any(p.requires_grad for p in backend.teacher.parameters())  # forward-only


def test_chunked_divergence_equals_unchunked() -> None:
    from rlzoo.algorithms.functional.distill import generalized_jsd
    from rlzoo.train_kit.logprobs import chunked_divergence

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 7, generator=g)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return generalized_jsd(a, b, beta=0.3, temperature=0.8)

    x1, x2 = s.clone().requires_grad_(True), s.clone().requires_grad_(True)
    w = torch.randn(3, 5, generator=g)
    (chunked_divergence(fn, x1, t, chunk_tokens=4) * w).sum().backward()
    (chunked_divergence(fn, x2, t, chunk_tokens=0) * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="another vocabulary size"):
        chunked_divergence(fn, s, t[..., :5])


# -- validate ----------------------------------------------------------------------------------------
def problems_of(*args: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config("quickstart", list(args))
    return list(e.value.problems)


def test_a_teacher_part_without_a_teacher_is_refused() -> None:
    (p,) = problems_of("algorithm.advantage=distill_reverse_kl")
    assert "algorithm.teacher" in p and "needs_teacher" in p
    (p,) = problems_of("algorithm.teacher_kl_coef=0.1")
    assert "algorithm.teacher" in p and "teacher_kl_coef" in p
    (p,) = problems_of("algorithm.policy_loss=gkd")
    assert "algorithm.teacher" in p and "needs_teacher_distribution" in p


def test_a_backend_without_the_teacher_is_refused(teacher_dir: Path) -> None:
    problems = problems_of(
        "algorithm.policy_loss=gkd", f"+algorithm.teacher.model={teacher_dir}", "trainer.backend=fsdp2"
    )
    assert any("supplies_teacher_divergence" in p and "native" in p for p in problems), problems
    problems = problems_of(
        "algorithm.advantage=distill_reverse_kl",
        f"+algorithm.teacher.model={teacher_dir}",
        "trainer.backend=simulated",
    )
    assert any("supports_teacher" in p and "'simulated'" in p and "megatron" in p for p in problems), problems


def test_validate_names_the_first_differing_token(
    quickstart_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(teacher_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    token, idx = sorted(vocab.items(), key=lambda kv: kv[1])[5]
    vocab["zzz"] = vocab.pop(token)  # id idx now spells zzz
    (other / "tokenizer.json").write_text(json.dumps(tok))
    problems = problems_of(
        f"data.dir={quickstart_dir}",
        "algorithm.advantage=distill_reverse_kl",
        f"+algorithm.teacher.model={other}",
    )
    (p,) = [p for p in problems if "tokenizer" in p]
    assert f"token id {idx} is {token!r} in the student's tokenizer but 'zzz' in the teacher's" in p
    # the same teacher with the student's tokenizer passes
    load_config(
        "quickstart",
        [
            f"data.dir={quickstart_dir}",
            "algorithm.advantage=distill_reverse_kl",
            f"+algorithm.teacher.model={teacher_dir}",
        ],
    )


# -- the trainer ---------------------------------------------------------------------------------------
class FakeBackend:
    """Log-probs -1 from the actor and -3 from the teacher on every position, masked or not."""

    def compute_log_probs(self, batch: Batch, *, model: str = "actor", **_: object):  # type: ignore[no-untyped-def]
        return torch.full(batch["response_mask"].shape, -3.0 if model == "teacher" else -1.0), None


def test_teacher_scores_only_trained_tokens(teacher_dir: Path) -> None:
    """A multi-turn trajectory's observation tokens (mask 0) get no teacher log-prob and no advantage."""
    from rlzoo.train.update import trainer_setup

    cfg = load_config(
        "quickstart", ["algorithm.advantage=distill_reverse_kl", f"+algorithm.teacher.model={teacher_dir}"]
    )
    trainer = trainer_setup(cfg).build(FakeBackend())
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0]])  # turn, observation, turn
    batch = Batch(
        {
            "response_mask": mask,
            "token_level_scores": torch.zeros(2, 5),
            "rollout_log_probs": torch.full((2, 5), -1.0),
            "group_ids": torch.tensor([0, 0]),
        }
    )
    m = trainer.prepare(batch, lambda _: _NullTimer())
    torch.testing.assert_close(batch["teacher_log_probs"], -3.0 * mask)
    # A = -(log pi_s - log pi_T) = -(-1 - -3) = -2 on the trained tokens, 0 elsewhere
    torch.testing.assert_close(batch["advantages"], -2.0 * mask)
    assert m["distill/reverse_kl"] == pytest.approx(2.0)


class _NullTimer:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


# -- runs ------------------------------------------------------------------------------------------------
RUNS = {
    "gkd": ["algorithm.policy_loss=gkd", "algorithm.policy_loss.beta=0.5"],
    "reverse_kl": ["algorithm.advantage=distill_reverse_kl", "algorithm.advantage.gamma=0.5"],
    "grpo+teacher_kl": ["algorithm.teacher_kl_coef=0.1"],
}


@pytest.mark.parametrize("objective", sorted(RUNS))
def test_resume_in_the_middle_equals_an_uninterrupted_run(
    objective: str, tmp_path: Path, quickstart_dir: Path, teacher_dir: Path
) -> None:
    extra = RUNS[objective]
    keys = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/loss")
    a = rlzoo.build_run(
        "quickstart",
        overrides(
            tmp_path / "a", quickstart_dir, teacher_dir, **{"trainer.total_steps": 4, "trainer.save_freq": 2}
        )
        + extra,
    )
    a.train()
    full = {r["step"]: r for r in read_metrics(a.run_dir)}
    b_dir = tmp_path / "b" / "run"
    shutil.copytree(a.run_dir / "checkpoints" / "step_2", b_dir / "checkpoints" / "step_2")
    (b_dir / "checkpoints" / "latest").write_text("step_2")
    b = rlzoo.build_run(
        "quickstart",
        overrides(tmp_path / "b", quickstart_dir, teacher_dir, **{"trainer.total_steps": 4, "resume": "true"})
        + extra,
    )
    b.train()
    resumed = {r["step"]: r for r in read_metrics(b.run_dir)}
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for k in keys:
            assert resumed[step][k] == pytest.approx(full[step][k], rel=1e-5, abs=1e-7), (step, k)
    if objective != "gkd":  # the teacher scored the samples in prepare
        assert "distill/reverse_kl" in full[3]
    if objective == "grpo+teacher_kl":
        assert "actor/teacher_kl_loss" in full[3]


@pytest.mark.parametrize("runner", ["one_step_off", "fully_async"])
def test_distillation_under_every_runner(
    runner: str, tmp_path: Path, quickstart_dir: Path, teacher_dir: Path
) -> None:
    """The teacher lives in the trainer's one loop: the async runners distill too (under fully_async the
    trainer's own weights give the student's log-probs of the samples, staleness counted as for RL)."""
    recipe = "quickstart_async" if runner == "fully_async" else "quickstart"
    extra = [] if runner == "fully_async" else [f"runner={runner}"]
    run = rlzoo.build_run(
        recipe,
        [
            *overrides(tmp_path, quickstart_dir, teacher_dir, **{"trainer.ppo_mini_batch_size": 4}),
            "algorithm.advantage=distill_reverse_kl",
            *extra,
        ],
    )
    run.train()
    rows = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert len(rows) == 2
    assert all(r["distill/reverse_kl"] == r["distill/reverse_kl"] for r in rows)  # present, not NaN


def test_multi_turn_distillation_runs(tmp_path: Path) -> None:
    """quickstart_tools (a model turn, the calc tool's reply, a model turn) distilled from a teacher
    equal to the student: the first step's reverse KL on the model's own tokens is exactly 0."""
    run = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            "run.loggers=[jsonl]",
            "run.progress=false",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.total_steps=2",
            "data.train_batch_size=4",
            "trainer.ppo_mini_batch_size=4",
            "algorithm.advantage=distill_reverse_kl",
            "+algorithm.teacher.model=${data.dir}/model",
        ],
    )
    run.train()
    rows = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert rows[0]["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-5)
    assert rows[1]["distill/reverse_kl"] != pytest.approx(0.0, abs=1e-7)  # the student moved


def test_a_teacher_nobody_reads_is_noted_and_not_loaded(teacher_dir: Path) -> None:
    from rlzoo.recipe.checks import check_notices
    from rlzoo.recipe.types import uses_teacher

    cfg = load_config("quickstart", [f"+algorithm.teacher.model={teacher_dir}"])
    assert not uses_teacher(cfg)
    assert any("algorithm.teacher: set, but no part reads it" in n for n in check_notices(cfg))
