"""The train contract over the megatron backend in a 2-process gloo world (run under torchrun).

    RLZOO_MEGATRON_LAYOUT=tp2 RLZOO_CONTRACT_DIR=/shared/dir \\
        torchrun --standalone --nproc_per_node=2 -m pytest -q tests/backends/megatron_contract_dist.py

Not collected on its own (no ``test_`` prefix): ``tests/backends/test_megatron_cpu.py`` launches
it for ``tp2`` (tensor parallel 2) and ``pp2`` (pipeline parallel 2). Every rank runs the same
tests in the same order (SPMD: the backend's calls are collectives); the tiny model is saved per
rank, the checkpoint goes to the directory both ranks share.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlzoo.testing.backends import TrainBackendContract, save_tiny_qwen2

LAYOUTS = {
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "dp2": {"use_distributed_optimizer": True},  # data parallel 2, optimizer state sharded (ZeRO-1)
}


pytestmark = pytest.mark.usefixtures("one_thread")


class TestMegatronTrainDist(TrainBackendContract):
    name = "megatron"
    requires = ("megatron.core", "psutil")
    params_overrides = {
        "device": "cpu",
        "dtype": "float32",
        "use_distributed_optimizer": False,
        **LAYOUTS[os.environ.get("RLZOO_MEGATRON_LAYOUT", "tp2")],
    }
    lp_atol = 1e-4
    update_atol = 1e-5

    @property
    def _tmp(self) -> Path:  # type: ignore[override]
        return Path(os.environ["RLZOO_CONTRACT_DIR"])  # shared by the ranks (the checkpoint)

    def model_dir(self, seed: int = 0) -> Path:
        path = self._tmp / f"rank{os.environ.get('RANK', '0')}" / f"qwen2-{seed}"
        if not path.exists():
            save_tiny_qwen2(path, seed=seed, tie=self.tie_word_embeddings)
        return path
