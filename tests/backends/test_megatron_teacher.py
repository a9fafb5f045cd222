"""The teacher (``algorithm.teacher``) on the megatron train backend against the real megatron-core
(gloo, ``device: cpu``): its log-probs equal the native backend's, and a distill_reverse_kl step
runs; in this process (TP=1) and in two gloo processes (TP=2, PP=2) under torchrun. Skipped with a
reason when megatron-core is not installed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from .conftest import torchrun
from .megatron_teacher_dist import distill_step_runs, teacher_log_probs_equal_native

HAVE_MCORE = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed"),
]


def test_teacher_log_probs_equal_native(tmp_path: Path) -> None:
    teacher_log_probs_equal_native(tmp_path, "tp1")


def test_distill_reverse_kl_step_runs(tmp_path: Path) -> None:
    distill_step_runs(tmp_path, "tp1")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_teacher_in_two_processes(layout: str, tmp_path: Path) -> None:
    module = Path(__file__).with_name("megatron_teacher_dist.py")
    out = torchrun(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore",
        str(module),
        timeout=600,
        what=f"{layout}: torchrun",
        RLZOO_MEGATRON_LAYOUT=layout,
        RLZOO_CONTRACT_DIR=str(tmp_path),
    )
    assert re.findall(r"(\d+) passed", out) == ["2", "2"], out[-3000:]  # both ranks, both checks


def test_gkd_is_refused_on_megatron_by_name(tmp_path: Path) -> None:
    """megatron loads a teacher (supports_teacher) but does not compute gkd's whole-vocabulary
    divergence in its update (no supplies_teacher_divergence): validate names the loss and the way out."""
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.recipe.config import load_config

    from .megatron_teacher_dist import save_models

    student, teacher = save_models(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config(
            "quickstart",
            [
                f"model.path={student}",
                "algorithm.policy_loss=gkd",
                f"+algorithm.teacher.model={teacher}",
                "trainer.backend=megatron",
                "trainer.backend.device=cpu",
                "trainer.backend.dtype=float32",
            ],
        )
    (p,) = [p for p in e.value.problems if "teacher" in p]
    assert "'gkd'" in p and "'megatron'" in p and "supplies_teacher_divergence" in p and "native" in p
    assert "distill_reverse_kl" in p
