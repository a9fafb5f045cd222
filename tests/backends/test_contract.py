"""The backend contract suites (:mod:`rlzoo.testing.backends`) over every built-in backend.

CPU backends (native, fsdp2 in a one-process gloo group) run the whole contract here and in CI.
The GPU backends' registration checks run everywhere; their numeric tests skip with a reason
("vllm not installed", "megatron not installed", "needs a CUDA GPU") unless both the package and a
CUDA GPU are present.
"""

from __future__ import annotations

import importlib.util

import pytest

from rlzoo.testing.backends import RolloutBackendContract, TrainBackendContract


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matmuls gain nothing from threads, and intra-op threads thrash on a busy CPU."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# -- rollout ------------------------------------------------------------------------------------
class TestNativeRollout(RolloutBackendContract):
    name = "native"


@pytest.mark.gpu
class TestVLLMRollout(RolloutBackendContract):
    name = "vllm"
    requires = ("vllm",)
    needs_cuda = True
    spec_overrides = {"device": "cuda"}
    params_overrides = {"gpu_memory_utilization": 0.3, "enforce_eager": True, "dtype": "float32"}
    lp_atol = 2e-3  # vLLM's kernels (fp32 here) differ from eager HF in the last bits


# -- training -----------------------------------------------------------------------------------
class TestNativeTrain(TrainBackendContract):
    name = "native"
    params_overrides = {"device": "cpu"}


@pytest.mark.skipif(importlib.util.find_spec("torch.distributed.fsdp") is None, reason="torch without FSDP2")
class TestFSDP2Train(TrainBackendContract):
    name = "fsdp2"
    params_overrides = {"device": "cpu"}


@pytest.mark.gpu
class TestMegatronTrain(TrainBackendContract):
    name = "megatron"
    requires = ("megatron.core",)
    needs_cuda = True
    params_overrides = {"dtype": "float32", "use_distributed_optimizer": False}
    lp_atol = 1e-3
    update_atol = 1e-4
