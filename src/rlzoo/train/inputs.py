"""Inputs: data preparation, the checks that run before any model loads, tokenizer, specs, datasets.

Everything here reads the recipe: it is the edge where a :class:`~rlzoo.recipe.types.RecipeConfig` turns
into the flat objects the loop and the backends take. :func:`run_inputs` reads it once, in the order
that fails fast, into a frozen :class:`RunInputs`, from which :class:`~rlzoo.train.session.Session` is
built; nothing after that reads the recipe.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from rlzoo.agents.chat import ChatTemplate
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.gateway.settings import GatewaySettings
from rlzoo.kernel.errors import ConfigError, RlzooError
from rlzoo.kernel.protocols import Agent, Environment, JudgedMetric, SamplingParams, Tool
from rlzoo.kernel.settings import MicroBatchSettings, RolloutSpec, StepPlan, TeacherModel, TrainSpec
from rlzoo.recipe.types import (
    PlacementSection,
    RecipeConfig,
    SamplesSection,
    Selection,
    optimizer_steps,
    step_plan,
    teacher_on_rollout,
    uses_teacher,
)
from rlzoo.train.batching import sampling_params
from rlzoo.train.failures import RewardFailures
from rlzoo.train.rewards import PartNames, build_reward_manager
from rlzoo.train.update import TrainerSetup, trainer_setup
from rlzoo.train_kit.fastest import MicroBatchChoice, choose_bf16, machine_micro_batch

logger = logging.getLogger("rlzoo")


def expand(p: str) -> str:
    return str(Path(p).expanduser())


def ensure_data(cfg: RecipeConfig) -> None:
    """Run ``data.prepare`` when a training file (or the model it ships) is missing."""
    files = [expand(f) for f in [*cfg.data.train_files, *cfg.data.val_files]]
    missing = [f for f in files if not Path(f).exists()]
    model_missing = _is_local_path(cfg.model.path) and not Path(expand(cfg.model.path)).exists()
    if not missing and not model_missing:
        return
    prep = cfg.data.prepare
    if not isinstance(prep, Selection):
        return  # check_inputs reports the missing files
    if not cfg.data.dir:
        raise ConfigError(["data.dir: data.prepare needs data.dir, the folder it writes into"])
    out = Path(expand(cfg.data.dir))
    out.mkdir(parents=True, exist_ok=True)
    logger.info("preparing dataset %r into %s", prep.name, out)
    prep.fn(out, prep.params)


def _is_local_path(p: str) -> bool:
    return p.startswith(("/", "./", "../", "~")) or Path(expand(p)).exists()


def check_inputs(cfg: RecipeConfig) -> None:
    """Model path, tokenizer chat template, dataset columns: clear errors before a model loads."""
    problems: list[str] = []
    for key, path in (("model.path", cfg.model.path), ("model.tokenizer_path", cfg.model.tokenizer_path)):
        if path and _is_local_path(path) and not Path(expand(path)).exists():
            problems.append(
                f"{key}: {path!r} does not exist (give a local folder with config.json, or a hub name)"
            )
    user_files = cfg.data.custom_cls is not None  # the user's dataset class reads its files itself
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for f in [] if user_files else files:
            if not Path(expand(f)).exists():
                problems.append(
                    f"{key}: {f!r} does not exist (prepare it with `rlzoo prepare NAME` or set data.prepare)"
                )
    if problems:
        raise ConfigError(problems, header="inputs missing")
    from rlzoo.data.schema import validate_files

    for files in (cfg.data.train_files, cfg.data.val_files):
        if files and not user_files:
            validate_files([expand(f) for f in files], prompt_key=cfg.data.prompt_key)


def load_tokenizer(cfg: RecipeConfig) -> Any:
    from rlzoo.data.tokenizer import load_tokenizer as _load

    path = expand(cfg.model.tokenizer_path or cfg.model.path)
    try:
        tok = _load(path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as exc:
        raise RlzooError(f"cannot load the tokenizer from {path!r}: {exc}") from exc
    if cfg.data.apply_chat_template and not getattr(tok, "chat_template", None):
        raise RlzooError(
            f"the tokenizer at {path!r} has no chat template; give a tokenizer with one "
            "(tokenizer_config.json 'chat_template') or set data.apply_chat_template=false"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_processor(cfg: RecipeConfig) -> Any:
    """The multimodal processor of a vision-language model (its config has a ``vision_config``,
    e.g. Qwen2.5-VL), loaded from the tokenizer's folder; None for a text model."""
    from rlzoo.models.processor import has_vision_config
    from rlzoo.models.processor import load_processor as _load

    model_path = expand(cfg.model.path)
    try:
        is_vl = has_vision_config(model_path, cfg.model.trust_remote_code)
    except Exception as exc:  # no readable config: a text model as far as inputs go
        logger.debug("no model config at %r (%s): no processor", model_path, exc)
        return None
    if not is_vl:
        return None
    path = expand(cfg.model.tokenizer_path or cfg.model.path)
    try:
        return _load(path, cfg.model.trust_remote_code)
    except Exception as exc:
        raise RlzooError(
            f"cannot load the processor of the vision-language model from {path!r}: {exc}"
        ) from exc


def eos_ids(tokenizer: Any, model_path: str) -> tuple[int, ...]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        from transformers import GenerationConfig

        gc = GenerationConfig.from_pretrained(model_path)
        e = gc.eos_token_id
        ids.update([e] if isinstance(e, int) else list(e or []))
    except Exception:
        pass
    return tuple(sorted(ids))


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def micro_batch_settings(cfg: RecipeConfig, announce: bool = True) -> MicroBatchSettings:
    """``trainer.micro_batch`` with its null sizes chosen for this machine
    (:func:`rlzoo.train_kit.fastest.choose_micro_batch`); sizes the recipe sets are kept. The choice
    and its reason are printed (``announce``)."""
    mb = cfg.trainer.micro_batch
    if mb.size is not None and mb.log_prob_size is not None:
        return mb
    device = resolve_device(cfg.model.device)
    seq_len = cfg.data.max_prompt_length + cfg.data.max_response_length
    if cfg.rollout.environment is not None:  # multi-turn: earlier turns ride in the prompt
        seq_len += cfg.data.max_response_length
    rows = (cfg.trainer.ppo_mini_batch_size or cfg.data.train_batch_size) * cfg.rollout.n  # an update's
    batch_rows = cfg.data.train_batch_size * cfg.rollout.n  # a log-prob pass's
    if device == "cpu":
        choice = machine_micro_batch(expand(cfg.model.path), seq_len, rows, batch_rows, mb.log_prob_chunk)
    else:
        choice = MicroBatchChoice(
            mb.FALLBACK_SIZE,
            mb.FALLBACK_LOG_PROB_SIZE,
            f"sizes are chosen from host memory for CPU training only (device {device}): the fallback",
        )
    out = dataclasses.replace(
        mb,
        size=mb.size if mb.size is not None else choice.size,
        log_prob_size=mb.log_prob_size if mb.log_prob_size is not None else choice.log_prob_size,
    )
    if announce:
        chosen = [
            f"{k} {v}{'' if getattr(mb, k) is None else ' (set)'}"
            for k, v in (("size", out.size), ("log_prob_size", out.log_prob_size))
        ]
        print(
            f"rlzoo: trainer.micro_batch: {', '.join(chosen)} -- chosen: {choice.reason} "
            "(set trainer.micro_batch.size / log_prob_size to choose yourself)",
            flush=True,
        )
    return out


def rollout_dtype(cfg: RecipeConfig, announce: bool = True) -> str:
    """``model.dtype``, with ``auto`` resolved: bfloat16 where the device computes it natively
    (:func:`rlzoo.train_kit.fastest.choose_bf16`), float32 elsewhere; printed (``announce``)."""
    if cfg.model.dtype != "auto":
        return cfg.model.dtype
    device = resolve_device(cfg.model.device)
    bf16, why = choose_bf16(device)
    dtype = "bfloat16" if bf16 else "float32"
    if announce:
        print(f"rlzoo: model.dtype: auto -> {dtype} ({why})", flush=True)
    return dtype


def train_spec(cfg: RecipeConfig, total_steps: int, tokenizer: Any, announce: bool = True) -> TrainSpec:
    adv = cfg.algorithm.advantage
    return TrainSpec(
        model_path=expand(cfg.model.path),
        seed=cfg.run.seed,
        need_reference=cfg.algorithm.use_kl_loss or cfg.algorithm.use_kl_in_reward,
        need_critic=bool(isinstance(adv, Selection) and adv.capability("needs_critic")),
        critic_model_path=expand(cfg.model.critic_path) if cfg.model.critic_path else None,
        total_steps=optimizer_steps(cfg, total_steps),  # total_steps counts trainer steps
        trust_remote_code=cfg.model.trust_remote_code,
        pad_token_id=int(tokenizer.pad_token_id),
        temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
        optim=cfg.trainer.optim,
        micro_batch=micro_batch_settings(cfg, announce),
        lora=cfg.trainer.lora,
        teacher=None if teacher_on_rollout(cfg) else teacher_model(cfg, tokenizer),
    )


def teacher_rollout_spec(cfg: RecipeConfig, tokenizer: Any) -> RolloutSpec | None:
    """The spec of the teacher's own engine when ``algorithm.teacher.backend`` is ``rollout`` (the
    rollout engine's, with the teacher's folder, dtype and remote code, and room for the one token
    a prompt-log-prob request generates); None otherwise."""
    if not teacher_on_rollout(cfg):
        return None
    teacher = teacher_model(cfg, tokenizer)
    assert teacher is not None
    spec = rollout_spec(cfg, tokenizer)
    return dataclasses.replace(
        spec,
        model_path=teacher.path,
        tokenizer_path=teacher.path,
        dtype=teacher.dtype or spec.dtype,
        trust_remote_code=teacher.trust_remote_code,
        max_response_length=spec.max_response_length + 1,
        lora=None,
    )


def teacher_model(cfg: RecipeConfig, tokenizer: Any) -> TeacherModel | None:
    """The teacher the train backend loads: ``algorithm.teacher`` when a part reads its log-probs.

    Its tokenizer must be the student's (``tokenizer``), checked here before any model loads (a hub
    name or a folder that did not exist at ``validate``): the first differing token is named."""
    from rlzoo.data.tokenizer import load_tokenizer, vocabulary_difference

    t = cfg.algorithm.teacher
    if t is None or not uses_teacher(cfg):
        return None
    path = expand(t.model)
    if path.startswith(("/", ".")) and not Path(path).exists():
        raise ConfigError(
            [
                f"algorithm.teacher.model: no folder at {path!r}; train the teacher first (e.g. `rlzoo train "
                "quickstart run.output_dir=DIR` writes DIR/final; benchmarks/distill.py makes distill_quickstart's) "
                "or give another model folder with the student's tokenizer"
            ]
        )
    try:
        teacher_tok = load_tokenizer(path, trust_remote_code=t.trust_remote_code)
    except Exception as exc:
        raise ConfigError(
            [
                f"algorithm.teacher.model: no tokenizer at {path!r} ({exc}); the teacher is a model folder "
                "(Hugging Face, an rlzoo run's final/ or export/step_K) with the student's tokenizer"
            ]
        ) from exc
    diff = vocabulary_difference(tokenizer, teacher_tok)
    if diff is not None:
        raise ConfigError(
            [f"algorithm.teacher.model: the teacher's tokenizer differs from the student's: {diff}"]
        )
    return TeacherModel(path=path, dtype=t.dtype, trust_remote_code=t.trust_remote_code)


def rollout_spec(cfg: RecipeConfig, tokenizer: Any) -> RolloutSpec:
    return RolloutSpec(
        model_path=expand(cfg.model.path),
        tokenizer_path=expand(cfg.model.tokenizer_path or cfg.model.path),
        seed=cfg.run.seed,
        dtype=rollout_dtype(cfg),
        device=resolve_device(cfg.model.device),
        trust_remote_code=cfg.model.trust_remote_code,
        # multi-turn: each turn's prompt is the trajectory so far (prompt + earlier turns)
        max_prompt_length=cfg.data.max_prompt_length
        + (cfg.data.max_response_length if _multi_turn(cfg) else 0),
        max_response_length=cfg.data.max_response_length,
        eos_token_ids=eos_ids(tokenizer, expand(cfg.model.path)),
        pad_token_id=int(tokenizer.pad_token_id),
        lora=cfg.trainer.lora,
    )


def build_datasets(cfg: RecipeConfig, tokenizer: Any, processor: Any = None) -> tuple[Any, Any | None]:
    """Train and validation :class:`~rlzoo.data.dataset.PromptDataset` (``processor``: a VL model's,
    see :func:`load_processor`; it renders image placeholders and counts expanded image tokens)."""
    from rlzoo.data.dataset import PromptDataset

    def make(files: Sequence[str]) -> Any:
        return PromptDataset(
            [expand(f) for f in files],
            tokenizer,
            prompt_key=cfg.data.prompt_key,
            max_prompt_length=cfg.data.max_prompt_length,
            truncation=cfg.data.truncation,
            strict=cfg.data.strict,
            apply_chat_template=cfg.data.apply_chat_template,
            chat_template_kwargs=cfg.data.chat_template_kwargs,
            processor=processor,
            user_dataset=user_dataset(cfg, files, tokenizer, processor),
        )

    train = make(cfg.data.train_files)
    if len(train) < cfg.data.train_batch_size:
        raise ConfigError(
            [
                f"data.train_batch_size: {cfg.data.train_batch_size} prompts per step, but the training data has "
                f"only {len(train)} usable prompts"
            ]
        )
    val = make(cfg.data.val_files) if cfg.data.val_files else None
    return train, val


def data_config(cfg: RecipeConfig, extra: Mapping[str, Any]) -> Any:
    """The data section as verl's classes are given it (``config`` / ``data_config``), ``extra`` on top."""
    from rlzoo.data.user_file import verl_config
    from rlzoo.kernel.binding import to_plain

    d = cfg.data
    section = {
        k: to_plain(getattr(d, k))
        for k in (
            "train_files", "val_files", "prompt_key", "max_prompt_length", "max_response_length",
            "train_batch_size", "val_batch_size", "shuffle", "truncation", "apply_chat_template",
            "chat_template_kwargs",
        )
    }  # fmt: skip
    section["seed"] = cfg.run.seed
    return verl_config(section, extra)


def user_dataset(cfg: RecipeConfig, files: Sequence[str], tokenizer: Any, processor: Any) -> Any:
    """The user's dataset class (``data.custom_cls``) built over ``files`` as verl builds it; None
    without one."""
    user = cfg.data.custom_cls
    if user is None:
        return None
    from rlzoo.data.user_file import load_class

    try:
        cls = load_class(user.path, user.name)
        return cls(
            data_files=[expand(f) for f in files],
            tokenizer=tokenizer,
            processor=processor,
            config=data_config(cfg, user.config),
        )
    except Exception as exc:
        raise RlzooError(
            f"data.custom_cls: {user.name}(data_files=..., tokenizer=..., processor=..., config=...) from "
            f"{user.path!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def sampler_factory(cfg: RecipeConfig) -> Callable[[Any], Any] | None:
    """``dataset -> the user's sampler over it`` (``data.sampler``), built as verl builds it; None
    without one. Each prompt loader gets its own."""
    user = cfg.data.sampler
    if user is None:
        return None

    def make(dataset: Any) -> Any:
        from rlzoo.data.user_file import load_class

        try:
            cls = load_class(user.path, user.name)
            return cls(data_source=dataset, data_config=data_config(cfg, user.config))
        except Exception as exc:
            raise RlzooError(
                f"data.sampler: {user.name}(data_source=..., data_config=...) from {user.path!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    return make


def resume_step(value: Any) -> int | bool | None:
    """``resume``: False (fresh run), True / ``latest`` (newest good checkpoint) or a step number."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("", "false", "no")):
        return False
    if value is True or (isinstance(value, str) and value.lower() in ("true", "latest", "yes")):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(
            [f"resume: {value!r} is not true/false, 'latest' or a checkpoint step number"]
        ) from None


# ---------------------------------------------------------------------------------------------
# RunInputs: the recipe, read once
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """When the loop does what."""

    plan: StepPlan  # prompts per step, the weight-push cadence, a step limit
    total_steps: int  # trainer steps of the run (trainer.total_steps, or total_epochs over the data)
    validate_before_train: bool
    test_freq: int  # validate every k steps (-1: only at the end)
    save_freq: int  # checkpoint every k steps (-1: only at the end)
    export_every: int  # an HF folder export/step_K/ every k steps (0: only final/)


@dataclass(frozen=True)
class Data:
    """The prompts and how they read: the tokenizer (a VL model's processor), the datasets."""

    tokenizer: Any
    processor: Any  # None for a text model
    train: Any  # rlzoo.data.dataset.PromptDataset
    val: Any | None  # None: no validation data
    shuffle: bool  # shuffle the training prompts each epoch
    sampler: Callable[[Any], Any] | None  # data.sampler: dataset -> the user's sampler (None: shuffle)
    val_batch_size: int | None  # prompts per validation batch (None: all at once)
    max_response_length: int  # tokens after the prompt (a multi-turn trajectory's whole budget)
    pad_token_id: int
    chat_template_kwargs: Mapping[str, Any]  # extra arguments of every apply_chat_template call
    max_prompt_length: int = 0  # data.max_prompt_length (0: unknown); a demonstration's prompt limit


@dataclass(frozen=True)
class Sampling:
    """How responses are sampled; each request's seed comes from ``seed``, the step and the round."""

    train: SamplingParams  # rollout.{n, temperature, top_p, top_k}, no seed
    val: SamplingParams  # rollout.val.*, no seed
    seed: int  # run.seed


@dataclass(frozen=True)
class Reward:
    """Scoring: the reward manager, its failure counter, the sample filter, the greedy baseline."""

    manager: Any
    failures: RewardFailures  # counts failed samples per step; aborts per reward.max_failed_*
    sample_filter: Selection | None
    filter_metric: str  # what the filter judges (sample_filter.metric, else "reward")
    greedy_baseline: bool  # the advantage needs one greedy response per prompt
    names: PartNames = PartNames()  # the parts a failed sample blames (manager, scorers, environment)


@dataclass(frozen=True)
class AgentSetup:
    """Multi-turn trajectories (``rollout.environment``): composed over the rollout engine."""

    make_env: Callable[[], Environment]  # one environment per trajectory
    tools: tuple[Tool, ...]  # rollout.tools, on top of each environment's own
    settings: MultiTurnSettings
    env_name: str  # the environment's part name (failures name it)
    max_prompt_length: int  # data.max_prompt_length: a longer first observation fails its trajectory


@dataclass(frozen=True)
class GatewaySetup:
    """A user's agent (``rollout.agent``) playing episodes through the gateway over the engine."""

    make_agent: Callable[[], Agent]  # one agent per episode
    settings: GatewaySettings
    multi_turn: MultiTurnSettings
    agent_name: str
    max_prompt_length: int
    #: rollout.environment beside the agent: it judges each episode (None: the agent or the scorer)
    make_env: Callable[[], Environment] | None = None
    env_name: str | None = None


@dataclass(frozen=True)
class BackendSetup:
    """What the placement builds, and the trainer over the train backend."""

    placement: PlacementSection
    train: Selection
    train_spec: TrainSpec
    rollout: Selection
    rollout_spec: RolloutSpec
    agent: AgentSetup | None  # None: single-turn
    gateway: GatewaySetup | None  # rollout.agent: episodes through the gateway (None: no agent)
    trainer: TrainerSetup
    #: the teacher's own engine of the rollout backend (algorithm.teacher.backend: rollout); None: none
    teacher_spec: RolloutSpec | None = None


@dataclass(frozen=True)
class RunInputs:
    """Everything a :class:`~rlzoo.train.session.Session` is built from (:func:`run_inputs`)."""

    runner_name: str
    recipe: str | None  # the recipe's name, for the resume command
    resume_at: int | bool | None  # resume_step(cfg.resume): False fresh, None latest, or a step
    resume_info: Any  # rlzoo.recipe.compose.Run.resume_info (a resume from a saved config.yaml)
    max_checkpoints: int
    keep_best: bool
    loggers: tuple[Any, ...]
    progress: bool
    samples: SamplesSection  # run.samples: what the model wrote, kept as Parquet (rlzoo.train.samples)
    schedule: Schedule
    data: Data
    sampling: Sampling
    reward: Reward
    backends: BackendSetup


def run_inputs(cfg: RecipeConfig, resume_info: Any = None) -> RunInputs:
    """Read the recipe once, in the order that fails fast: data prepared if asked, inputs checked
    (model / tokenizer / dataset columns), tokenizer, datasets, the reward manager, the specs and a
    multi-turn chat template probed, all before any model loads."""
    resume_at = resume_step(cfg.resume)
    ensure_data(cfg)
    check_inputs(cfg)
    tokenizer = load_tokenizer(cfg)
    processor = load_processor(cfg)  # None for a text model
    train, val = build_datasets(cfg, tokenizer, processor)
    sampler = sampler_factory(cfg)
    if sampler is not None:
        sampler(train)  # a constructor that fails does before any model loads
    plan = step_plan(cfg)
    per_epoch = max(1, len(train) // plan.prompts_per_step)
    if plan.step_limit is not None:
        total_steps = plan.step_limit
    else:
        total_steps = cfg.trainer.total_steps or per_epoch * cfg.trainer.total_epochs
    flt: Selection | None = cfg.algorithm.sample_filter
    reward = Reward(
        manager=build_reward_manager(cfg),
        failures=RewardFailures(cfg.reward.max_failed_steps, cfg.reward.max_failed_frac),
        sample_filter=flt,
        filter_metric=flt.params.metric if flt and isinstance(flt.params, JudgedMetric) else "reward",
        greedy_baseline=bool(cfg.algorithm.advantage.capability("needs_greedy_baseline")),
        names=PartNames.of(cfg),
    )
    spec = rollout_spec(cfg, tokenizer)
    agent = agent_setup(cfg)
    gateway = gateway_setup(cfg)
    if (
        agent is not None or gateway is not None
    ):  # a template that cannot do multi-turn fails before any model loads
        ChatTemplate(tokenizer, stop_ids=spec.eos_token_ids).probe()
    runner = cfg.runner
    return RunInputs(
        runner_name=runner.name if isinstance(runner, Selection) else "runner",
        recipe=cfg.recipe,
        resume_at=resume_at,
        resume_info=resume_info,
        max_checkpoints=cfg.trainer.max_checkpoints,
        keep_best=cfg.trainer.keep_best,
        loggers=tuple(cfg.run.loggers),
        progress=cfg.run.progress,
        samples=cfg.run.samples,
        schedule=Schedule(
            plan=plan,
            total_steps=total_steps,
            validate_before_train=cfg.trainer.val_before_train,
            test_freq=cfg.trainer.test_freq,
            save_freq=cfg.trainer.save_freq,
            export_every=cfg.run.export_every,
        ),
        data=Data(
            tokenizer=tokenizer,
            processor=processor,
            train=train,
            val=val,
            shuffle=cfg.data.shuffle,
            sampler=sampler,
            val_batch_size=cfg.data.val_batch_size,
            max_response_length=cfg.data.max_response_length,
            pad_token_id=int(tokenizer.pad_token_id),
            chat_template_kwargs=dict(cfg.data.chat_template_kwargs),
            max_prompt_length=cfg.data.max_prompt_length,
        ),
        sampling=Sampling(train=sampling_params(cfg), val=sampling_params(cfg, val=True), seed=cfg.run.seed),
        reward=reward,
        backends=BackendSetup(
            placement=cfg.placement,
            train=cfg.trainer.backend,
            train_spec=train_spec(cfg, total_steps, tokenizer),
            rollout=cfg.rollout.backend,
            rollout_spec=spec,
            agent=agent,
            gateway=gateway,
            trainer=trainer_setup(cfg),
            teacher_spec=teacher_rollout_spec(cfg, tokenizer),
        ),
    )


def _multi_turn(cfg: RecipeConfig) -> bool:
    """Whether a response holds several turns (an environment's, or a gateway agent's calls)."""
    return cfg.rollout.environment is not None or cfg.rollout.agent is not None


def gateway_setup(cfg: RecipeConfig) -> GatewaySetup | None:
    """``rollout.agent`` through ``rollout.gateway``; None without an agent."""
    agent: Selection | None = cfg.rollout.agent
    if agent is None:
        return None
    env: Selection | None = cfg.rollout.environment
    return GatewaySetup(
        make_agent=partial(agent.fn, agent.params),
        settings=cfg.rollout.gateway,
        multi_turn=cfg.rollout.multi_turn,
        agent_name=agent.name,
        max_prompt_length=cfg.data.max_prompt_length,
        make_env=None if env is None else partial(env.fn, env.params),
        env_name=None if env is None else env.name,
    )


def agent_setup(cfg: RecipeConfig) -> AgentSetup | None:
    """``rollout.environment`` (one environment per trajectory), ``rollout.tools`` and
    ``rollout.multi_turn``; None for a single-turn run."""
    env: Selection | None = cfg.rollout.environment
    if env is None or cfg.rollout.agent is not None:  # beside an agent, the environment judges its episodes
        return None
    return AgentSetup(
        make_env=partial(env.fn, env.params),
        tools=tuple(sel.fn(sel.params) for sel in cfg.rollout.tools),
        settings=cfg.rollout.multi_turn,
        env_name=env.name,
        max_prompt_length=cfg.data.max_prompt_length,
    )
