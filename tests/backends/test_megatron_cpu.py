"""The megatron train backend on CPU against the real megatron-core (gloo group, ``device: cpu``).

One process (TP=1) runs the whole train contract (:class:`~rlzoo.testing.backends.TrainBackendContract`)
in this process; TP=2 and PP=2 run it in two gloo processes (``tests/backends/megatron_worker.py``
under ``torchrun --nproc_per_node=2``). Skipped with a reason when megatron-core is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from rlzoo.testing.backends import TrainBackendContract

HAVE_MCORE = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class TestMegatronTrainCPU(TrainBackendContract):
    name = "megatron"
    requires = ("megatron.core", "psutil")
    params_overrides = {"device": "cpu", "dtype": "float32", "use_distributed_optimizer": False}
    lp_atol = 1e-4
    update_atol = 1e-5
