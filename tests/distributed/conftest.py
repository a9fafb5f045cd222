"""One local Ray cluster for every Ray test of the session, and a tiny saved model."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from rlzoo.models.tiny import tiny_qwen2_config

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO = TESTS_DIR.parent
VOCAB = 96


@pytest.fixture(scope="session")
def ray_cluster() -> Any:
    """A 4-CPU local Ray cluster shared by all Ray tests (workers can import ``distributed.helpers``)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    path = os.pathsep.join([str(TESTS_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ray.init(
        num_cpus=4,
        num_gpus=0,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        },
    )
    yield ray
    ray.shutdown()


def free_cpus_after_release(ray: Any) -> float:
    """The cluster's free CPUs once the actors and bundles of earlier runs are released (Ray does it
    asynchronously): waits up to 20 s for all 4."""
    deadline = time.monotonic() + 20
    while ray.available_resources().get("CPU", 0.0) < 4.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return ray.available_resources().get("CPU", 0.0)


def ray_run_overrides(run_dir: Path, *extra: str) -> list[str]:
    """A quiet quickstart run on ``placement.name=ray`` writing to ``run_dir``, plus ``extra``."""
    return [
        "placement.name=ray",
        f"run.dir={run_dir}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        "trainer.val_before_train=false",
        *extra,
    ]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~100k-parameter random Qwen2 causal LM saved with ``save_pretrained`` (fp32)."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = tiny_qwen2_config(VOCAB, hidden_size=64, max_position_embeddings=256, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    path = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(str(path))
    return path
