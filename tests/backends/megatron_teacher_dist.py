"""The teacher (``algorithm.teacher``) on the megatron train backend, in a 2-process gloo world (run
under torchrun by ``tests/backends/test_megatron_teacher.py``, which also calls the checks below in
one process).

    RLZOO_MEGATRON_LAYOUT=tp2 RLZOO_CONTRACT_DIR=/shared/dir \\
        torchrun --standalone --nproc_per_node=2 -m pytest -q tests/backends/megatron_teacher_dist.py

Not collected on its own (no ``test_`` prefix). Every rank runs the same checks in the same order
(SPMD); the tiny models are saved per rank (same seeds, the same weights).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rlzoo.testing.backends import _random_batch, save_tiny_qwen2

LAYOUTS: dict[str, dict[str, Any]] = {
    "tp1": {},
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
}
CPU = {"device": "cpu", "dtype": "float32", "use_distributed_optimizer": False}
ATOL = 1e-5  # fp32

pytestmark = pytest.mark.usefixtures("one_thread")


def save_models(root: Path) -> tuple[Path, Path]:
    """A tiny Qwen2 student and a larger teacher of other dims (hidden 64, 4 layers) with the same
    tokenizer: the teacher is converted with its own dims, not the student's."""
    student, teacher = root / "student", root / "teacher"
    if not student.exists():
        save_tiny_qwen2(student, seed=0)
    if not teacher.exists():
        save_tiny_qwen2(teacher, seed=1, hidden_size=64, num_hidden_layers=4)
    return student, teacher


def _spec(student: Path, teacher: Path) -> Any:
    from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TeacherModel, TrainSpec

    return TrainSpec(
        model_path=str(student),
        total_steps=10,
        temperature=0.9,
        optim=OptimSettings(lr=1e-2, grad_clip=0.0),
        micro_batch=MicroBatchSettings(log_prob_size=4, log_prob_chunk=3),
        teacher=TeacherModel(path=str(teacher), dtype=None, trust_remote_code=False),
    )


def native_log_probs(student: Path, teacher: Path, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The native train backend's (actor, teacher) log-probs of ``batch``: the reference numbers."""
    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams

    native = NativeTrainBackend(NativeTrainParams(device="cpu"), _spec(student, teacher))
    return native.compute_log_probs(batch)[0], native.compute_log_probs(batch, model="teacher")[0]


def megatron_backend(student: Path, teacher: Path, layout: str) -> Any:
    from rlzoo.backends.megatron import MegatronParams
    from rlzoo.backends.megatron.train import MegatronTrainBackend

    return MegatronTrainBackend(MegatronParams(**CPU, **LAYOUTS[layout]), _spec(student, teacher))


def teacher_log_probs_equal_native(root: Path, layout: str) -> None:
    """compute_log_probs(model='teacher') on megatron equals the native backend's teacher log-probs
    (fp32, ≤ 1e-5), differs from the actor's, and the teacher stays frozen and offloaded."""
    student, teacher = save_models(root)
    batch = _random_batch(3)
    want_actor, want_teacher = native_log_probs(student, teacher, batch)
    be = megatron_backend(student, teacher, layout)
    try:
        got = be.compute_log_probs(batch, model="teacher")[0]
        torch.testing.assert_close(got, want_teacher, atol=ATOL, rtol=0)
        actor = be.compute_log_probs(batch)[0]
        torch.testing.assert_close(actor, want_actor, atol=ATOL, rtol=0)
        assert not torch.allclose(got, actor, atol=1e-3)
        assert not any(p.requires_grad for p in be.teacher.parameters())  # forward-only
        assert all(p.device.type == "cpu" for p in be.teacher.parameters())  # ref_offload: between forwards
    finally:
        be.shutdown()


def distill_step_runs(root: Path, layout: str) -> None:
    """One distill_reverse_kl step of the trainer on megatron: the teacher's log-probs come from the
    backend, the advantage is -(log pi_student - log pi_teacher) on the trained tokens (gamma 0, by
    hand from the native backend's numbers), and the actor takes its optimizer step."""
    from rlzoo.kernel.batch import Batch
    from rlzoo.recipe.config import load_config
    from rlzoo.train.update import trainer_setup

    student, teacher = save_models(root)
    cfg = load_config(
        "quickstart",
        [
            f"model.path={student}",
            "algorithm.advantage=distill_reverse_kl",
            f"+algorithm.teacher.model={teacher}",
            "trainer.backend=megatron",
            "trainer.backend.device=cpu",
            "trainer.backend.dtype=float32",
            "rollout.n=2",
            "data.train_batch_size=3",
            "trainer.ppo_mini_batch_size=3",
        ],
    )
    b = _random_batch(4)
    mask = b["response_mask"]
    batch = Batch(
        {
            **{
                k: b[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
            },
            "token_level_scores": torch.zeros_like(mask),
            "rollout_log_probs": b["old_log_probs"],
            "group_ids": torch.arange(len(b)) // 2,
        }
    )
    want_actor, want_teacher = native_log_probs(student, teacher, batch)
    be = megatron_backend(student, teacher, layout)
    try:
        trainer = trainer_setup(cfg).build(be)
        m = trainer.step(batch, lambda _: contextlib.nullcontext())
        torch.testing.assert_close(batch["teacher_log_probs"], want_teacher * mask, atol=ATOL, rtol=0)
        torch.testing.assert_close(
            batch["advantages"], -(want_actor - want_teacher) * mask, atol=ATOL, rtol=0
        )
        kl = ((want_actor - want_teacher) * mask).sum() / mask.sum()
        assert m["distill/reverse_kl"] == pytest.approx(float(kl), abs=ATOL)
        assert be.version == 1 and m["actor/skipped_steps"] == 0
        assert not torch.allclose(be.compute_log_probs(batch)[0], want_actor, atol=1e-4)  # the actor moved
    finally:
        be.shutdown()


def _root() -> Path:
    return Path(os.environ["RLZOO_CONTRACT_DIR"]) / f"rank{os.environ.get('RANK', '0')}"


LAYOUT = os.environ.get("RLZOO_MEGATRON_LAYOUT", "tp2")


def test_teacher_log_probs_equal_native() -> None:
    teacher_log_probs_equal_native(_root(), LAYOUT)


def test_distill_step_runs() -> None:
    distill_step_runs(_root(), LAYOUT)
