"""The backend contract suites on a CUDA GPU for the backends that also run on CPU (native, fsdp2).

The CPU runs of the same suites are in ``tests/backends/test_contract.py`` (which also holds the
vllm and megatron CUDA classes). Marked ``gpu``; every numeric test skips with "needs a CUDA GPU"
elsewhere. ``benchmarks/gpu_check.py`` runs ``pytest -m gpu`` over both files.
"""

from __future__ import annotations

import pytest

from rlzoo.testing.backends import RolloutBackendContract, TrainBackendContract


@pytest.mark.gpu
class TestNativeRolloutCUDA(RolloutBackendContract):
    name = "native"
    needs_cuda = True
    spec_overrides = {"device": "cuda"}
    lp_atol = 1e-3  # CUDA kernels (fp32) vs the CPU reference forward


@pytest.mark.gpu
class TestNativeTrainCUDA(TrainBackendContract):
    name = "native"
    needs_cuda = True
    params_overrides = {"device": "cuda"}
    lp_atol = 1e-3
    update_atol = 1e-4


@pytest.mark.gpu
class TestFSDP2TrainCUDA(TestNativeTrainCUDA):
    name = "fsdp2"
