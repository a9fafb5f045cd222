"""``NativeRolloutBackend``: the :class:`~rlzoo.kernel.protocols.RolloutBackend` of the native engine.

A thin shell over :class:`rlzoo.backends.native.engine.NativeEngine`: it loads the model named by the
:class:`~rlzoo.kernel.settings.RolloutSpec` (or takes an already built ``nn.Module``, for tests and for
colocation with a trainer), builds the engine and, with ``background_thread``, starts its loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from rlzoo.backends.native.engine import NativeEngine
from rlzoo.backends.native.rollout_params import NativeRolloutParams
from rlzoo.kernel.protocols import GenerationRequest, Sample
from rlzoo.kernel.settings import RolloutSpec

__all__ = ["NativeRolloutBackend", "load_causal_lm"]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def load_causal_lm(spec: RolloutSpec, attn_implementation: str | None = None) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(spec.model_path)`` in ``spec.dtype`` on ``spec.device``.

    A vision-language model (its config has a ``vision_config``, e.g. Qwen2.5-VL) is loaded with
    ``AutoModelForImageTextToText``; the engine then takes images through
    :mod:`rlzoo.backends.native.multimodal`.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    from rlzoo.models.processor import has_vision_config

    if spec.dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {spec.dtype!r}; choose one of {sorted(_DTYPES)}")
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    kw: dict[str, Any] = {dtype_kw: _DTYPES[spec.dtype], "trust_remote_code": spec.trust_remote_code}
    if attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    auto: Any = AutoModelForCausalLM
    if has_vision_config(spec.model_path, spec.trust_remote_code):
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText
    model: nn.Module = auto.from_pretrained(spec.model_path, **kw)
    return model.to(spec.device).eval()


class NativeRolloutBackend:
    """Rollout backend on the native continuous-batching engine (see :class:`NativeRolloutParams`).

    Semantics the runners rely on:

    - ``submit(requests)``: thread-safe, returns at once; ``sampling.n`` samples per request.
    - ``stream(timeout)``: yields every finished sample exactly once, as it finishes; ends when all
      submitted samples were yielded or after ``timeout`` seconds without one.
    - ``generate(requests)``: blocking; the requests' samples in request order, then index.
    - ``pause()`` returns once no step is running; in-flight sequences keep their tokens.
      ``resume()`` continues them. ``update_weights(named_tensors, version)`` lands between two
      steps (paused or not); tokens sampled afterwards carry ``version`` in ``Sample.versions``, and
      the in-flight KV is recomputed with the new weights (``recompute_kv_on_update``). With
      ``spec.lora`` the model runs the same LoRA adapters as the trainer (injected in place, B = 0
      until the first push) and a push carries the adapter tensors only.
    - ``num_pending()``: samples submitted and not yet handed out by stream / generate.
    - ``abort(request_ids=None)``: finish sequences now with finish reason ``"abort"``.
    """

    def __init__(
        self, params: NativeRolloutParams, spec: RolloutSpec, *, model: nn.Module | None = None
    ) -> None:
        self.params = params
        self.spec = spec
        if model is None:
            model = load_causal_lm(spec, params.attn_implementation)
        if spec.lora is not None:  # pushes carry the trainer's adapter tensors: run the same adapters
            from rlzoo.train_kit.lora import apply_lora

            device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
            apply_lora(model, spec.lora)
            model = model.to(device=device, dtype=dtype).eval()
        self.engine = NativeEngine(
            model,
            eos_token_ids=spec.eos_token_ids,
            pad_token_id=spec.pad_token_id,
            max_num_seqs=params.max_num_seqs,
            max_prefill_tokens=params.max_prefill_tokens,
            seed=spec.seed,
            max_response_length=spec.max_response_length,
            max_prompt_length=spec.max_prompt_length,
            recompute_kv_on_update=params.recompute_kv_on_update,
            use_kv_cache=params.use_kv_cache,
            record_routes=params.record_routes,
        )
        if params.background_thread:
            self.engine.start()

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def model(self) -> nn.Module:
        return self.engine.model

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self.engine.submit(requests)

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        return self.engine.stream(timeout)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        return self.engine.generate(requests)

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def abort(self, request_ids: Iterable[str] | None = None) -> int:
        return self.engine.abort(request_ids)

    def num_pending(self) -> int:
        return self.engine.num_pending()

    def shutdown(self) -> None:
        self.engine.shutdown()
