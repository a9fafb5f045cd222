"""Fixtures shared by tests/train and tests/sources (the quickstart data: tests/conftest.py): a plugin manager
with the built-in plugins (the simulated backends among them)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from rlzoo.kernel.plugins import PluginManager

#: overrides shared by every runner test: quiet, fast, no validation before training
QUIET = ["run.progress=false", "run.loggers=[jsonl]", "trainer.val_before_train=false"]


@pytest.fixture(scope="session")
def pm() -> PluginManager:
    """A plugin manager with the built-ins only (the ``simulated`` backends among them)."""
    return PluginManager(load_entrypoints=False)


def overrides(quickstart_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [f"data.dir={quickstart_dir}", f"run.output_dir={run_dir}", *QUIET, *extra]


def build(
    pm: PluginManager, recipe: str, quickstart_dir: Path, run_dir: Path, *extra: str, **objects: Any
) -> Any:
    import rlzoo

    return rlzoo.build_run(recipe, overrides(quickstart_dir, run_dir, *extra), pm=pm, **objects)


def as_rollout(b: Any, log_probs: Any, scores: Any, g: Any, meta: dict[str, Any] | None = None) -> Any:
    """Train batch ``b`` (8 rows) as a rollout hands it to the trainer: its tokens and masks, the
    engine's log-probs (``log_probs`` plus noise of 0.05 from ``g``, as bf16 / kernels make them
    differ from the trainer's), ``scores`` per token, groups of 4."""
    import torch

    from rlzoo.kernel.batch import Batch

    mask = b["response_mask"]
    return Batch(
        {
            "input_ids": b["input_ids"],
            "attention_mask": b["attention_mask"],
            "position_ids": b["position_ids"],
            "responses": b["responses"],
            "response_mask": mask,
            "rollout_log_probs": (log_probs + 0.05 * torch.randn(log_probs.shape, generator=g)) * mask,
            "token_level_scores": scores,
            "group_ids": torch.arange(8) // 4,
        },
        meta or {},
    )


def default_sigint() -> None:
    """In the child before exec: SIGINT handled by default and unblocked, as a shell's job has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
