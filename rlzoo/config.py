"""Recipes: Hydra YAML that selects parts by name, bound onto typed sections.

A recipe is found by name on the search path (the working directory's ``recipes/``, paths that
plugins add through ``rlzoo_recipe_search_paths``, rlzoo's own recipes) or given as a file path.
Hydra composes it with command-line overrides (``key=value``, ``+key=value``, ``~key``). Then
:func:`bind_config` binds every section onto its dataclass, resolves every part name in its
registry and binds each part's params, and raises one :class:`ConfigError` listing every problem
with its key path. Nothing heavy (no model, no dataset) is touched.

A part selection is written as a name or as a mapping with ``name`` plus the part's params::

    algorithm:
      advantage: grpo                 # same as {name: grpo}
      policy_loss:
        name: ppo_clip
        clip_ratio_high: 0.28

On the command line (:func:`apply_part_overrides`): ``algorithm.advantage=rloo`` switches the part,
keeping the params the new part also declares and printing the ones it drops;
``'algorithm.advantage={name: gae, lam: 0.9}'`` switches and sets params; ``algorithm.advantage.lam=0.9``
or ``'algorithm.advantage={lam: 0.9}'`` set params of the current part.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.binding import bind_dataclass, coerce, field_types, to_plain
from rlzoo.errors import ConfigError
from rlzoo.params import param
from rlzoo.plugins import PluginManager, get_plugin_manager
from rlzoo.protocols import LoraSettings, MicroBatchSettings, OptimSettings, PlansSteps, StepPlan
from rlzoo.recipe_files import find_recipe, list_recipes, notice_shadowing, recipe_search_paths
from rlzoo.registry import Component


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
        """The part's typed capability record (:mod:`rlzoo.capabilities`)."""
        return self.component.caps

    def capability(self, key: str, default: Any = False) -> Any:
        return self.component.capability(key, default)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call a function part with its params: ``sel(inputs)`` == ``fn(inputs, params)``."""
        return self.fn(*args, self.params, **kwargs)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "plugin": self.component.plugin, **(to_plain(self.params) or {})}


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------
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
    seed: int = param(0, help="seed for data order, sampling and initialisation")
    loggers: list[Any] = parts(
        "logger",
        ["console", "jsonl", "tensorboard"],
        help="metric sinks (kind logger): console, jsonl, tensorboard, wandb, mlflow; each a name or {name, params}",
    )
    export_every: int = param(
        0, help="also write the model as an HF folder RUN_DIR/export/step_K/ every K steps (0: final/ only)"
    )
    progress: bool = param(True, help="show a progress bar")


@dataclass
class ModelSection:
    path: str = param(help="HF model name or local path of the actor (and rollout) model")
    tokenizer_path: str | None = param(None, help="tokenizer path (defaults to model.path)")
    critic_path: str | None = param(
        None, help="model the critic is initialised from (defaults to model.path)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = param("float32", help="parameter dtype")
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


@dataclass
class KLControlSection:
    type: Literal["fixed", "adaptive"] = param("fixed", help="KL-in-reward controller")
    kl_coef: float = param(0.001, ge=0, help="initial / fixed coefficient")
    target_kl: float = param(0.1, gt=0, help="adaptive: target KL")
    horizon: int = param(10000, ge=1, help="adaptive: horizon")


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
        help="abort the run (with the scorer's last error) when at least max_failed_frac of the samples "
        "failed scoring in this many consecutive steps; 0: never abort (failures are still counted in "
        "reward/failed)",
    )
    max_failed_frac: float = param(
        0.9,
        gt=0,
        le=1,
        help="share of a step's scored samples that must fail for the step to count toward "
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
        help="environment of a multi-turn rollout (None: single-turn prompt -> response)",
        optional=True,
    )
    tools: list[Any] = parts("tool", [], help="tools the model may call, on top of the environment's")
    multi_turn: MultiTurnSettings = param(
        MultiTurnSettings(), help="limits and formats of multi-turn rollouts (when environment is set)"
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
    resume: bool | int | Literal["latest"] = param(
        False,
        help="continue the run in run.output_dir from a checkpoint: true / latest (the newest complete one) "
        "or a step number; its saved config.yaml is the source of truth, overrides given now change it",
    )
    recipe: str | None = param(None, help="name of the recipe this came from (informational)")
    defaults: Any = param(None, help="(Hydra defaults list; ignored after composition)")

    def selections(self) -> list[Selection]:
        """Every part selected by this config (for records and checks)."""
        out: list[Selection] = []

        def walk(obj: Any) -> None:
            if isinstance(obj, Selection):
                out.append(obj)
            elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                for f in dataclasses.fields(obj):
                    walk(getattr(obj, f.name))
            elif isinstance(obj, dict):
                for v in obj.values():
                    walk(v)
            elif isinstance(obj, list):
                for v in obj:
                    walk(v)

        walk(self)
        return out

    def to_dict(self) -> dict[str, Any]:
        def conv(obj: Any) -> Any:
            if isinstance(obj, Selection):
                return obj.to_json()
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
            if isinstance(obj, dict):
                return {k: conv(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [conv(v) for v in obj]
            return obj

        return conv(self)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# Binding
# ---------------------------------------------------------------------------------------------
def bind_part(
    kind: str,
    value: Any,
    key: str,
    problems: list[str],
    pm: PluginManager,
    *,
    optional: bool = False,
) -> Selection | None:
    """Resolve one part selection (a name, or a mapping with ``name`` and params)."""
    if isinstance(value, Selection):
        return value
    if value is None or (value == "none" and optional and "none" not in pm.registry(kind)):
        if not optional:
            problems.append(f"{key}: a {kind} is required (set {key}.name)")
        return None
    if isinstance(value, str):
        name, raw_params = value, {}
    elif isinstance(value, Mapping):
        raw_params = {k: v for k, v in value.items() if k != "name"}
        got = value.get("name")
        if not isinstance(got, str):
            problems.append(f"{key}.name: missing; name one of: {', '.join(pm.registry(kind).names())}")
            return None
        name = got
    else:
        problems.append(f"{key}: expected a {kind} name or a mapping with 'name', got {value!r}")
        return None
    registry = pm.registry(kind)
    if name not in registry:
        problems.append(f"{key}.name: {registry.unknown_message(name, key=key + '.name')}")
        return None
    comp = registry.get(name)
    if comp.params is None:
        if raw_params:
            hints = "".join(
                _unknown_param_hint(kind, key, name, str(k), registry) for k in sorted(raw_params)
            )
            problems.append(
                f"{key}: {kind} {name!r} takes no params, got {', '.join(sorted(raw_params))}{hints}"
            )
        return Selection(kind, key, comp.name, comp, None)
    before = len(problems)
    bound = bind_dataclass(comp.params, raw_params, key, problems, what=f"{kind} {name!r}")
    declared = {f.name for f in dataclasses.fields(comp.params)}
    for k in raw_params:
        if k in declared:
            continue
        hint = _unknown_param_hint(kind, key, name, str(k), registry)
        for i in range(before, len(problems)):
            if hint and problems[i].startswith(f"{key}.{k}: unknown key"):
                problems[i] += hint
    return Selection(kind, key, comp.name, comp, bound)


#: Backend params that became trainer settings shared by every train backend (old name -> new key).
MOVED_TO_TRAINER: Mapping[str, str] = {
    **{f.name: f"trainer.optim.{f.name}" for f in dataclasses.fields(OptimSettings)},
    "micro_batch_size": "trainer.micro_batch.size",
    "max_tokens_per_micro_batch": "trainer.micro_batch.max_tokens",
    "log_prob_micro_batch_size": "trainer.micro_batch.log_prob_size",
}


def _unknown_param_hint(kind: str, key: str, name: str, param_name: str, registry: Any) -> str:
    """Where an unknown param of part ``name`` does exist: a trainer setting, or other parts."""
    if kind == "train_backend" and param_name in MOVED_TO_TRAINER:
        return (
            f" ({param_name} is a trainer setting shared by every train backend: "
            f"set {MOVED_TO_TRAINER[param_name]})"
        )
    others = [
        c.name
        for c in registry
        if c.name != name
        and c.params is not None
        and param_name in {f.name for f in dataclasses.fields(c.params)}
    ]
    if not others:
        return ""
    return (
        f" ({param_name} is a param of {kind} {', '.join(repr(o) for o in others)}; "
        f"select one with {key}={others[0]} {key}.{param_name}=...)"
    )


def _custom_binder(pm: PluginManager) -> Any:
    def custom(f: dataclasses.Field[Any], value: Any, path: str, problems: list[str]) -> Any:
        kind = f.metadata.get("kind")
        if kind is None:
            hint = field_types_cache.get(f.type)  # nested dataclass sections
            if hint is not None:
                return bind_dataclass(hint, value or {}, path, problems, custom=custom)
            return NotImplemented
        if f.metadata.get("sequence"):
            return _bind_sequence(kind, value, path, problems, pm)
        if f.metadata.get("mapping"):
            if not isinstance(value, Mapping):
                problems.append(f"{path}: expected a mapping of data_source -> {kind}")
                return {}
            return {k: bind_part(kind, v, f"{path}.{k}", problems, pm) for k, v in value.items()}
        return bind_part(kind, value, path, problems, pm, optional=f.metadata.get("optional", False))

    return custom


def _bind_sequence(kind: str, value: Any, path: str, problems: list[str], pm: PluginManager) -> list[Any]:
    """A list of part selections (``run.loggers``): each entry bound like a single part."""
    if isinstance(value, (str, Mapping)) or not isinstance(value, (list, tuple)):
        problems.append(f"{path}: expected a list of {kind} names, e.g. [console, jsonl], got {value!r}")
        return []
    bound = [bind_part(kind, v, f"{path}[{i}]", problems, pm) for i, v in enumerate(value)]
    return [b for b in bound if b is not None]


field_types_cache: dict[Any, type] = {}


def _register_sections(cls: type) -> None:
    for name, tp in field_types(cls).items():
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            field_types_cache[tp] = tp
            field_types_cache[tp.__name__] = tp
            _register_sections(tp)
        del name


_register_sections(RecipeConfig)


def bind_config(raw: Mapping[str, Any], pm: PluginManager | None = None) -> RecipeConfig:
    """Bind a composed recipe (plain mapping) onto :class:`RecipeConfig`; one error lists all problems."""
    pm = pm or get_plugin_manager()
    problems: list[str] = []
    custom = _custom_binder(pm)
    raw = dict(raw)
    raw.pop("hydra", None)
    cfg = bind_dataclass(RecipeConfig, raw, "", problems, what="the recipe", custom=custom)
    probe = cfg
    if cfg is None and _missing_required(RecipeConfig, raw):
        # a required section is missing (reported above): bind again with placeholders for it, so
        # that the rest of the recipe is checked in this same report, not in a second round
        probe = bind_dataclass(RecipeConfig, _with_placeholders(RecipeConfig, raw), "", [], custom=custom)
    # defaults that were not given in the recipe are still mappings: resolve them too
    if probe is not None:
        _resolve_defaults(probe, "", problems if cfg is not None else [], pm)
        # ranges and cross-field rules too, in the same report: a rule whose inputs failed to
        # bind is skipped (their problem is already listed)
        from rlzoo.checks import all_range_problems, check_consistency, check_notices

        problems += all_range_problems(probe)
        problems += check_consistency(probe)
        if not problems:
            for note in check_notices(probe):
                print(f"rlzoo: note: {note}", file=sys.stderr, flush=True)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return cfg  # type: ignore[no-any-return]


def _missing_required(cls: type, raw: Mapping[str, Any]) -> bool:
    return any(
        f.name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(cls)
        if f.init
    )


def _with_placeholders(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with every missing required field filled by a placeholder (a nested dataclass's own
    required fields too): only to run the remaining checks of a recipe already known to be invalid."""
    out = dict(raw)
    for f in dataclasses.fields(cls):
        if not f.init or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        value = out.get(f.name)
        typ = f.type if isinstance(f.type, type) else globals().get(str(f.type))
        if isinstance(typ, type) and dataclasses.is_dataclass(typ):
            out[f.name] = _with_placeholders(typ, value if isinstance(value, Mapping) else {})
        elif f.name not in out:
            out[f.name] = "<missing>"
    return out


def _resolve_defaults(obj: Any, path: str, problems: list[str], pm: PluginManager) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        sub = f"{path}.{f.name}" if path else f.name
        kind = f.metadata.get("kind")
        if kind is not None and f.metadata.get("sequence"):
            if any(isinstance(v, (str, Mapping)) for v in value or ()):  # a default never bound
                setattr(obj, f.name, _bind_sequence(kind, value, sub, problems, pm))
        elif kind is not None and not f.metadata.get("mapping"):
            if isinstance(value, (str, Mapping)):  # a default never bound (None: failed or off)
                setattr(
                    obj,
                    f.name,
                    bind_part(kind, value, sub, problems, pm, optional=f.metadata.get("optional", False)),
                )
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            _resolve_defaults(value, sub, problems, pm)


def step_plan(cfg: RecipeConfig) -> StepPlan:
    """How the run is cut into trainer steps (:class:`~rlzoo.protocols.StepPlan`), computed once.

    The runner's params plan it when they declare :class:`~rlzoo.protocols.PlansSteps` (fully-async:
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


# ---------------------------------------------------------------------------------------------
# Recipe loading (Hydra)
# ---------------------------------------------------------------------------------------------
def compose_recipe(
    name: str, overrides: Sequence[str] = (), pm: PluginManager | None = None
) -> dict[str, Any]:
    """Compose a recipe with Hydra and return it as a resolved plain mapping."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from rlzoo.overrides import apply_part_overrides, split_part_overrides

    pm = pm or get_plugin_manager()
    path = find_recipe(name, pm)
    notice_shadowing(name, path, pm)
    search = [d for d in recipe_search_paths(pm) if d.is_dir() and d != path.parent]
    # part selections (`algorithm.advantage=rloo`, `trainer.backend.lr=...`) are applied after
    # composition, by switch_part(); everything else goes to Hydra.
    part_ovr, rest = split_part_overrides(overrides)
    # `key=value` may set any key the typed sections know, present in the recipe or not: force-add
    # it (`++`) and let bind_config report keys that do not exist, with a did-you-mean.
    ovr = [o if o.startswith(("+", "~", "hydra.")) or "=" not in o else "++" + o for o in rest]
    if search:
        ovr.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in search) + "]")
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            cfg = compose(config_name=path.stem, overrides=ovr)
    except Exception as exc:
        raise ConfigError([_chain(exc)], header=f"cannot compose recipe {name!r} ({path})") from exc
    apply_part_overrides(cfg, part_ovr, pm)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:
        raise ConfigError([f"{type(exc).__name__}: {exc}"], header=f"cannot resolve recipe {name!r}") from exc
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    plain.setdefault("recipe", path.stem)
    return plain  # type: ignore[return-value]


def _chain(exc: BaseException) -> str:
    """An exception and its causes in one line (Hydra wraps the useful message)."""
    parts = []
    e: BaseException | None = exc
    while e is not None:
        text = str(e).strip()
        if text:
            parts.append(f"{type(e).__name__}: {text}")
        e = e.__cause__ or e.__context__
    return " <- ".join(parts) or type(exc).__name__


def load_config(
    recipe: str | Mapping[str, Any] | RecipeConfig = "quickstart",
    overrides: Sequence[str] = (),
    pm: PluginManager | None = None,
) -> RecipeConfig:
    """Recipe name / path / mapping / bound config -> validated :class:`RecipeConfig`."""
    pm = pm or get_plugin_manager()
    if isinstance(recipe, RecipeConfig):
        if overrides:
            raw = apply_overrides(recipe.to_dict(), overrides, pm)
            return bind_config(raw, pm)
        return recipe
    if isinstance(recipe, Mapping):
        raw = apply_overrides(dict(recipe), overrides, pm) if overrides else dict(recipe)
        return bind_config(raw, pm)
    return bind_config(compose_recipe(recipe, overrides, pm), pm)


def apply_overrides(
    raw: Mapping[str, Any], overrides: Sequence[str], pm: PluginManager | None = None
) -> dict[str, Any]:
    """Apply ``key=value`` overrides to a plain mapping (OmegaConf dotlist semantics; part
    selections as :func:`apply_part_overrides` does)."""
    from omegaconf import OmegaConf

    from rlzoo.overrides import apply_part_overrides, split_part_overrides

    part_ovr, overrides = split_part_overrides(overrides)
    base = OmegaConf.create(to_plain(dict(raw)))
    dot = [o.lstrip("+") for o in overrides if not o.startswith("~")]
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(dot))
    apply_part_overrides(merged, part_ovr, pm or get_plugin_manager())
    for o in overrides:
        if o.startswith("~"):
            parent, _, leaf = o[1:].rpartition(".")
            node = OmegaConf.select(merged, parent) if parent else merged
            if node is not None and leaf in node:
                del node[leaf]  # type: ignore[arg-type]
    out = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]


__all__ = [
    "AlgorithmSection",
    "DataSection",
    "ModelSection",
    "PlacementSection",
    "RecipeConfig",
    "RewardSection",
    "RolloutSection",
    "RunSection",
    "Selection",
    "TrainerSection",
    "bind_config",
    "bind_part",
    "coerce",
    "compose_recipe",
    "find_recipe",
    "list_recipes",
    "load_config",
    "mini_batches_per_step",
    "optimizer_steps",
    "part",
    "recipe_search_paths",
    "step_plan",
]
