"""Map a parsed verl command onto an rlzoo recipe, accounting for every key."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.settings import LoraSettings
from rlzoo_from_verl.shell import Command, parse_command, parse_overrides, parse_value, read_script
from rlzoo_from_verl.table import (
    ACT,
    CRIT,
    ENTRY_POINTS,
    NO_ULYSSES,
    REF,
    ROLL,
    VERL_DEFAULTS,
    A,
    Manual,
    R,
    Rule,
    Skip,
    To,
    _fsdp,
    _off,
    _path,
    _rule,
)


# ---------------------------------------------------------------------------------------------
# conversion
# ---------------------------------------------------------------------------------------------
@dataclass
class Conversion:
    """The recipe and the account of every verl key."""

    recipe: dict[str, Any] = field(default_factory=dict)
    mapped: list[tuple[str, Any, str, Any, str]] = field(default_factory=list)  # verl, v, rlzoo, v, note
    skipped: list[tuple[str, Any, str]] = field(default_factory=list)
    manual: list[tuple[str, Any, str]] = field(default_factory=list)
    unmappable: list[tuple[str, Any, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the shell reader did not run, and where

    def set(self, rlzoo_key: str, value: Any, verl_key: str, verl_value: Any, note: str = "") -> None:
        node = self.recipe
        *path, last = rlzoo_key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
        self.mapped.append((verl_key, verl_value, rlzoo_key, value, note))

    def get(self, rlzoo_key: str, default: Any = None) -> Any:
        node: Any = self.recipe
        for p in rlzoo_key.split("."):
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node

    def report(self) -> str:
        lines = ["verl key = value  ->  rlzoo key = value"]
        lines += [
            f"  {k} = {v!r}  ->  {rk} = {rv!r}" + (f"   ({n})" if n else "")
            for k, v, rk, rv, n in self.mapped
        ]
        if self.skipped:
            lines.append("not needed in rlzoo:")
            lines += [f"  {k} = {v!r}  ->  ({why})" for k, v, why in self.skipped]
        if self.notes:
            lines.append("read from the script without running it:")
            lines += [f"  {n}" for n in self.notes]
        if self.manual:
            lines.append("MANUAL STEPS (rlzoo has no key for these; also in the recipe header):")
            lines += [f"  {k} = {v!r}  ->  {why}" for k, v, why in self.manual]
        return "\n".join(lines)


#: keys whose value must be an integer (the combined rules compute with them)
INTEGER_KEYS = (
    "data.train_batch_size",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "rollout.nnodes",
    "rollout.n_gpus_per_node",
    "async_training.require_batches",
    ACT + "ppo_mini_batch_size",
    ACT + "ppo_micro_batch_size",
    ACT + "ppo_micro_batch_size_per_gpu",
    ACT + "ppo_max_token_len_per_gpu",
    REF + "log_prob_micro_batch_size",
    REF + "log_prob_micro_batch_size_per_gpu",
    ROLL + "log_prob_micro_batch_size",
    ROLL + "log_prob_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size_per_gpu",
    "reward_model.micro_batch_size",
)


def _is_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _declared(kind: str, name: str) -> set[str] | None:
    """Param names a registered part declares (None when the name is unknown: validate says so)."""
    import dataclasses

    from rlzoo.kernel.plugins import get_plugin_manager

    reg = get_plugin_manager().registry(kind)
    if name not in reg:
        return None
    params = reg.get(name).params
    return {f.name for f in dataclasses.fields(params)} if params else set()


_PERF_MEGATRON_DYN = (
    "performance only: rlzoo's megatron backend packs micro-batches by sample count "
    "(trainer.micro_batch.size), not by a token budget"
)


def _part_param(conv: Conversion, kind: str, section: str, param: str, verl_key: str, value: Any) -> None:
    """Set ``section.param`` when the selected part declares it, else record why it is not needed."""
    sel = conv.get(section)
    name = str(sel["name"] if isinstance(sel, dict) else sel)
    declared = _declared(kind, name)
    if declared is None or param in declared:
        conv.set(f"{section}.{param}", value, verl_key, value)
    else:
        conv.skipped.append((verl_key, value, f"{kind} {name!r} has no {param} (verl ignores it there too)"))


def convert(command: Command) -> Conversion:
    """Map a parsed verl command onto a recipe; raises :class:`RlzooError` listing unmappable keys."""
    runner = ENTRY_POINTS.get(command.entry or "")
    keys = dict(VERL_DEFAULTS)
    given = {k: parse_value(v) for k, v in command.overrides}
    keys.update(given)
    wrong_type = [(k, keys.pop(k)) for k in INTEGER_KEYS if k in keys and not _is_int(keys[k])]
    if runner is None:
        if command.entry is not None and not command.entry.startswith(("verl.", "recipe.")):
            raise RlzooError(f"from-verl: {command.entry!r} is not a verl entry point")
        if command.entry is not None and command.entry not in ENTRY_POINTS:
            raise RlzooError(
                f"from-verl: unknown verl entry point {command.entry!r}; known: {', '.join(ENTRY_POINTS)}"
            )
        runner = "fully_async" if any(k.startswith("async_training.") for k in given) else "sync"
    if command.config_name and "megatron" in command.config_name and ACT + "strategy" not in given:
        keys[ACT + "strategy"] = "megatron"
    conv = Conversion(notes=list(command.notes))
    conv.unmappable += [(k, v, "expected an integer") for k, v in wrong_type]
    conv.recipe["runner"] = {"name": runner}
    rules = {k: _rule(k) for k in keys}
    conv.unmappable += [(k, keys[k], "no rule") for k, r in rules.items() if r is None]
    later: dict[str, Any] = {}
    for k, v in keys.items():
        rule = rules[k]
        tag = "verl default" if k not in given else ""
        if isinstance(rule, To):
            try:
                out = rule.how(v) if rule.how else v
            except (ValueError, TypeError) as e:
                conv.unmappable.append((k, v, str(e)))
                continue
            noted = rule.note_for(v) if rule.note_for else ""
            conv.set(rule.key, out, k, v, ", ".join(x for x in (tag, rule.note, noted) if x))
            if noted:
                conv.notes.append(noted)
        elif isinstance(rule, Skip):
            if rule.when is None or rule.when(v):
                conv.skipped.append((k, v, rule.why))
            else:
                conv.unmappable.append((k, v, rule.otherwise))
        elif isinstance(rule, Manual):
            conv.manual.append((k, v, rule.why))
        elif isinstance(rule, Rule):
            later[k] = v
    try:
        _assemble(conv, later, runner, given, keys)
    except (TypeError, ValueError, ArithmeticError) as e:  # a value of a type verl would reject too
        raise RlzooError(
            f"from-verl: a verl value has a type this key cannot have ({e}); check the script"
        ) from None
    if conv.unmappable:
        rows = "\n".join(f"  {k} = {v!r}: {why}" for k, v, why in conv.unmappable)
        raise RlzooError(f"from-verl: {len(conv.unmappable)} verl key(s) cannot be mapped:\n{rows}")
    return conv


def _assemble(
    conv: Conversion, v: dict[str, Any], runner: str, given: Mapping[str, Any], keys_all: Mapping[str, Any]
) -> None:
    """The rules that read several verl keys at once."""
    backend = conv.get("trainer.backend.name", "fsdp2")
    take = v.pop

    def bad(key: str, value: Any, why: str) -> None:
        conv.unmappable.append((key, value, why))

    # placement: GPUs -> Ray; a separate rollout pool or hybrid_engine=False -> split
    if (conv.get("placement.trainer.n_gpus_per_node") or 0) > 0:
        conv.set(
            "placement.name", "ray", "trainer.n_gpus_per_node", conv.get("placement.trainer.n_gpus_per_node")
        )
    hybrid = take(R + "hybrid_engine", None)
    split = hybrid is False or conv.get("placement.rollout") is not None
    conv.set(
        "placement.colocate", not split, R + "hybrid_engine", hybrid, "a rollout pool or hybrid_engine=False"
    )
    # data
    filt = take("data.filter_overlong_prompts", None)
    if filt:
        conv.set("data.truncation", "filter", "data.filter_overlong_prompts", filt)
    bsz = take("data.train_batch_size", None)
    if runner == "fully_async":
        mini = conv.get("trainer.ppo_mini_batch_size")
        req = conv.get("runner.require_batches", 1)
        conv.set(
            "data.train_batch_size",
            mini * req,
            "data.train_batch_size",
            bsz,
            "require_batches x ppo_mini_batch_size",
        )
        conv.set(
            "trainer.total_steps",
            None,
            "rollout.total_rollout_steps",
            conv.get("runner.total_rollout_steps"),
            "the run is bounded by total_rollout_steps",
        )
    else:
        conv.set("data.train_batch_size", bsz, "data.train_batch_size", bsz)
    # model-side backend switches
    for key, param in (
        (R + "model.enable_gradient_checkpointing", "gradient_checkpointing"),
        (R + "model.use_remove_padding", "use_remove_padding"),
    ):
        if key in v:
            val = take(key)
            if backend == "megatron" and param == "gradient_checkpointing":
                conv.set("trainer.backend.recompute_activations", val, key, val)
            elif backend == "megatron":
                conv.skipped.append((key, val, "megatron packs sequences without padding itself"))
            else:
                conv.set(f"trainer.backend.{param}", val, key, val)
    offload = [
        take(k) for k in (ACT + "fsdp_config.param_offload", ACT + "fsdp_config.optimizer_offload") if k in v
    ]
    if offload:
        conv.set(
            "trainer.backend.offload",
            any(offload),
            f"{ACT}fsdp_config.param_offload + {ACT}fsdp_config.optimizer_offload",
            offload,
            "fsdp2 offloads both together",
        )
    _ulysses(conv, v, given, backend, bad)
    _router_replay(conv, v, given, backend, bad)
    _feature_groups(conv, v, given, bad)
    _critic_schedule(conv, v, keys_all, bad)
    crit = take(CRIT + "strategy", None)
    if crit is not None and _fsdp(crit) != backend:
        bad(
            CRIT + "strategy", crit, f"differs from the actor's ({backend}); rlzoo trains both on one backend"
        )
    elif crit is not None:
        conv.skipped.append((CRIT + "strategy", crit, "same as the actor's"))
    # micro-batches
    dyn = take(ACT + "use_dynamic_bsz", False)
    max_tok = take(ACT + "ppo_max_token_len_per_gpu", None)
    per_gpu = take(ACT + "ppo_micro_batch_size_per_gpu", None)
    glob = take(ACT + "ppo_micro_batch_size", None)
    if dyn and backend == "megatron":
        # rlzoo's megatron backend splits micro-batches by sample count only
        conv.skipped.append(
            (
                f"{ACT}use_dynamic_bsz + {ACT}ppo_max_token_len_per_gpu",
                (dyn, max_tok),
                _PERF_MEGATRON_DYN,
            )
        )
        if per_gpu is not None:
            conv.set(
                "trainer.micro_batch.size", per_gpu, ACT + "ppo_micro_batch_size_per_gpu", per_gpu, "per rank"
            )
    elif dyn:
        conv.set(
            "trainer.micro_batch.max_tokens",
            max_tok,
            f"{ACT}use_dynamic_bsz + {ACT}ppo_max_token_len_per_gpu",
            (dyn, max_tok),
        )
        if per_gpu is not None:
            conv.skipped.append(
                (ACT + "ppo_micro_batch_size_per_gpu", per_gpu, "superseded by use_dynamic_bsz, as in verl")
            )
    else:
        if max_tok is not None and ACT + "ppo_max_token_len_per_gpu" in given:
            conv.skipped.append(
                (ACT + "ppo_max_token_len_per_gpu", max_tok, "unused without use_dynamic_bsz, as in verl")
            )
        if per_gpu is None and glob is not None:
            gpus = (conv.get("placement.trainer.n_gpus_per_node") or 1) * (
                conv.get("placement.trainer.nnodes") or 1
            )
            per_gpu = max(int(glob) // gpus, 1)
        if per_gpu is not None:
            conv.set(
                "trainer.micro_batch.size",
                per_gpu,
                ACT + ("ppo_micro_batch_size_per_gpu" if glob is None else "ppo_micro_batch_size"),
                per_gpu,
                "per rank",
            )
    lp_keys = [k for k in v if k.endswith(("log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size"))]
    lp = [take(k) for k in lp_keys]
    if lp:
        conv.set(
            "trainer.micro_batch.log_prob_size", max(int(x) for x in lp), " + ".join(lp_keys), lp, "per rank"
        )
    # policy loss and advantage params
    loss_key, adv_key = "algorithm.policy_loss", "algorithm.advantage"
    for sec in (loss_key, adv_key):
        if isinstance(conv.get(sec), str):
            name = conv.get(sec)
            node = conv.recipe["algorithm"]
            node[sec.split(".")[1]] = {"name": name}
    if conv.get(loss_key) is None:
        conv.recipe.setdefault("algorithm", {})["policy_loss"] = {"name": "ppo_clip"}
    clip = take(ACT + "clip_ratio", None)
    for side in ("low", "high"):
        key = ACT + f"clip_ratio_{side}"
        val = take(key, None)
        if val is None and clip is not None:
            key, val = ACT + "clip_ratio", clip
        if val is not None:
            _part_param(conv, "policy_loss", loss_key, f"clip_ratio_{side}", key, val)
    if clip is not None and ACT + "clip_ratio_low" in given and ACT + "clip_ratio_high" in given:
        conv.skipped.append(
            (ACT + "clip_ratio", clip, "clip_ratio_low and clip_ratio_high override it, as in verl")
        )
    for verl_key, param in (
        (ACT + "clip_ratio_c", "clip_ratio_c"),
        (ACT + "tau_pos", "tau_pos"),
        (ACT + "tau_neg", "tau_neg"),
        (ACT + "policy_loss.clip_cov_ratio", "clip_cov_ratio"),
        (ACT + "policy_loss.clip_cov_lb", "clip_cov_lb"),
        (ACT + "policy_loss.clip_cov_ub", "clip_cov_ub"),
        (ACT + "policy_loss.kl_cov_ratio", "kl_cov_ratio"),
        (ACT + "policy_loss.ppo_kl_coef", "ppo_kl_coef"),
        (ACT + "policy_loss.dro_beta", "beta"),
    ):
        if verl_key in v and (val := take(verl_key)) is not None:
            _part_param(conv, "policy_loss", loss_key, param, verl_key, val)
    for verl_key, param in (
        (A + "gamma", "gamma"),
        (A + "lam", "lam"),
        (A + "norm_adv_by_std_in_grpo", "norm_by_std"),
    ):
        if verl_key in v:
            _part_param(conv, "advantage", adv_key, param, verl_key, take(verl_key))
    # validation sampling
    do_sample = take(ROLL + "val_kwargs.do_sample", None)
    temp = take(ROLL + "val_kwargs.temperature", None)
    val_keys = f"{ROLL}val_kwargs.do_sample + {ROLL}val_kwargs.temperature"
    if do_sample:
        conv.set("rollout.val.temperature", 1.0 if temp is None else temp, val_keys, (do_sample, temp))
    elif do_sample is not None or temp is not None:
        conv.set(
            "rollout.val.temperature", 0.0, val_keys, (do_sample, temp), "greedy unless do_sample, as verl"
        )
    # engine kwargs
    # rlzoo's vLLM backend takes engine kwargs as strings it reads as YAML scalars
    eng_keys = [k for k in v if k.startswith(ROLL + "engine_kwargs.vllm.")]
    eng = {k.rsplit(".", 1)[1]: str(take(k)) for k in eng_keys}
    if eng:
        conv.set("rollout.backend.engine_kwargs", eng, " + ".join(eng_keys), eng)
    _reward_model(conv, v, given, bad)
    _custom_reward(conv, v)
    _custom_data(conv, v)
    if given.get("reward_model.reward_manager") == "prime":  # verl's per-sample limit (prime.py)
        conv.set(
            "reward.manager.timeout", 300.0, "reward_model.reward_manager", "prime", "verl's prime timeout"
        )
    template = "data.apply_chat_template_kwargs."
    for k in [k for k in v if k.startswith(template)]:
        val = v.pop(k)
        conv.set("data.chat_template_kwargs." + k.removeprefix(template), val, k, val)
    if (
        any(k.startswith("reward_model.overlong_buffer.") for k in given)
        and conv.get("reward.manager.max_response_length") is None
    ):  # recipe.dapo: the buffer's max_resp_len is data.max_response_length
        m = conv.get("data.max_response_length")
        conv.set("reward.manager.max_response_length", m, "data.max_response_length", m, "as recipe/dapo")
    # DAPO dynamic sampling
    if take(A + "filter_groups.enable", False):
        fkeys = " + ".join(k for k in given if k.startswith(A + "filter_groups."))
        metric = take(A + "filter_groups.metric", "acc")
        gens = take(A + "filter_groups.max_num_gen_batches", 0)
        conv.set(
            "algorithm.sample_filter",
            {"name": "dynamic_sampling", "metric": metric, "max_num_gen_batches": gens},
            fkeys,
            (metric, gens),
        )
    else:
        for k in [k for k in v if k.startswith(A + "filter_groups.")]:
            conv.skipped.append((k, take(k), "filter_groups is off"))
    _correction(
        conv,
        {
            k[len(A + "rollout_correction.") :]: take(k)
            for k in list(v)
            if k.startswith(A + "rollout_correction.")
        },
        v,
        bad,
    )
    for k in list(v):
        bad(k, take(k), "no combined rule read this key (a converter bug: please report it)")


def _exclude_pattern(val: Any) -> str | None:
    """peft's ``exclude_modules`` as rlzoo's one regular expression: a string is one already (matched
    whole against a module's full name); a list of names matches a name or a ``.name`` suffix, as peft
    matches list entries."""
    import re

    if isinstance(val, str) and not val.startswith("["):
        try:
            re.compile(val)
        except re.error:
            return None
        return val
    names = [t.strip() for t in val.strip("[]").split(",")] if isinstance(val, str) else val
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        return None
    return r"(.*\.)?(" + "|".join(re.escape(n) for n in names) + ")"


def _lora(conv: Conversion, v: dict[str, Any], bad: Callable[[str, Any, str], None]) -> None:
    """``lora_rank > 0`` -> ``trainer.lora: {rank, alpha, target_modules}`` (verl's defaults: alpha 16,
    all-linear); 0 or absent (verl's default) is full fine-tuning. ``exclude_modules`` (peft's: a regular
    expression, or names matched as target_modules are) -> ``trainer.lora.exclude_modules``. verl's megatron
    LoRA block (``model.lora.*``) has no rlzoo counterpart: refused when LoRA is on."""
    given = {
        k: v.pop(k)
        for k in [
            k
            for k in v
            if k.startswith((R + "model.lora", R + "model.target_modules", R + "model.exclude_modules"))
        ]
    }
    rank = given.pop(R + "model.lora_rank", 0)
    adapter = given.pop(R + "model.lora_adapter_path", None)
    if not _off(adapter):  # verl: an adapter turns LoRA on and its own config gives r / alpha / targets
        _lora_adapter(conv, str(adapter), rank, given, bad)
        return
    if adapter is not None:
        given[R + "model.lora_adapter_path"] = adapter  # skipped below (or refused as a LoRA key)
    if _off(rank):
        for k, val in given.items():
            conv.skipped.append((k, val, "LoRA is off (lora_rank=0)"))
        if rank != 0:
            conv.skipped.append((R + "model.lora_rank", rank, "LoRA is off: full fine-tuning"))
        return
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        bad(R + "model.lora_rank", rank, "expected a LoRA rank (an integer >= 0)")
        return
    alpha = given.pop(R + "model.lora_alpha", 16)
    targets = given.pop(R + "model.target_modules", "all-linear")
    for k, val in given.items():  # exclude_modules, model.lora.* (megatron)
        if val in (None, "", "null", []):
            conv.skipped.append((k, val, "not set"))
        elif k == R + "model.exclude_modules":
            pattern = _exclude_pattern(val)
            if pattern is None:
                bad(k, val, "expected a regular expression or a list of module names")
            else:
                conv.set("trainer.lora.exclude_modules", pattern, k, val)
        else:
            bad(
                k,
                val,
                "verl's megatron LoRA settings have no rlzoo counterpart (rlzoo's megatron backend "
                "refuses trainer.lora; use the fsdp2 or native backend)",
            )
    if isinstance(targets, str):
        names = [t.strip() for t in targets.strip("[]").split(",") if t.strip()]
    elif isinstance(targets, (list, tuple)):
        names = [str(t) for t in targets]
    else:
        bad(R + "model.target_modules", targets, "expected 'all-linear' or a list of module names")
        return
    conv.set("trainer.lora.rank", rank, R + "model.lora_rank", rank)
    conv.set("trainer.lora.alpha", float(alpha), R + "model.lora_alpha", alpha)
    conv.set("trainer.lora.target_modules", names, R + "model.target_modules", targets)


def _lora_adapter(
    conv: Conversion, path: str, rank: Any, given: dict[str, Any], bad: Callable[[str, Any, str], None]
) -> None:
    """``lora_adapter_path`` -> ``trainer.lora.adapter_path`` (absolute), with ``rank`` / ``alpha`` /
    ``target_modules`` from the folder's ``adapter_config.json``, as verl loads them
    (``PeftModel.from_pretrained``: the adapter's config wins over lora_rank / lora_alpha /
    target_modules); a folder not there yet keeps the recipe's values (validate checks them)."""
    import json
    import os

    key = R + "model.lora_adapter_path"
    full = os.path.abspath(_path(path))
    conv.set(
        "trainer.lora.adapter_path", full, key, path, "" if full == path else f"resolved from {os.getcwd()}"
    )
    try:
        cfg = json.loads((Path(full) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        cfg = None
    if cfg is None:  # not here: verl's keys (else rlzoo's default rank); validate checks them against it
        default = LoraSettings().rank
        _lora(conv, {**given, R + "model.lora_rank": rank if not _off(rank) else default}, bad)
        if _off(rank):
            conv.notes.append(
                f"{key}: {path!r} has no adapter_config.json here, so trainer.lora.rank is rlzoo's default "
                f"{default}; validate compares rank / alpha / target_modules with the adapter once it is there"
            )
        return
    targets = cfg.get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    note = "from the adapter's adapter_config.json (verl loads the adapter's own settings)"
    conv.set("trainer.lora.rank", int(cfg.get("r", 8)), key, path, note)
    conv.set("trainer.lora.alpha", float(cfg.get("lora_alpha", 8)), key, path, note)
    conv.set("trainer.lora.target_modules", names, key, path, note)
    for k, val in given.items():
        conv.skipped.append((k, val, "the adapter's adapter_config.json gives it (lora_adapter_path)"))


#: the data sources verl scores by running code (prime_code, or SandboxFusion with sandbox_fusion.url)
CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
_SF = "reward_model.sandbox_fusion."


def _sandbox_fusion(conv: Conversion, v: dict[str, Any]) -> None:
    """verl's SandboxFusion server: its code sources go to ``code_tests`` on the same server."""
    url = v.pop(_SF + "url", None)
    members = {k: v.pop(k) for k in [k for k in v if k.startswith(_SF)]}
    if _off(url):
        if url is not None:
            conv.skipped.append((_SF + "url", url, "no sandbox"))
        conv.skipped += [(k, val, "no sandbox") for k, val in members.items()]
        return
    sandbox: dict[str, Any] = {"url": str(url)}
    mem = members.pop(_SF + "memory_limit_mb", None)
    if mem not in (None, -1, "-1"):
        sandbox["memory_mb"] = int(mem)
        conv.mapped.append((_SF + "memory_limit_mb", mem, "reward.scorers.*.sandbox.memory_mb", int(mem), ""))
    conc = members.pop(_SF + "max_concurrent", None)
    if conc not in (None, 0):
        sandbox["max_parallel"] = int(conc)
        conv.mapped.append(
            (_SF + "max_concurrent", conc, "reward.scorers.*.sandbox.max_parallel", int(conc), "")
        )
    for source in CODE_SOURCES:
        conv.set(
            f"reward.scorers.{source}",
            {"name": "code_tests", "sandbox": dict(sandbox)},
            _SF + "url",
            url,
            "verl's code sources run their tests on that server",
        )
    conv.skipped += [(k, val, "read with sandbox_fusion.url: no rlzoo setting") for k, val in members.items()]


def _feature_groups(
    conv: Conversion, v: dict[str, Any], given: Mapping[str, Any], bad: Callable[[str, Any, str], None]
) -> None:
    """Keys read together with a switch: LoRA (lora_rank), multi-turn, MTP, sandbox fusion."""
    _lora(conv, v, bad)
    _sandbox_fusion(conv, v)
    groups = ((ROLL + "multi_turn.enable", (ROLL + "multi_turn.",), "multi-turn is off"),)
    for switch, members, why in groups:
        on = not _off(given.get(switch))
        for k in [k for k in v if k.startswith(members) and k != switch]:
            val = v.pop(k)
            if on:
                conv.skipped.append((k, val, f"read with {switch} (refused above)"))
            else:
                conv.skipped.append((k, val, why))
    mtp = [k for k in v if k.startswith(R + "model.mtp.")]
    enabled = any(not _off(given.get(k)) for k in mtp if k.endswith((".enable", ".enable_train")))
    for k in mtp:
        val = v.pop(k)
        if enabled and k.endswith(".enable"):
            bad(k, val, "rlzoo has no multi-token prediction (MTP) heads")
        else:
            conv.skipped.append(
                (k, val, "multi-token prediction is off" if not enabled else "read with mtp.enable")
            )


#: reward_model.* keys that only size or place verl's reward-model worker
_RM_PERF = (
    "reward_model.model.use_remove_padding",
    "reward_model.model.use_fused_kernels",
    "reward_model.model.fsdp_config.",
    "reward_model.rollout.",
    "reward_model.strategy",
    "reward_model.use_dynamic_bsz",
    "reward_model.forward_max_token_len_per_gpu",
    "reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node",
    "reward_model.nnodes",
    "reward_model.ulysses_sequence_parallel_size",
    "reward_model.megatron.",
)


def _custom_reward(conv: Conversion, v: dict[str, Any]) -> None:
    """verl's ``custom_reward_function.{path,name,reward_kwargs}`` -> the ``python_file`` scorer, which
    calls the function as verl does. A relative path is resolved against the directory from-verl runs in
    (where verl would have run), so the recipe works from anywhere."""
    import os

    prefix = "custom_reward_function."
    keys = {k: v.pop(k) for k in [k for k in v if k.startswith(prefix)]}
    path = keys.pop(prefix + "path", None)
    if _off(path):
        for k, val in keys.items():
            conv.skipped.append((k, val, "no custom reward function (custom_reward_function.path unset)"))
        if path is not None:
            conv.skipped.append((prefix + "path", path, "unset: verl's built-in scoring, as rlzoo's"))
        return
    name = keys.pop(prefix + "name", "compute_score")
    kwargs = {k.removeprefix(prefix + "reward_kwargs."): val for k, val in keys.items()}
    full = os.path.abspath(_path(path))
    conv.set(
        "reward.scorer.name", "python_file", prefix + "path", path, "your function, called as verl calls it"
    )
    conv.set(
        "reward.scorer.path",
        full,
        prefix + "path",
        path,
        "" if full == path else f"resolved from {os.getcwd()}",
    )
    conv.set("reward.scorer.function", str(name), prefix + "name", name)
    if kwargs:
        conv.set("reward.scorer.kwargs", kwargs, prefix + "reward_kwargs", kwargs)


def _custom_data(conv: Conversion, v: dict[str, Any]) -> None:
    """verl's ``data.custom_cls.{path,name}`` and ``data.sampler.{class_path,class_name}`` ->
    ``data.custom_cls`` / ``data.sampler`` (``{path, name}``, the class built as verl builds it). A
    relative path is resolved against the directory from-verl runs in, as for the reward file."""
    import os

    for prefix, path_key, name_key, to in (
        ("data.custom_cls.", "path", "name", "data.custom_cls"),
        ("data.sampler.", "class_path", "class_name", "data.sampler"),
    ):
        path = v.pop(prefix + path_key, None)
        name = v.pop(prefix + name_key, None)
        if isinstance(path, str) and path.startswith("pkg://"):
            conv.unmappable.append(
                (
                    prefix + path_key,
                    path,
                    "a pkg:// module path is imported through sys.path; rlzoo loads your class from a file "
                    "only: give the .py file's path",
                )
            )
            continue
        if _off(path):
            for k, val in ((prefix + path_key, path), (prefix + name_key, name)):
                if val is not None:
                    conv.skipped.append((k, val, f"unset: {to} is rlzoo's own"))
            continue
        full = os.path.abspath(_path(path))
        conv.set(
            f"{to}.path",
            full,
            prefix + path_key,
            path,
            "" if full == path else f"resolved from {os.getcwd()}",
        )
        conv.set(f"{to}.name", str(name), prefix + name_key, name, "your class, built as verl builds it")


def _router_replay(
    conv: Conversion,
    v: dict[str, Any],
    given: Mapping[str, Any],
    backend: str,
    bad: Callable[[str, Any, str], None],
) -> None:
    """verl's ``actor.router_replay.mode`` with ``rollout.enable_rollout_routing_replay``: R3 (the
    trainer replays the rollout's experts) -> ``trainer.backend.router_replay`` on megatron, and
    ``rollout.backend.record_routes`` where the rollout backend declares it. R2 (the updates replay
    the trainer's own log-prob pass) is refused by name."""
    mode_key, roll_key = ACT + "router_replay.mode", ROLL + "enable_rollout_routing_replay"
    mode = str(v.pop(mode_key, None) or "disabled")
    record = v.pop(roll_key, None)
    if mode == "disabled":
        if mode_key in given:
            conv.skipped.append(
                (mode_key, given[mode_key], "no MoE router replay (trainer.backend.router_replay off)")
            )
        if roll_key in given:
            conv.skipped.append(
                (roll_key, given[roll_key], "read with router_replay.mode R3 only (here disabled)")
            )
        return
    if mode == "R2":
        bad(
            mode_key,
            mode,
            "R2 (the updates replay the routing of the trainer's own old-log-prob forward) is not in rlzoo; "
            "R3 is (router_replay.mode=R3 with rollout.enable_rollout_routing_replay=True: the megatron "
            "trainer replays the experts the rollout recorded, trainer.backend.router_replay)",
        )
        return
    if mode != "R3":
        bad(mode_key, mode, "verl's router replay modes are disabled, R2 and R3")
        return
    if backend != "megatron":
        bad(
            mode_key, mode, f"router replay runs on rlzoo's megatron train backend (as verl's), not {backend}"
        )
        return
    if not record:
        bad(
            roll_key,
            record,
            "router_replay.mode R3 replays the rollout's routing: set enable_rollout_routing_replay=True "
            "(verl's R3 fails without it too)",
        )
        return
    conv.set(
        "trainer.backend.router_replay",
        True,
        f"{mode_key} + {roll_key}",
        [mode, record],
        "R3: the actor routes each token to the experts the rollout recorded",
    )
    rollout = conv.get("rollout.backend.name", "vllm")
    declared = _declared("rollout_backend", str(rollout))
    if declared is not None and "record_routes" in declared:
        conv.set("rollout.backend.record_routes", True, roll_key, record)
    else:
        conv.notes.append(
            f"router replay: rollout backend {rollout!r} does not record the experts it routes to (only the "
            "native backend does: rollout.backend.name native, record_routes true); rlzoo validate refuses "
            "the recipe until it does"
        )


def _ulysses(
    conv: Conversion,
    v: dict[str, Any],
    given: Mapping[str, Any],
    backend: str,
    bad: Callable[[str, Any, str], None],
) -> None:
    """verl's three ``ulysses_sequence_parallel_size`` keys -> ``trainer.backend.ulysses_size``
    (fsdp2 runs actor, reference and critic with one size). The reference follows the actor unless
    set (verl's default); the critic's counts only when a critic trains (gae)."""
    keys = [ACT + "ulysses_sequence_parallel_size", REF + "ulysses_sequence_parallel_size"]
    critic_key = CRIT + "ulysses_sequence_parallel_size"
    values = {k: v.pop(k) for k in (*keys, critic_key) if k in v}
    actor = values.get(keys[0]) or 1
    used = {keys[0]: actor, keys[1]: values.get(keys[1], actor) if keys[1] in given else actor}
    if conv.get("algorithm.advantage.name") == "gae":
        used[critic_key] = values.get(critic_key) or 1
    elif critic_key in given:
        conv.skipped.append((critic_key, given[critic_key], "no critic trains in this run (not gae)"))
    sizes = {int(x or 1) for x in used.values()}
    if sizes == {1}:
        for k in used:
            if k in given:
                conv.skipped.append(
                    (k, given[k], "1: no sequence parallelism (trainer.backend.ulysses_size 1)")
                )
        return
    if backend == "megatron":
        k = next(k for k, x in used.items() if int(x or 1) > 1)
        bad(k, used[k], NO_ULYSSES)
        return
    if len(sizes) > 1:
        for k, x in used.items():
            bad(
                k,
                x,
                "rlzoo's fsdp2 backend runs the actor, reference and critic with one "
                f"trainer.backend.ulysses_size; these differ ({', '.join(f'{kk}={xx}' for kk, xx in used.items())})",
            )
        return
    size = sizes.pop()
    conv.set("trainer.backend.ulysses_size", size, " + ".join(used), list(used.values()))


def _reward_model(
    conv: Conversion, v: dict[str, Any], given: Mapping[str, Any], bad: Callable[[str, Any, str], None]
) -> None:
    """``reward_model.enable=True`` -> the ``reward_model`` reward manager (verl's learned reward model:
    its score replaces the rule-based one, as verl's naive manager returns ``rm_scores``)."""
    rm_keys = [k for k in v if k.startswith("reward_model.") and k != "reward_model.enable"]
    enabled = bool(v.pop("reward_model.enable", False))
    if not enabled:
        for k in rm_keys:
            conv.skipped.append((k, v.pop(k), "the reward model is off (reward_model.enable=False)"))
        if "reward_model.enable" in given:
            conv.skipped.append(("reward_model.enable", False, "off, as rlzoo's default"))
        return
    manager = conv.get("reward.manager.name", conv.get("reward.manager"))
    if isinstance(manager, str) and manager != "naive":
        bad(
            "reward_model.reward_manager",
            manager,
            f"a learned reward model with verl's {manager!r} manager: rlzoo's reward_model manager scores "
            "with the model alone (it has no overlong buffer or other shaping)",
        )
        return
    path = v.pop("reward_model.model.path", None)
    if path is None:
        bad("reward_model.model.path", None, "the reward model's path is required with reward_model.enable")
        return
    part: dict[str, Any] = {"name": "reward_model", "path": str(path)}
    used = ["reward_model.enable", "reward_model.model.path"]
    for key, param in (
        ("reward_model.micro_batch_size_per_gpu", "batch_size"),
        ("reward_model.micro_batch_size", "batch_size"),
        ("reward_model.max_length", "max_length"),
        ("reward_model.model.trust_remote_code", "trust_remote_code"),
    ):
        if key in v and (val := v.pop(key)) is not None:
            part[param] = val
            used.append(key)
    policy = str(given.get(R + "model.path", conv.get("model.path")))
    tokenizer = v.pop("reward_model.model.input_tokenizer", policy)
    if "reward_model.model.input_tokenizer" in given:
        used.append("reward_model.model.input_tokenizer")
    if tokenizer is not None and str(tokenizer) != str(path):
        conv.manual.append(
            (
                "reward_model.model.input_tokenizer",
                tokenizer,
                "verl decodes each response and renders (prompt, response) with the reward model's own chat "
                "template; rlzoo's reward_model manager reads the prompt as the policy's template rendered it, "
                "then the response: set reward.manager.response_suffix to the reward model's "
                "end-of-turn text and compare a few scores with verl's",
            )
        )
    conv.set(
        "reward.manager", part, " + ".join(used), path, "a learned reward model; its score is the reward"
    )
    for k in [k for k in v if k.startswith("reward_model.model.override_config.")]:
        conv.manual.append(
            (k, v.pop(k), "rlzoo has no model-config override: edit the reward model's config.json")
        )
    for k in [k for k in v if k.startswith(_RM_PERF)]:
        conv.skipped.append((k, v.pop(k), _PERF_RM))
    ext = v.pop("reward_model.model.external_lib", None)
    if ext is not None:
        bad("reward_model.model.external_lib", ext, "rlzoo loads reward models with transformers only")


_PERF_RM = "performance only: sizes / places verl's reward-model worker; rlzoo's runs in the reward manager"


def _critic_schedule(
    conv: Conversion, v: dict[str, Any], keys: Mapping[str, Any], bad: Callable[[str, Any, str], None]
) -> None:
    """verl gives the critic its own LR schedule (its ``critic.optim.*``, verl's defaults where unset); rlzoo's
    critic follows ``trainer.optim``'s schedule unless its ``critic_*`` settings are given. Each part of the
    critic's schedule that differs from what rlzoo would take from the actor is set on the critic; equal
    ones are not needed. AdamW's betas are one setting in rlzoo: different ones are refused."""
    verl_defaults: dict[str, Any] = {  # verl's critic optim defaults (verl/trainer/config/critic)
        "lr_warmup_steps_ratio": 0.0,
        "lr_warmup_steps": -1,
        "warmup_style": "constant",
        "lr_scheduler_type": "constant",
        "min_lr_ratio": 0.0,
        "betas": [0.9, 0.999],
    }
    given = {name: v.pop(CRIT + "optim." + name) for name in verl_defaults if CRIT + "optim." + name in v}
    has_critic = bool(given) or conv.get("algorithm.advantage.name") == "gae"
    if not has_critic:
        return

    def actor(name: str) -> Any:
        return keys.get(ACT + "optim." + name, verl_defaults[name])

    def critic(name: str) -> Any:
        return given.get(name, verl_defaults[name])

    def steps(x: Any) -> int:
        return max(int(x), 0) if x is not None else 0

    def same(key: str, val: Any, rlzoo_value: Any) -> None:
        if key in given:
            conv.skipped.append(
                (CRIT + "optim." + key, val, f"the critic follows trainer.optim here ({rlzoo_value!r})")
            )

    # the schedule's name: verl reads lr_scheduler_type over the older warmup_style
    def style(get: Callable[[str], Any], pick: Mapping[str, Any]) -> Any:
        return get("lr_scheduler_type") if "lr_scheduler_type" in pick else get("warmup_style")

    actor_given = {n: keys[ACT + "optim." + n] for n in verl_defaults if ACT + "optim." + n in keys}
    mine, theirs = style(critic, given), style(actor, actor_given)
    for key in ("lr_scheduler_type", "warmup_style"):
        if key in given:
            if mine != theirs:
                conv.set("trainer.optim.critic_lr_scheduler", mine, CRIT + "optim." + key, given[key])
            else:
                same(key, given[key], theirs)
    if mine != theirs and not any(k in given for k in ("lr_scheduler_type", "warmup_style")):
        conv.set("trainer.optim.critic_lr_scheduler", mine, CRIT + "optim.warmup_style", "(verl's default)")
    # warmup: steps win over the ratio, in verl as in rlzoo
    mine_w = (steps(critic("lr_warmup_steps")), float(critic("lr_warmup_steps_ratio") or 0.0))
    theirs_w = (steps(actor("lr_warmup_steps")), float(actor("lr_warmup_steps_ratio") or 0.0))
    mine_w = (mine_w[0], 0.0) if mine_w[0] else mine_w
    theirs_w = (theirs_w[0], 0.0) if theirs_w[0] else theirs_w
    if mine_w != theirs_w:
        w_key = "lr_warmup_steps" if mine_w[0] else "lr_warmup_steps_ratio"
        shown = given.get(w_key, "(verl's default)")
        if mine_w[0]:
            conv.set("trainer.optim.critic_warmup_steps", mine_w[0], CRIT + "optim." + w_key, shown)
        else:
            conv.set("trainer.optim.critic_warmup_ratio", mine_w[1], CRIT + "optim." + w_key, shown)
        for other in ("lr_warmup_steps", "lr_warmup_steps_ratio"):
            if other != w_key and other in given:
                conv.skipped.append((CRIT + "optim." + other, given[other], f"{w_key} decides the warmup"))
    else:
        for key in ("lr_warmup_steps", "lr_warmup_steps_ratio"):
            same(key, given.get(key), "the actor's warmup")
    floor_mine = float(critic("min_lr_ratio") or 0.0)
    floor_theirs = float(actor("min_lr_ratio") or 0.0)
    if floor_mine != floor_theirs:
        conv.set(
            "trainer.optim.critic_min_lr_ratio",
            floor_mine,
            CRIT + "optim.min_lr_ratio",
            critic("min_lr_ratio"),
        )
    else:
        same("min_lr_ratio", given.get("min_lr_ratio"), floor_theirs)
    if "betas" in given:
        val = given["betas"]
        if list(val) != list(actor("betas")):
            bad(
                CRIT + "optim.betas",
                val,
                f"rlzoo's AdamW betas are one setting (the actor's: {actor('betas')!r})",
            )
        else:
            same("betas", val, list(actor("betas")))


def _reinforce_bypass(
    conv: Conversion,
    key: str,
    label: str,
    is_: Any,
    is_thr: Any,
    norm: bool,
    rs: Any,
    veto: Any,
    bad: Callable[[str, Any, str], None],
) -> None:
    """verl's bypass mode with ``loss_type: reinforce``: its loss replaces the actor's policy loss (as in
    verl) -> ``policy_loss: reinforce_is`` (the IS weights inside the loss, against the rollout's
    log-probs) and ``rollout_correction: {name: none, mode: bypass}``."""
    if rs:
        bad(f"{key}.rollout_rs", rs, "rlzoo's reinforce_is loss has no rejection sampling (bypass REINFORCE)")
        return
    if veto is not None:
        bad(f"{key}.rollout_token_veto_threshold", veto, "rlzoo's reinforce_is loss has no token veto")
        return
    if is_ and isinstance(is_thr, str) and "_" in is_thr:
        bad(f"{key}.rollout_is_threshold", is_thr, "IcePop bounds with the bypass REINFORCE loss")
        return
    before = conv.get("algorithm.policy_loss.name", "ppo_clip")
    loss = {
        "name": "reinforce_is",
        "is_level": str(is_) if is_ else "none",
        "threshold": float(is_thr),
        "batch_normalize": norm,
    }
    note = f"verl's bypass REINFORCE loss replaces the actor's {before!r} loss, as in verl"
    conv.recipe.setdefault("algorithm", {})["policy_loss"] = {}
    conv.set("algorithm.policy_loss", loss, label, (is_, is_thr, norm, "reinforce"), note)
    conv.set(key, {"name": "none", "mode": "bypass"}, label, "bypass_mode")


def _correction(
    conv: Conversion, rc: dict[str, Any], v: dict[str, Any], bad: Callable[[str, Any, str], None]
) -> None:
    key = A + "rollout_correction"
    label = " + ".join(
        [f"{key}.{k}" for k in rc]
        + [k for k in (ACT + "use_rollout_log_probs", "async_training.use_rollout_log_probs") if k in v]
    )
    bypass = bool(rc.pop("bypass_mode", False))
    use_rollout = v.pop(ACT + "use_rollout_log_probs", None)
    async_rollout = v.pop("async_training.use_rollout_log_probs", None)
    bypass = bypass or bool(use_rollout) or bool(async_rollout)
    prox_key = "async_training.compute_prox_log_prob"
    if prox_key in v:
        prox = v.pop(prox_key)
        if prox and bypass:
            bad(
                prox_key,
                prox,
                "with use_rollout_log_probs: verl recomputes old log-probs with the weights of the last "
                "parameter sync; rlzoo's come from the trainer's current weights (decoupled) or from the "
                "rollout (bypass)",
            )
        else:
            why = "the trainer recomputes old log-probs (correction mode decoupled)" if prox else "off"
            conv.skipped.append((prox_key, prox, why))
    is_, is_thr = rc.pop("rollout_is", None), rc.pop("rollout_is_threshold", 2.0)
    rs, rs_thr = rc.pop("rollout_rs", None), rc.pop("rollout_rs_threshold", None)
    norm = bool(rc.pop("rollout_is_batch_normalize", False))
    veto = rc.pop("rollout_token_veto_threshold", None)
    loss_type = rc.pop("loss_type", "ppo_clip")
    for k, val in rc.items():
        bad(f"{key}.{k}", val, "not a verl 0.9.1 rollout_correction option rlzoo maps")
    if loss_type == "reinforce" and bypass:
        _reinforce_bypass(conv, key, label, is_, is_thr, norm, rs, veto, bad)
        return
    if loss_type != "ppo_clip" and bypass:
        bad(f"{key}.loss_type", loss_type, "verl 0.9.1 knows ppo_clip and reinforce")
    elif f"{key}.loss_type" in label.split(" + "):
        why = (
            "ppo_clip: the selected policy loss, as rlzoo"
            if loss_type == "ppo_clip"
            else "read in bypass mode only"
        )
        conv.skipped.append((f"{key}.loss_type", loss_type, why))
    part: dict[str, Any]
    if rs:
        if rs_thr is None:
            bad(f"{key}.rollout_rs_threshold", None, "verl requires it with rollout_rs")
            return
        part = {"name": "rejection", "criteria": str(rs), "thresholds": str(rs_thr)}
        if is_:
            if isinstance(is_thr, str) and "_" in is_thr:
                bad(f"{key}.rollout_is_threshold", is_thr, "IcePop bounds together with rollout_rs")
                return
            part.update(is_level=str(is_), is_threshold=float(is_thr))
    elif is_:
        if isinstance(is_thr, str) and "_" in is_thr:
            if is_ != "token":
                bad(f"{key}.rollout_is", is_, "IcePop bounds work per token in rlzoo")
                return
            low, high = (float(x) for x in is_thr.split("_", 1))
            part = {"name": "icepop", "low": low, "high": high}
        else:
            part = {
                "name": "token_is" if is_ == "token" else "seq_is",
                "threshold": float(is_thr),
                "batch_normalize": norm,
            }
    elif veto is not None:
        bad(f"{key}.rollout_token_veto_threshold", veto, "a veto needs rollout_is or rollout_rs in rlzoo")
        return
    elif bypass:
        part = {"name": "none"}
    else:
        for k in label.split(" + ") if label else []:
            if not k.endswith(".loss_type"):
                conv.skipped.append((k, None, "off: no rollout_is / rollout_rs and no bypass, as verl"))
        return
    if veto is not None:
        part["token_veto_threshold"] = float(veto)
    part["mode"] = "bypass" if bypass else "decoupled"
    source = (is_, is_thr, rs, rs_thr, bypass, veto)
    conv.set(key, part, label, source)


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def render(conv: Conversion, source: str) -> str:
    """The recipe as YAML, with a header naming the source and any manual steps."""
    import yaml

    head = [
        f"# Converted from verl by `rlzoo from-verl {source}`.",
        "# Every verl key and where it went: docs/from-verl.md.",
    ]
    for k, v, why in conv.manual:
        head.append(f"# MANUAL STEP: {k}={v!r}: {why}")
    order = ["run", "model", "data", "algorithm", "reward", "rollout", "trainer", "runner", "placement"]
    recipe = {k: conv.recipe[k] for k in order if k in conv.recipe}
    recipe.update({k: v for k, v in conv.recipe.items() if k not in recipe})
    return "\n".join(head) + "\n" + yaml.safe_dump(recipe, sort_keys=False, default_flow_style=False)


#: the largest launch script read (verl's own are under 20 KiB) and the largest recipe written
MAX_SCRIPT_BYTES = 1 << 20
MAX_RECIPE_CHARS = 4 << 20


def _script_bytes(path: Path, label: str) -> bytes:
    """The bytes of the launch script at ``path``: a regular file of at most :data:`MAX_SCRIPT_BYTES`
    (a FIFO, a device such as /dev/zero or a directory is named and never opened)."""
    import stat

    hint = "give a verl launch script (.sh) or verl's key=value overrides"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise RlzooError(f"from-verl: {label} does not exist; {hint}") from None
    except OSError as exc:
        raise RlzooError(f"from-verl: cannot read {label}: {exc.strerror}; {hint}") from None
    if not stat.S_ISREG(mode):
        kinds = (
            (stat.S_ISDIR, "a directory"),
            (stat.S_ISFIFO, "a FIFO (named pipe)"),
            (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"),
        )
        kind = next((k for test, k in kinds if test(mode)), "not a regular file")
        raise RlzooError(f"from-verl: {label} is {kind}, not a regular file; it was not read. {hint}")
    with open(path, "rb") as fh:
        data = fh.read(MAX_SCRIPT_BYTES + 1)
    if len(data) > MAX_SCRIPT_BYTES:
        raise RlzooError(
            f"from-verl: {label} is larger than {MAX_SCRIPT_BYTES:,} bytes, which no launch script is; {hint}"
        )
    return data


def from_verl(
    source: str | Sequence[str], out: str | Path | None = None, fixed: Mapping[str, str] | None = None
) -> tuple[Conversion, str]:
    """Read a script path or override words, convert, optionally write ``out``; returns (conversion, yaml).
    ``fixed``: shell variables given with ``--env`` (the script's own assignments to them are skipped)."""
    words = [source] if isinstance(source, str) else list(source)
    if len(words) == 1 and "=" not in words[0]:
        path = Path(words[0])
        label = words[0]
        command = parse_command(read_script(_script_bytes(path, label), label), fixed=fixed)
    else:
        label = "<overrides>"
        command = parse_overrides(words)
    conv = convert(command)
    yaml_text = render(conv, label)
    if len(yaml_text) > MAX_RECIPE_CHARS:
        raise RlzooError(
            f"from-verl: the recipe converted from {label} would be {len(yaml_text):,} characters, more than "
            f"the {MAX_RECIPE_CHARS:,} a recipe may be; nothing was written"
        )
    if out is not None:
        Path(out).write_text(yaml_text)
    return conv, yaml_text
