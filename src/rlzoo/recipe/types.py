"""A recipe's types: the typed sections of a run and the part selections in them.

:class:`RecipeConfig` is what :func:`rlzoo.recipe.config.load_config` returns: every section bound onto its
dataclass, every part name resolved to a :class:`Selection` (the registered component and its bound
params). This module holds only the types and what is computed from them; loading, binding and
checking live in :mod:`rlzoo.recipe.config`, :mod:`rlzoo.recipe.checks` and :mod:`rlzoo.recipe.overrides`, which import
it (so none of them imports another to learn what a recipe is).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.data.user_file import UserDatasetSettings, UserSamplerSettings
from rlzoo.gateway.settings import GatewaySettings
from rlzoo.kernel.binding import to_plain, tree_nodes
from rlzoo.kernel.params import MAX_SEED, param
from rlzoo.kernel.protocols import PlansSteps
from rlzoo.kernel.registry import Component
from rlzoo.kernel.settings import LoraSettings, MicroBatchSettings, OptimSettings, StepPlan


# ---------------------------------------------------------------------------------------------
# Part selections
# ---------------------------------------------------------------------------------------------
def parts(kind: str, default: list[str], *, help: str) -> Any:  # noqa: A002
    """A recipe field that selects a list of parts of ``kind`` (each a name or name + params)."""
    meta = {"kind": kind, "help": help, "sequence": True}
    return field(default_factory=lambda: list(default), metadata=meta)


def part(kind: str, default: str | None, *, help: str, optional: bool = False) -> Any:  # noqa: A002
    """A recipe field that selects a part of ``kind`` by name (plus its params)."""
    meta = {"kind": kind, "help": help, "optional": optional}
    if default is None:
        return field(default=None, metadata=meta)
    return field(default_factory=lambda: {"name": default}, metadata=meta)


@dataclass
class Selection:
    """A resolved part: the registered component and its bound params."""

    kind: str
    key: str  # config key path that selected it
    name: str
    component: Component[Any]
    params: Any

    @property
    def fn(self) -> Any:
        """The part's callable / factory (imports it on first use)."""
        return self.component.load()

    @property
    def caps(self) -> Any:
        """The part's typed capability record (:mod:`rlzoo.kernel.capabilities`)."""
        return self.component.caps

    def capability(self, key: str) -> Any:
        """One capability by name (:meth:`rlzoo.kernel.registry.Component.capability`)."""
        return self.component.capability(key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call a function part with its params: ``sel(inputs)`` == ``fn(inputs, params)``."""
        return self.fn(*args, self.params, **kwargs)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "plugin": self.component.plugin, **(to_plain(self.params) or {})}


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplesSection:
    """What the model wrote, kept with the run: ``RUN_DIR/samples/step_K.parquet`` (training) and
    ``samples/val/step_K.parquet`` (validation), one Parquet file per step, written atomically.
    ``rlzoo view`` and ``rlzoo eval`` read them (docs/metrics.md)."""

    every: int = param(1, ge=0, help="keep the training samples of every k-th step (0: keep none)")
    max_per_step: int = param(
        64, ge=1, help="samples kept per step (the first ones of the batch): bounds the folder's size"
    )
    keep_tokens: bool = param(
        True,
        help="keep token ids, each token's text, mask, policy version, advantage and reward per token "
        "(false: texts and per-sample numbers only)",
    )
    logprobs: bool = param(True, help="keep the rollout log-prob of every response token (needs keep_tokens)")
    val: bool = param(True, help="keep the validation samples (samples/val/), whatever every says")


@dataclass
class RunSection:
    name: str = param("rlzoo", help="run name; the run directory is <dir>/<name>-<timestamp>")
    dir: str = param("runs", help="parent folder of run directories")
    output_dir: str | None = param(None, help="exact run directory (overrides dir/name; needed to resume)")
    overwrite: bool = param(
        False,
        help="a fresh run into a run.output_dir that holds a run moves that run aside to "
        "<dir>.replaced-<time> (nothing is deleted); without it such a run is refused",
    )
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed for data order, sampling and initialisation")
    loggers: list[Any] = parts(
        "logger",
        ["console", "jsonl", "tensorboard"],
        help="metric sinks (kind logger): console, jsonl, tensorboard, wandb, mlflow; each a name or {name, params}",
    )
    export_every: int = param(
        0, help="also write the model as an HF folder RUN_DIR/export/step_K/ every K steps (0: final/ only)"
    )
    progress: bool = param(True, help="show a progress bar")
    samples: SamplesSection = param(
        SamplesSection(),
        help="samples kept with the run as Parquet ({every, max_per_step, keep_tokens, logprobs, val})",
    )


@dataclass
class ModelSection:
    path: str = param(help="HF model name or local path of the actor (and rollout) model")
    tokenizer_path: str | None = param(None, help="tokenizer path (defaults to model.path)")
    critic_path: str | None = param(
        None, help="model the critic is initialised from (defaults to model.path)"
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = param(
        "float32",
        help="parameter dtype of the rollout model; auto: bfloat16 on CUDA and on CPUs with avx512_bf16 / "
        "amx_bf16, float32 elsewhere (printed at start)",
    )
    device: str = param("auto", help="'cpu', 'cuda' or 'auto' (cuda when available)")
    trust_remote_code: bool = param(False, help="passed to from_pretrained")


@dataclass
class DataSection:
    prepare: Any = part(
        "dataset", None, help="dataset preparer run when train_files are missing", optional=True
    )
    dir: str | None = param(None, help="folder the preparer writes into (used by interpolation)")
    train_files: list[str] = param([], help="parquet files of training prompts")
    val_files: list[str] = param([], help="parquet files of validation prompts")
    prompt_key: str = param("prompt", help="column holding the chat messages")
    max_prompt_length: int = param(512, ge=1, help="longest prompt in tokens (see truncation)")
    max_response_length: int = param(128, ge=1, help="generation cap per response (tokens)")
    train_batch_size: int = param(8, ge=1, help="prompts per training step")
    val_batch_size: int | None = param(None, ge=1, help="prompts per validation batch (default: all)")
    shuffle: bool = param(True, help="shuffle prompts each epoch")
    truncation: Literal["filter", "error", "left", "right"] = param(
        "filter", help="prompts longer than max_prompt_length: drop (filter), raise, or cut left / right"
    )
    strict: bool = param(False, help="raise on bad rows instead of filtering them")
    apply_chat_template: bool = param(True, help="render prompts with the tokenizer's chat template")
    chat_template_kwargs: dict[str, Any] = param(
        {},
        help="extra arguments of the chat template, for prompts and multi-turn turns alike (e.g. "
        "enable_thinking: false, reasoning_effort: medium); verl's data.apply_chat_template_kwargs",
    )
    custom_cls: UserDatasetSettings | None = param(
        None,
        help="your own dataset class from a Python file ({path, name, config}), built over train_files / "
        "val_files as verl builds it (verl's data.custom_cls); null: rlzoo's parquet reader. docs/data.md",
    )
    sampler: UserSamplerSettings | None = param(
        None,
        help="your own sampler class from a Python file ({path, name, config}): it orders the training "
        "prompts of each epoch (verl's data.sampler); null: shuffle (or not) by run.seed. docs/data.md",
    )


@dataclass
class KLControlSection:
    type: Literal["fixed", "adaptive"] = param("fixed", help="KL-in-reward controller")
    kl_coef: float = param(0.001, ge=0, help="initial / fixed coefficient")
    target_kl: float = param(0.1, gt=0, help="adaptive: target KL")
    horizon: int = param(10000, ge=1, help="adaptive: horizon")


@dataclass(frozen=True)
class TeacherSection:
    """A teacher for distillation (``algorithm.teacher``): a frozen model that scores the student's
    sampled tokens, forward-only, placed like the reference policy. Its log-probs feed a
    distillation part (the ``distill_reverse_kl`` advantage, or the teacher-KL loss term
    ``algorithm.teacher_kl_coef``). It must share the student's tokenizer (validate names the first
    differing token). See docs/distillation.md."""

    model: str = param(
        help="the teacher's model folder (Hugging Face, an rlzoo run's final/ or export/step_K) or hub name"
    )
    backend: Literal["train", "rollout"] = param(
        "train",
        help="where its forward runs: 'train' = on the run's train backend beside the reference policy "
        "(native, fsdp2, megatron; colocated with the actor, or in the trainer's Ray pool), with the chunked "
        "log-prob path; 'rollout' = a second engine of the run's rollout backend (one with "
        "supplies_prompt_log_probs: vllm) beside the rollout engine, scoring prompt + response with prompt "
        "log-probs (the sampled-token objectives only; placement local, rollout temperature 1)",
    )
    dtype: Literal["float32", "bfloat16"] | None = param(
        None, help="the teacher's parameter dtype (null: the train backend's)"
    )
    trust_remote_code: bool = param(False, help="passed to from_pretrained for the teacher")


@dataclass
class AlgorithmSection:
    advantage: Any = part("advantage", "grpo", help="advantage estimator")
    policy_loss: Any = part("policy_loss", "ppo_clip", help="policy loss")
    loss_agg: Any = part("loss_agg", "token-mean", help="loss aggregation (loss_agg_mode)")
    use_kl_loss: bool = param(False, help="add a KL-to-reference term to the loss")
    kl_loss_coef: float = param(0.001, ge=0, help="coefficient of the KL loss")
    kl_loss: Any = part("kl", "low_var_kl", help="estimator of the KL loss (kl_loss_type)")
    use_kl_in_reward: bool = param(False, help="subtract a KL penalty from token rewards")
    kl_penalty: Any = part("kl", "k1", help="estimator of the in-reward KL penalty")
    kl_ctrl: KLControlSection = param(KLControlSection(), help="in-reward KL controller")
    entropy_coeff: float = param(0.0, help="entropy bonus coefficient (loss -= coeff * entropy)")
    value_clip: float = param(
        0.5,
        gt=0,
        help="critic value-loss clip (verl's cliprange_value): values move at most this far from the "
        "old values before the clipped loss takes over; used when the advantage needs a critic",
    )
    rollout_correction: Any = part(
        "rollout_correction", None, help="off-policy correction of rollout/trainer mismatch", optional=True
    )
    sample_filter: Any = part(
        "sample_filter", None, help="group filter (DAPO dynamic sampling)", optional=True
    )
    teacher: TeacherSection | None = param(
        None,
        help="a teacher for distillation ({model, backend, dtype, trust_remote_code}); null: none. "
        "docs/distillation.md",
    )
    teacher_kl_coef: float = param(
        0.0,
        ge=0,
        help="coefficient of the teacher-KL loss term added to the policy loss (RL + distillation "
        "mixed; needs algorithm.teacher); 0: off",
    )
    teacher_kl_loss: Any = part(
        "kl",
        "k1_sf",
        help="estimator of the teacher-KL loss term (k1_sf: the reverse KL's on-policy gradient)",
    )


@dataclass
class RewardSection:
    manager: Any = part("reward_manager", "naive", help="reward manager")
    scorer: Any = part("scorer", "auto", help="default scorer")
    scorers: dict[str, Any] = field(
        default_factory=dict,
        metadata={"kind": "scorer", "help": "scorer per data source (data_source -> part)", "mapping": True},
    )
    max_failed_steps: int = param(
        3,
        ge=0,
        help="abort the run (with the last step's errors) when at least max_failed_frac of the trained "
        "samples failed (scorer or environment) in this many consecutive steps, under every runner; 0: "
        "never abort (failures are still counted in reward/failed)",
    )
    max_failed_frac: float = param(
        0.9,
        gt=0,
        le=1,
        help="share of a step's trained samples that must fail for the step to count toward "
        "max_failed_steps (1.0: only steps where every sample failed)",
    )


@dataclass
class SamplingSection:
    n: int = param(1, ge=1, help="responses per prompt")
    temperature: float = param(1.0, ge=0, help="sampling temperature (0 = greedy)")
    top_p: float = param(1.0, gt=0, le=1, help="nucleus sampling")
    top_k: int = param(-1, ge=-1, help="top-k sampling (-1 = off)")


@dataclass
class RolloutSection:
    backend: Any = part("rollout_backend", "native", help="rollout backend")
    n: int = param(4, ge=1, help="responses per prompt (n_resp_per_prompt)")
    temperature: float = param(1.0, ge=0, help="sampling temperature (0 = greedy)")
    top_p: float = param(1.0, gt=0, le=1, help="nucleus sampling")
    top_k: int = param(-1, ge=-1, help="top-k sampling (-1 = off)")
    val: SamplingSection = param(SamplingSection(n=1, temperature=0.0), help="validation sampling")
    environment: Any = part(
        "environment",
        None,
        help="environment of a multi-turn rollout (None: single-turn prompt -> response); with an agent, "
        "it judges the agent's episodes (reward, info, per-token rewards) instead of playing them",
        optional=True,
    )
    tools: list[Any] = parts("tool", [], help="tools the model may call, on top of the environment's")
    multi_turn: MultiTurnSettings = param(
        MultiTurnSettings(), help="limits and formats of multi-turn rollouts (when environment is set)"
    )
    agent: Any = part(
        "agent",
        None,
        help="your own agent, playing each episode through the run's OpenAI-compatible gateway (None: "
        "no agent); an environment set beside it judges its episodes. docs/agents.md, bring your own agent",
        optional=True,
    )
    gateway: GatewaySettings = param(
        GatewaySettings(), help="the OpenAI-compatible gateway an agent talks to (when agent is set)"
    )


@dataclass
class TrainerSection:
    backend: Any = part("train_backend", "native", help="training backend")
    total_steps: int | None = param(None, ge=1, help="training steps (default: total_epochs over the data)")
    total_epochs: int = param(1, ge=1, help="epochs over the training prompts")
    ppo_mini_batch_size: int | None = param(
        None, ge=1, help="prompts per PPO mini-batch (default: whole batch)"
    )
    ppo_epochs: int = param(1, ge=1, help="passes over each batch")
    optim: OptimSettings = param(
        OptimSettings(), help="optimizer and LR schedule (actor and critic), shared by every train backend"
    )
    micro_batch: MicroBatchSettings = param(
        MicroBatchSettings(), help="micro-batch sizes of forwards / updates, shared by every train backend"
    )
    lora: LoraSettings | None = param(
        None,
        help="train LoRA adapters on the actor instead of all its weights ({rank, alpha, dropout, "
        "target_modules}; needs the train backend's supports_lora); null: full fine-tuning. docs/lora.md",
    )
    shuffle_mini_batches: bool = param(False, help="shuffle samples before splitting into mini-batches")
    critic_warmup: int = param(0, ge=0, help="steps that train only the critic")
    val_before_train: bool = param(True, help="validate before the first step")
    test_freq: int = param(-1, ge=-1, help="validate every k steps (-1: never, except at the end)")
    save_freq: int = param(-1, ge=-1, help="checkpoint every k steps (-1: only at the end)")
    max_checkpoints: int = param(2, ge=1, help="checkpoints kept (oldest deleted)")
    keep_best: bool = param(
        True, help="also keep the checkpoint with the best val/mean (saved at a step that validated)"
    )


@dataclass
class PoolSection:
    nnodes: int = param(1, ge=1, help="nodes in the pool")
    n_gpus_per_node: int = param(0, ge=0, help="GPUs per node (0: CPU workers)")
    n_workers_per_node: int = param(1, ge=1, help="worker processes per node when CPU-only")
    threads: int | None = param(
        None,
        ge=1,
        help="ray: torch CPU threads in each worker process of this pool (None: the worker's CPUs, Ray's "
        "OMP_NUM_THREADS); a split CPU run can give the trainer every core and the rollout engine one, "
        "sharing the cores instead of halving them (docs/runners.md, Real overlap on a CPU)",
    )


@dataclass
class PlacementSection:
    name: Literal["local", "ray"] = param("local", help="'local' (one process) or 'ray' (actors)")
    address: str | None = param(None, help="Ray cluster address; None starts a local Ray")
    colocate: bool = param(True, help="rollout and training share devices")
    trainer: PoolSection = param(PoolSection(), help="trainer resource pool")
    rollout: PoolSection = param(PoolSection(), help="rollout resource pool (split mode)")
    bucket_size_mb: float = param(256.0, gt=0, help="ray: weight-sync bucket size (MB)")
    sync_timeout_s: float = param(600.0, gt=0, help="ray: seconds a weight sync may take before it fails")


@dataclass
class StageSection:
    """One stage of a staged recipe: the recipe changed by ``overrides``, run in its own folder
    ``RUN_DIR/stages/<k>-<name>/``; a stage after the first starts from the weights the one before
    it ended with (its ``final/``). docs/distillation.md, "SFT and stages"."""

    name: str = param(help="the stage's name: its folder and the metrics rows' stage field")
    overrides: list[str] = param(
        [],
        help="key=value overrides of the recipe for this stage (e.g. runner=sft, algorithm.policy_loss=nll)",
    )


@dataclass
class RecipeConfig:
    """A whole run, bound and resolved."""

    model: ModelSection = param(help="models")
    run: RunSection = param(RunSection(), help="run directory, seed, loggers")
    data: DataSection = param(DataSection(), help="prompts")
    algorithm: AlgorithmSection = param(AlgorithmSection(), help="algorithm parts")
    reward: RewardSection = param(RewardSection(), help="reward manager and scorers")
    rollout: RolloutSection = param(RolloutSection(), help="generation")
    trainer: TrainerSection = param(TrainerSection(), help="training loop")
    runner: Any = part("runner", "sync", help="the loop: sync, one_step_off, fully_async")
    placement: PlacementSection = param(PlacementSection(), help="where the parts run")
    stages: list[StageSection] = param(
        [],
        help="train in stages, one after the other in one run directory ({name, overrides} each, e.g. an "
        "sft stage, then grpo); each starts from the weights the stage before ended with; []: one stage",
    )
    resume: bool | int | Literal["latest"] = param(
        False,
        help="continue the run in run.output_dir from a checkpoint: true / latest (the newest complete one) "
        "or a step number; its saved config.yaml is the source of truth, overrides given now change it",
    )
    recipe: str | None = param(None, help="name of the recipe this came from (informational)")
    defaults: Any = param(None, help="(Hydra defaults list; ignored after composition)")
    saved_as: dict[str, Any] = field(
        default_factory=dict,
        init=False,
        repr=False,
        compare=False,
        metadata={
            "help": "(set by composition) settings an environment variable made, as the recipe wrote them "
            "(${oc.env:VAR}): what the run directory's config.yaml records instead of the value"
        },
    )

    def selections(self) -> list[Selection]:
        """Every part selected by this config (for records and checks)."""
        return [node for _, node in tree_nodes(self, leaves=(Selection,)) if isinstance(node, Selection)]

    def to_record(self) -> dict[str, Any]:
        """:meth:`to_dict` as a run directory's ``config.yaml`` records it: a setting an environment
        variable made keeps its ``${oc.env:VAR}`` form (:attr:`saved_as`), resolved again when a
        resume reads the file, so no variable's value is written into the run directory."""
        out = self.to_dict()
        for key, value in self.saved_as.items():
            *parents, leaf = key.split(".")
            node: Any = out
            for p in parents:
                node = node.get(p) if isinstance(node, dict) else None
            if isinstance(node, dict) and leaf in node:
                node[leaf] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        def conv(obj: Any) -> Any:
            if isinstance(obj, Selection):
                return obj.to_json()
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                names = [
                    f.name for f in dataclasses.fields(obj) if not (obj is self and f.name == "saved_as")
                ]
                return {name: conv(getattr(obj, name)) for name in names}
            if isinstance(obj, dict):
                return {k: conv(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [conv(v) for v in obj]
            return obj

        return conv(self)  # type: ignore[no-any-return]


def step_plan(cfg: RecipeConfig) -> StepPlan:
    """How the run is cut into trainer steps (:class:`~rlzoo.kernel.settings.StepPlan`), computed once.

    The runner's params plan it when they declare :class:`~rlzoo.kernel.protocols.PlansSteps` (fully-async:
    ``require_batches`` mini-batches per step, a push every ``trigger_parameter_sync_step`` steps);
    otherwise a step trains on ``data.train_batch_size`` prompts and pushes weights after it.
    """
    runner = cfg.runner
    if isinstance(runner, Selection) and isinstance(runner.params, PlansSteps):
        return runner.params.step_plan(cfg)
    return StepPlan(prompts_per_step=cfg.data.train_batch_size)


def mini_batches_per_step(cfg: RecipeConfig) -> int:
    """PPO mini-batches (= optimizer steps per epoch) in one trainer step.

    A trainer step trains on the step plan's prompts (:func:`step_plan`), split into mini-batches
    of ``trainer.ppo_mini_batch_size`` prompts (default: one).
    """
    prompts = step_plan(cfg).prompts_per_step
    per_mini_batch = cfg.trainer.ppo_mini_batch_size or prompts
    return max(1, math.ceil(prompts / max(1, per_mini_batch)))


def optimizer_steps(cfg: RecipeConfig, trainer_steps: int) -> int:
    """Optimizer steps of a run of ``trainer_steps``: the length of its LR schedule.

    ``trainer_steps x mini-batches per step x trainer.ppo_epochs`` (each mini-batch of each epoch
    is one optimizer step; warmup_ratio is a fraction of this count too).
    """
    return max(1, trainer_steps) * mini_batches_per_step(cfg) * max(1, cfg.trainer.ppo_epochs)


def teacher_on_rollout(cfg: RecipeConfig) -> bool:
    """Whether the teacher that a part reads is scored by a rollout engine (``algorithm.teacher.backend:
    rollout``), not loaded by the train backend."""
    t = cfg.algorithm.teacher
    return t is not None and t.backend == "rollout" and uses_teacher(cfg)


def uses_teacher(cfg: RecipeConfig) -> bool:
    """Whether a part of the recipe reads the teacher (a ``needs_teacher`` advantage, a
    ``needs_teacher_distribution`` policy loss, or the teacher-KL loss term with
    ``algorithm.teacher_kl_coef`` above 0): then the train backend loads ``algorithm.teacher``."""
    alg = cfg.algorithm
    adv, pl = alg.advantage, alg.policy_loss
    needs = isinstance(adv, Selection) and bool(getattr(adv.caps, "needs_teacher", False))
    needs = needs or (
        isinstance(pl, Selection) and bool(getattr(pl.caps, "needs_teacher_distribution", False))
    )
    return needs or alg.teacher_kl_coef > 0
