"""Things Ray workers import by name in the tests (``distributed.helpers:...``)."""

from __future__ import annotations

import os
import time
from typing import Any


class SleepyBackend:
    """A fake train backend: ``compute_log_probs`` sleeps, ``compute_values`` raises."""

    def __init__(self, params: Any, spec: Any) -> None:
        self.version = 0
        self.rank = int(os.environ.get("RANK", "-1"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "-1"))

    def env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}

    def process(self) -> dict[str, Any]:
        """What the worker process runs with: torch's CPU threads."""
        import torch

        return {"threads": torch.get_num_threads()}

    def compute_log_probs(self, batch: Any, *, model: str = "actor", with_entropy: bool = False) -> Any:
        time.sleep(float(batch))
        return self.rank, None

    def compute_values(self, batch: Any) -> Any:
        raise ValueError(f"boom on rank {self.rank}")


class MeanLogProbObjective:
    """``loss = -mean(log_probs over response tokens)``: pushes up the sampled tokens."""

    needs_entropy = False

    def __call__(self, micro_batch: Any, log_probs: Any, entropy: Any) -> tuple[Any, dict[str, Any]]:
        mask = micro_batch["response_mask"].float()  # [b, T]
        loss = -(log_probs * mask).sum() / mask.sum().clamp(min=1.0)
        return loss, {"loss": float(loss.detach())}
