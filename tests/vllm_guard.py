"""Whether vLLM runs here: ``VLLM_ERROR`` is None when ``vllm`` imports (on its CPU platform), else
the reason, for a module's ``pytestmark = pytest.mark.skipif(VLLM_ERROR is not None, ...)``."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vllm is imported: its CPU platform

VLLM_ERROR: str | None
try:
    import vllm  # noqa: F401

    VLLM_ERROR = None
except Exception as e:  # ImportError, or a CUDA-built torchvision / torchcodec failing to load
    VLLM_ERROR = f"vllm not importable: {type(e).__name__}: {e}"
