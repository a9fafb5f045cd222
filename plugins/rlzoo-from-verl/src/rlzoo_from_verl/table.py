"""The verl -> rlzoo mapping: one data table (:data:`TABLE`), verl's defaults where rlzoo's differ
(:data:`VERL_DEFAULTS`) and verl's entry points (:data:`ENTRY_POINTS`). docs/from-verl.md shows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


# ---------------------------------------------------------------------------------------------
# the rules
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class To:
    """Set one rlzoo key (``how`` turns the verl value into the rlzoo one)."""

    key: str
    how: Callable[[Any], Any] | None = None
    note: str = ""
    note_for: Callable[[Any], str] | None = None  # a note that depends on the value (printed with it)


@dataclass(frozen=True)
class Skip:
    """No rlzoo setting is needed: the reason is printed. With ``when``, only for values it accepts;
    any other value is refused with ``otherwise`` (the feature rlzoo lacks, named plainly)."""

    why: str
    when: Callable[[Any], bool] | None = None
    otherwise: str = ""


@dataclass(frozen=True)
class Manual:
    """Has an effect rlzoo has no key for: printed and written into the recipe header."""

    why: str


@dataclass(frozen=True)
class Rule:
    """Handled with other keys (named in ``what``) when the recipe is assembled."""

    what: str


#: why megatron's context parallelism is refused (docs/backends/megatron.md, "Expert and context
#: parallelism")
_NO_CP = (
    "rlzoo's megatron backend has no context parallelism: megatron-core's local attention refuses it "
    "('Context parallelism is only supported by TEDotProductAttention!'), it needs Transformer "
    "Engine on CUDA GPUs; use tensor parallelism (trainer.backend.tensor_model_parallel_size) for "
    "long sequences"
)


def _fsdp(v: Any) -> str:
    name = {"fsdp": "fsdp2", "fsdp2": "fsdp2", "megatron": "megatron"}.get(str(v))
    if name is None:
        raise ValueError(f"strategy {v!r} has no rlzoo train backend (fsdp2, megatron)")
    return name


#: verl's ``prime`` reward manager: worker processes, 300 s per sample, a failure scores 0
PRIME_NOTE = (
    "prime -> process_pool: verl's prime manager scores in worker processes with 300 s per sample "
    "(reward.manager.timeout: 300, as verl), a failed or late sample scoring 0"
)


#: printed where a script asks for another engine: what rlzoo runs instead, and why (docs/from-verl.md)
ENGINE_NOTES = {
    "sglang": (
        "SGLang -> vLLM: rlzoo has no SGLang backend (sglang 0.5.23 on PyPI needs torch 2.14.1 and CUDA "
        "kernels); the same settings (TP, memory fraction, lengths, sampling) drive rlzoo's vllm backend"
    ),
    "trtllm": (
        "TensorRT-LLM -> vLLM: rlzoo has no TensorRT-LLM backend (NVIDIA GPUs only); the same settings "
        "(TP, memory fraction, lengths, sampling) drive rlzoo's vllm backend"
    ),
}


def _rollout_name(v: Any) -> str:
    if str(v) != "vllm" and str(v) not in ENGINE_NOTES:
        raise ValueError(f"rollout engine {v!r} has no rlzoo rollout backend (vllm, native)")
    return "vllm"


def _truncation(v: Any) -> str:
    if str(v) not in ("error", "left", "right"):
        raise ValueError(f"truncation {v!r}: rlzoo knows error, left, right (and filter)")
    return str(v)


def _path(v: Any) -> str:
    """A path as verl opens it: a leading ``~`` is the user's home (HF hub names pass through)."""
    import os

    return os.path.expanduser(str(v))


def _files(v: Any) -> list[str]:
    return [_path(x) for x in v] if isinstance(v, (list, tuple)) else [_path(v)]


def _loggers(v: Any) -> list[str]:
    names = _files(v)
    unknown = [x for x in names if x not in ("console", "tensorboard", "wandb", "mlflow")]
    if unknown:
        raise ValueError(f"loggers {unknown} have no rlzoo sink (console, jsonl, tensorboard, wandb, mlflow)")
    return [*names, "jsonl"] if "jsonl" not in names else names


def _dtype(v: Any) -> str:
    name = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32"}
    name |= {"fp16": "float16", "float16": "float16", "float": "float32", "half": "float16"}
    out = name.get(str(v).removeprefix("torch."))
    if out is None:
        raise ValueError(f"dtype {v!r}: rlzoo knows bfloat16, float32, float16")
    return out


def _off(v: Any) -> bool:
    """False / None / 0 / "" / "null": the feature is off."""
    return v in (None, False, 0, "", "null", "None", "none")


def _one(v: Any) -> bool:
    return v in (None, 1, "null")


def _betas(v: Any) -> list[float]:
    if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)):
        raise ValueError(f"betas {v!r}: expected two numbers, e.g. [0.9,0.999]")
    return [float(x) for x in v]


def _positive_or_none(v: Any) -> Any:
    return None if v is None or (isinstance(v, (int, float)) and v <= 0) else v


_PERF = "performance only: "
_NO_MULTI_TURN = (
    "rlzoo cannot read verl's multi-turn tool configs (tool_config_path / interaction_config_path): "
    "its multi-turn rollout takes environment and tool parts (rollout.environment, rollout.tools; "
    "docs/agents.md): write the tools as rlzoo parts and set those keys"
)
NO_ULYSSES = (
    "rlzoo's megatron backend has no Ulysses sequence parallelism (the fsdp2 backend has: "
    "strategy=fsdp2 -> trainer.backend.ulysses_size); with megatron set it to 1 and use tensor "
    "parallelism, dynamic micro-batches or activation recompute for long sequences"
)
_LOG = "logging / bookkeeping only: "
A, R, ACT, REF, ROLL, CRIT = (
    "algorithm.",
    "actor_rollout_ref.",
    "actor_rollout_ref.actor.",
    "actor_rollout_ref.ref.",
    "actor_rollout_ref.rollout.",
    "critic.",
)

#: verl key -> rule. A key ending in ``.*`` covers every key under it.
TABLE: dict[str, To | Skip | Manual | Rule] = {
    # data
    "data.train_files": To("data.train_files", _files),
    "data.val_files": To("data.val_files", _files),
    "data.prompt_key": To("data.prompt_key"),
    "data.max_prompt_length": To("data.max_prompt_length"),
    "data.max_response_length": To("data.max_response_length"),
    "data.train_batch_size": Rule("prompts per step; fully-async: require_batches x ppo_mini_batch_size"),
    "data.val_batch_size": To("data.val_batch_size", _positive_or_none),
    "data.shuffle": To("data.shuffle"),
    "data.truncation": To("data.truncation", _truncation),
    "data.filter_overlong_prompts": Rule("True -> data.truncation=filter"),
    "data.gen_batch_size": Skip(
        "verl's generation batch (dynamic-sampling refills / fully-async streaming); rlzoo sizes it"
    ),
    "data.return_raw_chat": Skip("rlzoo always renders the chat template itself"),
    "data.image_key": Skip("rlzoo reads the images column of its parquet schema"),
    "data.trust_remote_code": To("model.trust_remote_code"),
    # model
    R + "model.path": To("model.path", _path),
    R + "model.trust_remote_code": To("model.trust_remote_code"),
    R + "model.enable_gradient_checkpointing": Rule("trainer.backend gradient_checkpointing (fsdp2)"),
    R + "model.use_remove_padding": Rule("trainer.backend.use_remove_padding (fsdp2)"),
    R + "model.override_config.*": Manual(
        "rlzoo has no model-config override: edit the model's config.json (e.g. max_position_embeddings)"
    ),
    R + "hybrid_engine": Rule("False -> placement.colocate=false"),
    R + "model.torch_dtype": To("model.dtype", _dtype),
    R + "model.use_fused_kernels": Skip(
        _PERF + "fused log-prob / entropy kernels; rlzoo computes log-probs in chunks itself"
    ),
    R + "model.fused_kernel_options.*": Skip(_PERF + "options of the fused kernels"),
    R + "model.use_shm": Skip(_PERF + "verl copies the model to /dev/shm before loading it"),
    R + "model.use_liger": Skip(_PERF + "Liger fused kernels"),
    R + "model.enable_activation_offload": Skip(_PERF + "activations offloaded to the CPU in backward"),
    R + "model.lora_rank": Rule("LoRA: trainer.lora (rank, alpha, target_modules); 0 = full fine-tuning"),
    R + "model.lora_alpha": Rule("read with lora_rank"),
    R + "model.target_modules": Rule("read with lora_rank"),
    R + "model.exclude_modules": Rule("trainer.lora.exclude_modules (read with lora_rank)"),
    R + "model.lora_adapter_path": Rule("trainer.lora.adapter_path (r / alpha / targets from the adapter)"),
    R + "model.lora.*": Rule("read with lora_rank"),
    R + "model.mtp.*": Rule("multi-token prediction: off only (rlzoo has no MTP heads)"),
    R + "model.external_lib": Skip(
        "nothing to import",
        _off,
        "rlzoo loads models with transformers only; import the library in a plugin package instead",
    ),
    R + "nccl_timeout": Skip(
        "infrastructure: torch.distributed's collective timeout (rlzoo's weight syncs: "
        "placement.sync_timeout_s)"
    ),
    # actor: algorithm
    ACT + "strategy": To("trainer.backend.name", _fsdp),
    ACT + "ppo_mini_batch_size": To("trainer.ppo_mini_batch_size"),
    ACT + "ppo_epochs": To("trainer.ppo_epochs"),
    ACT + "shuffle": To("trainer.shuffle_mini_batches"),
    ACT + "clip_ratio": Rule("both policy-loss clip_ratio_low / _high unless set"),
    ACT + "clip_ratio_low": Rule("algorithm.policy_loss.clip_ratio_low (losses that declare it)"),
    ACT + "clip_ratio_high": Rule("algorithm.policy_loss.clip_ratio_high (losses that declare it)"),
    ACT + "clip_ratio_c": Rule("algorithm.policy_loss.clip_ratio_c (losses that declare it)"),
    ACT + "tau_pos": Rule("algorithm.policy_loss.tau_pos (sapo)"),
    ACT + "tau_neg": Rule("algorithm.policy_loss.tau_neg (sapo)"),
    ACT + "policy_loss.loss_mode": To("algorithm.policy_loss.name"),
    ACT + "policy_loss.clip_cov_ratio": Rule("algorithm.policy_loss.clip_cov_ratio"),
    ACT + "policy_loss.clip_cov_lb": Rule("algorithm.policy_loss.clip_cov_lb"),
    ACT + "policy_loss.clip_cov_ub": Rule("algorithm.policy_loss.clip_cov_ub"),
    ACT + "policy_loss.kl_cov_ratio": Rule("algorithm.policy_loss.kl_cov_ratio"),
    ACT + "policy_loss.ppo_kl_coef": Rule("algorithm.policy_loss.ppo_kl_coef"),
    ACT + "policy_loss.dro_beta": Rule("algorithm.policy_loss.beta (dro)"),
    ACT + "loss_agg_mode": To("algorithm.loss_agg"),
    ACT + "entropy_coeff": To("algorithm.entropy_coeff"),
    ACT + "use_kl_loss": To("algorithm.use_kl_loss"),
    ACT + "kl_loss_coef": To("algorithm.kl_loss_coef"),
    ACT + "kl_loss_type": To("algorithm.kl_loss"),
    ACT + "use_rollout_log_probs": Rule(
        "True -> old log-probs := rollout log-probs (correction mode bypass)"
    ),
    # actor: optimizer and batching (shared trainer settings)
    ACT + "optim.lr": To("trainer.optim.lr"),
    ACT + "optim.weight_decay": To("trainer.optim.weight_decay"),
    ACT + "optim.betas": To("trainer.optim.betas", _betas),
    ACT + "optim.lr_warmup_steps": To("trainer.optim.warmup_steps", lambda v: max(int(v), 0)),
    ACT + "optim.lr_warmup_steps_ratio": To("trainer.optim.warmup_ratio"),
    ACT + "optim.warmup_style": To("trainer.optim.lr_scheduler"),
    ACT + "optim.lr_scheduler_type": To("trainer.optim.lr_scheduler"),
    ACT + "optim.min_lr_ratio": To("trainer.optim.min_lr_ratio", lambda v: 0.0 if v is None else v),
    ACT + "optim.lr_decay_steps": Skip("rlzoo's schedule spans the run's optimizer steps"),
    ACT + "optim.override_optimizer_config.*": Skip(_PERF + "megatron CPU-optimizer tuning"),
    ACT + "grad_clip": To("trainer.optim.grad_clip"),
    ACT + "use_dynamic_bsz": Rule("True -> trainer.micro_batch.max_tokens = ppo_max_token_len_per_gpu"),
    ACT + "ppo_max_token_len_per_gpu": Rule("trainer.micro_batch.max_tokens (with use_dynamic_bsz)"),
    ACT + "ppo_micro_batch_size_per_gpu": Rule("trainer.micro_batch.size (without use_dynamic_bsz)"),
    ACT + "ppo_micro_batch_size": Rule("trainer.micro_batch.size = global / trainer GPUs"),
    ACT + "ulysses_sequence_parallel_size": Rule(
        "trainer.backend.ulysses_size (fsdp2; one size for all models)"
    ),
    ACT + "optim.clip_grad": To("trainer.optim.grad_clip", note="megatron's name for grad_clip"),
    ACT + "optim.lr_decay_style": To("trainer.optim.lr_scheduler", note="megatron's name for warmup_style"),
    ACT + "optim.lr_warmup_init": Skip(
        "0: warmup starts from 0, as rlzoo's",
        lambda v: v in (0, 0.0, None),
        "rlzoo's warmup starts from LR 0",
    ),
    ACT + "fsdp_config.param_offload": Rule("fsdp2 offload"),
    ACT + "fsdp_config.optimizer_offload": Rule("fsdp2 offload"),
    ACT + "fsdp_config.grad_offload": Skip(_PERF + "fsdp2 offloads parameters and optimizer state together"),
    ACT + "fsdp_config.fsdp_size": To("trainer.backend.fsdp_size"),
    ACT + "megatron.tensor_model_parallel_size": To("trainer.backend.tensor_model_parallel_size"),
    ACT + "megatron.pipeline_model_parallel_size": To("trainer.backend.pipeline_model_parallel_size"),
    ACT + "megatron.param_offload": To("trainer.backend.param_offload"),
    ACT + "megatron.grad_offload": To("trainer.backend.grad_offload"),
    ACT + "megatron.optimizer_offload": Skip(
        _PERF + "optimizer state on CPU; rlzoo's megatron needs NVIDIA Transformer Engine for it: "
        "set trainer.backend.optimizer_offload=true where it is installed"
    ),
    ACT + "megatron.use_mbridge": Skip("rlzoo converts HF <-> Megatron weights itself"),
    ACT + "checkpoint.*": Skip(_LOG + "rlzoo checkpoints the whole training state"),
    ACT + "entropy_checkpointing": Skip(_PERF + "recomputes the entropy in backward; rlzoo chunks it"),
    ACT + "entropy_from_logits_with_chunking": Skip(_PERF + "rlzoo computes entropy in chunks itself"),
    ACT + "use_torch_compile": Skip(_PERF + "torch.compile of verl's log-prob kernels"),
    ACT + "use_prefix_grouper": Skip(_PERF + "shares the forward of a group's common prompt"),
    ACT + "fsdp_config.forward_prefetch": Skip(_PERF + "FSDP prefetch schedule"),
    ACT + "fsdp_config.use_orig_params": Skip(
        _PERF + "an FSDP1 flattening switch; rlzoo's FSDP2 shards per parameter"
    ),
    ACT + "fsdp_config.wrap_policy.*": Skip(_PERF + "rlzoo's fsdp2 shards each decoder layer"),
    ACT + "fsdp_config.reshard_after_forward": To("trainer.backend.reshard_after_forward"),
    ACT + "fsdp_config.model_dtype": To("model.dtype", _dtype),
    ACT + "fsdp_config.mixed_precision.param_dtype": Skip(
        "bf16 compute: rlzoo's fsdp2 mixed_precision (on by default) computes in bf16",
        lambda v: str(v) in ("bf16", "bfloat16"),
        "rlzoo's fsdp2 mixed precision computes in bf16 only; for fp32 compute set "
        "trainer.backend.mixed_precision=false",
    ),
    ACT + "fsdp_config.mixed_precision.reduce_dtype": Skip(
        "fp32 reduction, as rlzoo's fsdp2 mixed_precision",
        lambda v: str(v) in ("fp32", "float32"),
        "rlzoo's fsdp2 reduces gradients in fp32 only",
    ),
    ACT + "fsdp_config.mixed_precision.buffer_dtype": Skip(
        "fp32 buffers, as rlzoo's fsdp2",
        lambda v: str(v) in ("fp32", "float32"),
        "rlzoo keeps buffers in fp32",
    ),
    ACT + "profiler.*": Skip(
        _LOG + "profiler settings (rlzoo: run a step under nsys / torch.profiler yourself)"
    ),
    ACT + "freeze_vision_tower": Skip(
        "the vision tower trains with the rest",
        _off,
        "rlzoo freezes a vision tower on the native train backend only (trainer.backend.freeze_vision_tower), "
        "the one that trains vision-language models; fsdp2 and megatron load their text part",
    ),
    ACT + "calculate_sum_pi_squared": Skip(
        "off", _off, "rlzoo has no sum-of-pi-squared statistic (verl's optimal-baseline estimator input)"
    ),
    ACT + "router_replay.mode": Rule(
        "`trainer.backend.router_replay` (megatron; R3, read with rollout.enable_rollout_routing_replay: the "
        "actor replays the experts the rollout recorded); R2 is refused"
    ),
    ACT + "router_replay.*": Skip(
        "no routing file (verl's record_file / replay_file)",
        lambda v: _off(v) or str(v) in ("disabled", "null", "None"),
        "rlzoo writes and reads no routing files (verl's router_replay.record_file / replay_file); "
        "the routes travel with the batch",
    ),
    ACT + "megatron.context_parallel_size": Skip(
        "1: no context parallelism",
        _one,
        _NO_CP,
    ),
    ACT + "megatron.expert_model_parallel_size": To("trainer.backend.expert_parallel_size"),
    ACT + "megatron.expert_tensor_parallel_size": To("trainer.backend.expert_tensor_parallel_size"),
    ACT + "megatron.virtual_pipeline_model_parallel_size": Skip(_PERF + "interleaved pipeline schedule"),
    ACT + "megatron.use_dist_checkpointing": Skip("rlzoo converts HF <-> Megatron weights itself"),
    ACT + "megatron.vanilla_mbridge": Skip("rlzoo converts HF <-> Megatron weights itself"),
    ACT + "megatron.dist_checkpointing_path": Skip("rlzoo converts HF <-> Megatron weights itself"),
    ACT + "megatron.override_transformer_config.*": Skip(
        _PERF + "Megatron kernel fusions, recompute and pipeline layering; rlzoo's megatron backend sets "
        "its own (activation recompute: trainer.backend.recompute_activations)"
    ),
    ACT + "megatron.override_ddp_config.*": Skip(_PERF + "Megatron DDP bucketing"),
    ACT + "megatron.seed": Skip("rlzoo seeds every rank from run.seed"),
    # reference model
    REF + "fsdp_config.param_offload": To("trainer.backend.ref_offload"),
    REF + "megatron.param_offload": To("trainer.backend.ref_offload"),
    REF + "megatron.tensor_model_parallel_size": Skip(
        _PERF + "the reference runs with the actor's parallelism"
    ),
    REF + "megatron.pipeline_model_parallel_size": Skip(
        _PERF + "the reference runs with the actor's parallelism"
    ),
    REF + "log_prob_micro_batch_size_per_gpu": Rule("trainer.micro_batch.log_prob_size"),
    REF + "log_prob_micro_batch_size": Rule("trainer.micro_batch.log_prob_size"),
    REF + "log_prob_use_dynamic_bsz": Skip(_PERF + "log-prob forwards use trainer.micro_batch.log_prob_size"),
    REF + "log_prob_max_token_len_per_gpu": Skip(
        _PERF + "log-prob forwards use trainer.micro_batch.log_prob_size"
    ),
    REF + "ulysses_sequence_parallel_size": Rule("trainer.backend.ulysses_size (the actor's)"),
    REF + "strategy": Skip("the reference runs on the actor's train backend"),
    REF + "megatron.*": Skip(_PERF + "the reference runs with the actor's parallelism"),
    REF + "fsdp_config.*": Skip(
        _PERF + "the reference follows the actor's FSDP settings (offload: ref_offload)"
    ),
    REF + "entropy_checkpointing": Skip(_PERF + "the reference computes no entropy"),
    REF + "entropy_from_logits_with_chunking": Skip(_PERF + "the reference computes no entropy"),
    REF + "use_torch_compile": Skip(_PERF + "torch.compile of verl's log-prob kernels"),
    REF + "profiler.*": Skip(_LOG + "profiler settings"),
    # rollout
    ROLL + "name": To("rollout.backend.name", _rollout_name, note_for=lambda v: ENGINE_NOTES.get(str(v), "")),
    ROLL + "mode": Skip("rlzoo's vLLM backend serves the loop asynchronously by itself"),
    ROLL + "n": To("rollout.n"),
    ROLL + "temperature": To("rollout.temperature"),
    ROLL + "top_p": To("rollout.top_p"),
    ROLL + "top_k": To("rollout.top_k"),
    ROLL + "tensor_model_parallel_size": To("rollout.backend.tensor_parallel_size"),
    ROLL + "gpu_memory_utilization": To("rollout.backend.gpu_memory_utilization"),
    ROLL + "max_model_len": To("rollout.backend.max_model_len"),
    ROLL + "max_num_batched_tokens": To("rollout.backend.max_num_batched_tokens"),
    ROLL + "max_num_seqs": To("rollout.backend.max_num_seqs"),
    ROLL + "enforce_eager": To("rollout.backend.enforce_eager"),
    ROLL + "enable_prefix_caching": To("rollout.backend.enable_prefix_caching"),
    ROLL + "enable_chunked_prefill": Skip(_PERF + "vLLM's V1 engine chunks prefills by default"),
    ROLL + "engine_kwargs.vllm.*": Rule("rollout.backend.engine_kwargs"),
    ROLL + "engine_kwargs.sglang.*": Skip("read by the SGLang engine only"),
    ROLL + "engine_kwargs.trtllm.*": Skip("read by the TensorRT-LLM engine only"),
    ROLL + "checkpoint_engine.*": Skip(_PERF + "verl's weight-sync engine"),
    ROLL + "data_parallel_size": Skip(_PERF + "vLLM engine replicas"),
    ROLL + "expert_parallel_size": Skip(_PERF + "vLLM expert parallelism"),
    ROLL + "free_cache_engine": Skip(_PERF + "rlzoo's vLLM backend manages its KV cache"),
    ROLL + "load_format": Skip(
        "how verl's vLLM first loads weights (dummy: random, then the trainer's are pushed); rlzoo's vLLM "
        "backend loads model.path's weights, the same ones the trainer starts from"
    ),
    ROLL + "layered_summon": Skip(_PERF + "gathers LoRA weights layer by layer for the rollout"),
    ROLL + "enable_sleep_mode": Skip("rlzoo never puts its rollout engine to sleep (no colocated offload)"),
    ROLL + "multi_stage_wake_up": Skip(_PERF + "vLLM wake-up order"),
    ROLL + "skip_tokenizer_init": Skip(_PERF + "rlzoo's vLLM backend passes token ids"),
    ROLL + "disable_log_stats": Skip(_LOG + "vLLM statistics logging"),
    ROLL + "prometheus.*": Skip(_LOG + "vLLM metrics server"),
    ROLL + "trace.*": Skip(_LOG + "rollout tracing"),
    ROLL + "over_sample_rate": Skip(
        "verl 0.9 declares it but no code reads it: the SGLang SPMD rollout that aborted a batch's slowest "
        "requests was retired (verl PR #4422), so every request is kept there as here"
    ),
    ROLL + "enable_rollout_routing_replay": Rule(
        "read with actor.router_replay.mode (R3): the rollout records each token's experts "
        "(`rollout.backend.record_routes` on the native backend)"
    ),
    ROLL + "update_weights_bucket_megabytes": To("placement.bucket_size_mb"),
    ROLL + "agent.*": Skip(_PERF + "verl's agent-loop worker settings"),
    ROLL + "multi_turn.enable": Skip("multi-turn is off", _off, _NO_MULTI_TURN),
    ROLL + "multi_turn.*": Rule("read with multi_turn.enable (not needed when it is off)"),
    ROLL + "calculate_log_probs": Skip(
        "rlzoo's rollout backends always return the sampled tokens' log-probs"
    ),
    ROLL + "log_prob_micro_batch_size_per_gpu": Rule("trainer.micro_batch.log_prob_size"),
    ROLL + "log_prob_micro_batch_size": Rule("trainer.micro_batch.log_prob_size"),
    ROLL + "log_prob_use_dynamic_bsz": Skip(
        _PERF + "log-prob forwards use trainer.micro_batch.log_prob_size"
    ),
    ROLL + "log_prob_max_token_len_per_gpu": Skip(
        _PERF + "log-prob forwards use trainer.micro_batch.log_prob_size"
    ),
    ROLL + "val_kwargs.n": To("rollout.val.n"),
    ROLL + "val_kwargs.temperature": Rule("rollout.val.temperature (0 unless do_sample)"),
    ROLL + "val_kwargs.top_p": To("rollout.val.top_p"),
    ROLL + "val_kwargs.top_k": To("rollout.val.top_k"),
    ROLL + "val_kwargs.do_sample": Rule("False -> rollout.val.temperature=0"),
    # critic (PPO with GAE)
    CRIT + "strategy": Rule("must equal the actor's strategy (one train backend)"),
    CRIT + "model.path": To("model.critic_path", _path),
    CRIT + "optim.lr": To("trainer.optim.critic_lr"),
    CRIT + "optim.weight_decay": To("trainer.optim.critic_weight_decay"),
    CRIT + "grad_clip": To("trainer.optim.critic_grad_clip"),
    CRIT + "cliprange_value": To("algorithm.value_clip"),
    CRIT + "ppo_micro_batch_size_per_gpu": Skip(_PERF + "the critic uses trainer.micro_batch like the actor"),
    CRIT + "ppo_max_token_len_per_gpu": Skip(_PERF + "the critic uses trainer.micro_batch like the actor"),
    CRIT + "use_dynamic_bsz": Skip(_PERF + "the critic uses trainer.micro_batch like the actor"),
    CRIT + "model.enable_gradient_checkpointing": Skip(_PERF + "follows the actor's gradient_checkpointing"),
    CRIT + "model.use_remove_padding": Skip(_PERF + "follows the actor's use_remove_padding"),
    CRIT + "model.fsdp_config.*": Skip(_PERF + "the critic follows the actor's FSDP settings"),
    CRIT + "model.trust_remote_code": Skip("the critic loads with model.trust_remote_code"),
    CRIT + "model.override_config.*": Skip(_PERF + "the critic follows the actor's model config"),
    CRIT + "megatron.*": Skip(_PERF + "the critic runs with the actor's megatron settings"),
    CRIT + "optim.lr_warmup_steps_ratio": Rule("trainer.optim.critic_warmup_ratio where it differs"),
    CRIT + "optim.lr_warmup_steps": Rule("trainer.optim.critic_warmup_steps where it differs"),
    CRIT + "optim.warmup_style": Rule("trainer.optim.critic_lr_scheduler where it differs"),
    CRIT + "optim.lr_scheduler_type": Rule("trainer.optim.critic_lr_scheduler where it differs"),
    CRIT + "optim.min_lr_ratio": Rule("trainer.optim.critic_min_lr_ratio where it differs"),
    CRIT + "optim.betas": Rule("must equal the actor's (one AdamW setting)"),
    CRIT + "ulysses_sequence_parallel_size": Rule("trainer.backend.ulysses_size (the actor's)"),
    CRIT + "profiler.*": Skip(_LOG + "profiler settings"),
    CRIT + "checkpoint.*": Skip(_LOG + "rlzoo checkpoints the whole training state"),
    CRIT + "use_torch_compile": Skip(_PERF + "torch.compile"),
    CRIT + "forward_micro_batch_size_per_gpu": Skip(
        _PERF + "value forwards use trainer.micro_batch.log_prob_size"
    ),
    CRIT + "forward_max_token_len_per_gpu": Skip(
        _PERF + "value forwards use trainer.micro_batch.log_prob_size"
    ),
    # algorithm
    A + "adv_estimator": To("algorithm.advantage.name"),
    A + "gamma": Rule("algorithm.advantage.gamma (estimators that declare it)"),
    A + "lam": Rule("algorithm.advantage.lam (gae)"),
    A + "norm_adv_by_std_in_grpo": Rule("algorithm.advantage.norm_by_std (estimators that declare it)"),
    A + "use_kl_in_reward": To("algorithm.use_kl_in_reward"),
    A + "kl_penalty": To("algorithm.kl_penalty"),
    A + "kl_ctrl.type": To("algorithm.kl_ctrl.type"),
    A + "kl_ctrl.kl_coef": To("algorithm.kl_ctrl.kl_coef"),
    A + "kl_ctrl.target_kl": To("algorithm.kl_ctrl.target_kl"),
    A + "kl_ctrl.horizon": To("algorithm.kl_ctrl.horizon"),
    A + "filter_groups.enable": Rule("True -> algorithm.sample_filter=dynamic_sampling"),
    A + "filter_groups.metric": Rule("algorithm.sample_filter.metric"),
    A + "filter_groups.max_num_gen_batches": Rule("algorithm.sample_filter.max_num_gen_batches"),
    A + "rollout_correction.*": Rule(
        "one algorithm.rollout_correction part (token_is / seq_is / icepop / rejection)"
    ),
    # reward
    "reward_model.reward_manager": To(
        "reward.manager.name",
        lambda v: "process_pool" if v == "prime" else v,
        note_for=lambda v: PRIME_NOTE if v == "prime" else "",
    ),
    "reward_model.enable": Rule("True -> reward.manager: reward_model (a learned reward model)"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": To("reward.manager.enable"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": To("reward.manager.overlong_buffer_len"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": To("reward.manager.penalty_factor"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": Skip(_LOG + "rlzoo always logs the penalty"),
    "reward_model.reward_kwargs.max_resp_len": To("reward.manager.max_response_length"),
    # recipe/dapo's layout of the same overlong buffer (max_resp_len is data.max_response_length there)
    "reward_model.overlong_buffer.enable": To("reward.manager.enable"),
    "reward_model.overlong_buffer.len": To("reward.manager.overlong_buffer_len"),
    "reward_model.overlong_buffer.penalty_factor": To("reward.manager.penalty_factor"),
    "reward_model.overlong_buffer.log": Skip(_LOG + "rlzoo always logs the penalty"),
    "reward_model.model.*": Rule("read with reward_model.enable: the reward_model manager's path / params"),
    "reward_model.micro_batch_size_per_gpu": Rule("reward_model manager's batch_size"),
    "reward_model.micro_batch_size": Rule("reward_model manager's batch_size"),
    "reward_model.max_length": Rule("reward_model manager's max_length"),
    "reward_model.rollout.*": Rule(
        "performance only: serving the reward model (read with reward_model.enable)"
    ),
    "reward_model.strategy": Rule("performance only (read with reward_model.enable)"),
    "reward_model.use_dynamic_bsz": Rule("performance only (read with reward_model.enable)"),
    "reward_model.forward_max_token_len_per_gpu": Rule("performance only (read with reward_model.enable)"),
    "reward_model.enable_resource_pool": Rule("performance only (read with reward_model.enable)"),
    "reward_model.n_gpus_per_node": Rule("performance only (read with reward_model.enable)"),
    "reward_model.nnodes": Rule("performance only (read with reward_model.enable)"),
    "reward_model.use_reward_loop": Skip("verl's reward-loop implementation switch"),
    "reward_model.num_workers": Skip(_PERF + "verl's reward worker count"),
    "reward_model.launch_reward_fn_async": Skip(_PERF + "rlzoo's reward managers overlap scoring themselves"),
    "reward_model.sandbox_fusion.url": Rule(
        "reward.scorers: verl's code sources (codecontests, apps, codeforces, taco) -> code_tests with "
        "sandbox.url (rlzoo's code_tests speaks SandboxFusion's /run_code)"
    ),
    "reward_model.sandbox_fusion.*": Rule("read with sandbox_fusion.url"),
    "custom_reward_function.path": Rule("reward.scorer: {name: python_file, path} (an absolute path)"),
    "custom_reward_function.name": Rule("reward.scorer.function (read with custom_reward_function.path)"),
    "custom_reward_function.reward_kwargs.*": Rule(
        "reward.scorer.kwargs (read with custom_reward_function.path)"
    ),
    # trainer and placement
    "trainer.project_name": Skip(_LOG + "experiment tracker project"),
    "trainer.experiment_name": To("run.name"),
    "trainer.logger": To("run.loggers", _loggers, "plus jsonl, rlzoo's metrics file"),
    "trainer.default_local_dir": To("run.dir"),
    "trainer.resume_mode": Skip("rlzoo resumes only when asked (resume=latest run.output_dir=...)"),
    "trainer.val_before_train": To("trainer.val_before_train"),
    "trainer.test_freq": To("trainer.test_freq"),
    "trainer.save_freq": To("trainer.save_freq"),
    "trainer.total_epochs": To("trainer.total_epochs"),
    "trainer.total_training_steps": To("trainer.total_steps"),
    "trainer.critic_warmup": To("trainer.critic_warmup"),
    "trainer.nnodes": To("placement.trainer.nnodes"),
    "trainer.n_gpus_per_node": To("placement.trainer.n_gpus_per_node"),
    "trainer.use_legacy_worker_impl": Skip("verl worker implementation switch"),
    "trainer.log_val_generations": Skip(_LOG + "rlzoo writes validation samples to the run directory"),
    "trainer.max_actor_ckpt_to_keep": To("trainer.max_checkpoints"),
    "trainer.max_critic_ckpt_to_keep": Skip(
        "rlzoo checkpoints actor and critic together (trainer.max_checkpoints)"
    ),
    "trainer.balance_batch": Skip(_PERF + "rlzoo's fsdp2 balances real-token counts across ranks itself"),
    "trainer.resume_from_path": Skip(
        "no verl checkpoint to resume",
        _off,
        "rlzoo cannot resume from a verl checkpoint (export it as a "
        "Hugging Face model and start from model.path)",
    ),
    "trainer.del_local_ckpt_after_load": Skip(_LOG + "checkpoint housekeeping"),
    "trainer.device": Skip("rlzoo places parts on GPUs when placement has them"),
    "trainer.ray_wait_register_center_timeout": Skip("verl's Ray start-up timeout"),
    "trainer.rollout_data_dir": To(
        "run.samples.every",
        lambda v: 0 if v is None else 1,
        "a folder: every step's samples kept as Parquet in RUN_DIR/samples/ (rlzoo view reads them); null: none",
    ),
    "trainer.validation_data_dir": To(
        "run.samples.val",
        lambda v: v is not None,
        "a folder: validation samples kept in RUN_DIR/samples/val/; null: none",
    ),
    "global_profiler.*": Skip(_LOG + "profiler settings"),
    "ray_kwargs.*": Skip("Ray start-up settings (rlzoo: placement.address)"),
    "data.filter_overlong_prompts_workers": Skip(_PERF + "processes that filter long prompts"),
    "data.dataloader_num_workers": Skip(_PERF + "data loader processes"),
    "data.custom_cls.path": Rule("data.custom_cls: {path, name} (an absolute path)"),
    "data.custom_cls.name": Rule("data.custom_cls.name (read with data.custom_cls.path)"),
    "data.apply_chat_template_kwargs.*": Rule("data.chat_template_kwargs"),
    "data.video_key": Skip("rlzoo reads the images column of its parquet schema"),
    "data.sampler.class_path": Rule("data.sampler: {path, name} (an absolute path)"),
    "data.sampler.class_name": Rule("data.sampler.name (read with data.sampler.class_path)"),
    "rollout.nnodes": To("placement.rollout.nnodes"),
    "rollout.n_gpus_per_node": To("placement.rollout.n_gpus_per_node"),
    "rollout.total_rollout_steps": To("runner.total_rollout_steps"),
    "rollout.test_freq": To("trainer.test_freq"),
    "rollout.total_epochs": Skip("the fully-async run is bounded by total_rollout_steps"),
    "async_training.staleness_threshold": To("runner.staleness_threshold"),
    "async_training.trigger_parameter_sync_step": To("runner.trigger_parameter_sync_step"),
    "async_training.require_batches": To("runner.require_batches"),
    "async_training.partial_rollout": To("runner.partial_rollout"),
    "async_training.use_rollout_log_probs": Rule("True -> old log-probs := rollout log-probs (mode bypass)"),
    "async_training.compute_prox_log_prob": Rule(
        "True: the trainer recomputes old log-probs (rlzoo does unless the correction mode is bypass)"
    ),
    "async_training.checkpoint_engine.*": Skip(_PERF + "verl's weight-sync engine"),
}

#: verl's defaults where rlzoo's differ (verl 0.9.1's ppo_trainer.yaml), applied before the
#: script's overrides so the recipe runs the experiment verl would run.
VERL_DEFAULTS: dict[str, Any] = {
    R + "model.path": "~/models/deepseek-llm-7b-chat",
    "data.train_files": "~/data/rlhf/gsm8k/train.parquet",
    "data.val_files": "~/data/rlhf/gsm8k/test.parquet",
    A + "adv_estimator": "gae",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "data.truncation": "error",
    ROLL + "name": "vllm",
    ROLL + "n": 1,
    ROLL + "gpu_memory_utilization": 0.5,
    ACT + "strategy": "fsdp",
    ACT + "ppo_mini_batch_size": 256,
    ACT + "ppo_max_token_len_per_gpu": 16384,
    "trainer.total_epochs": 30,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
}

#: entry modules -> rlzoo runner
ENTRY_POINTS = {
    "verl.trainer.main_ppo": "sync",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async",
    "recipe.fully_async_policy.fully_async_main": "fully_async",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off",
    "recipe.one_step_off_policy.main_ppo": "one_step_off",
    "recipe.dapo.main_dapo": "sync",
}


def _rule(key: str) -> To | Skip | Manual | Rule | None:
    if key in TABLE:
        return TABLE[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        star = ".".join(parts[:i]) + ".*"
        if star in TABLE:
            return TABLE[star]
    return None


def table_markdown() -> str:
    """The mapping table as Markdown (docs/from-verl.md)."""
    rows = ["| verl key | rlzoo | note |", "|---|---|---|"]
    for k, r in TABLE.items():
        if isinstance(r, To):
            rows.append(f"| `{k}` | `{r.key}` | {r.note} |")
        elif isinstance(r, Rule):
            rows.append(f"| `{k}` | (combined) | {r.what} |")
        elif isinstance(r, Skip):
            rows.append(f"| `{k}` | not needed | {r.why} |")
        else:
            rows.append(f"| `{k}` | **manual** | {r.why} |")
    return "\n".join(rows)
