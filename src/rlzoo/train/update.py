"""The policy update shared by every runner: samples -> old / ref log-probs, values, rewards,
advantages -> PPO epochs over mini-batches.

:class:`PolicyTrainer` takes flat arguments (parts and numbers); :func:`trainer_setup` is the one place
that reads a recipe for it, at the edge (:func:`rlzoo.train.inputs.run_inputs`), into a frozen
:class:`TrainerSetup` from which the session builds the trainer over its train backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import (
    AdvantageInputs,
    CorrectionInputs,
    CorrectionMode,
    PromptLogProbSource,
    RewardComponentKeys,
    SumPiSquaredSource,
)
from rlzoo.recipe.types import KLControlSection, RecipeConfig, Selection
from rlzoo.report.metrics import mean_metrics
from rlzoo.train.objective import PolicyObjective, ValueObjective, agg_context
from rlzoo.train.rewards import reward_components
from rlzoo.train_kit.formulas import AdaptiveKLController, FixedKLController, apply_kl_penalty


@dataclass(frozen=True)
class UpdateSettings:
    """The numbers of one PPO update (all from the recipe's ``trainer`` / ``algorithm`` sections)."""

    rollout_n: int  # responses per prompt (a mini-batch of M prompts holds M * n samples)
    mini_batch_prompts: int | None  # prompts per PPO mini-batch; None: the whole batch
    ppo_epochs: int
    shuffle_mini_batches: bool
    seed: int
    critic_warmup: int  # steps that train only the critic
    max_response_length: int
    entropy_coeff: float = 0.0
    kl_loss_coef: float = 0.0
    value_clip: float = 0.5
    # skip the old-log-prob forward when the update is exactly on-policy (see PolicyTrainer.reuses_log_probs)
    reuse_on_policy_log_probs: bool = True


@dataclass(frozen=True)
class TrainerSetup:
    """What :class:`PolicyTrainer` takes besides its backend, read from the recipe once (:func:`trainer_setup`)."""

    settings: UpdateSettings
    advantage: Selection
    policy_loss: Selection
    loss_agg: Selection
    kl_loss: Selection | None  # None: no KL loss
    kl_penalty: Selection | None  # None: no KL in the reward
    kl_ctrl: KLControlSection | None  # the in-reward KL coefficient's controller (with kl_penalty)
    correction: Selection | None
    correction_bypass: bool
    needs_reference: bool
    needs_critic: bool
    advantage_reads_old_log_probs: bool
    needs_sum_pi_squared: bool
    reward_keys: tuple[str, ...]
    #: the teacher's log-probs are computed (``teacher_log_probs``): a needs_teacher advantage or the
    #: teacher-KL loss term asks for them
    needs_teacher: bool = False
    teacher_kl_loss: Selection | None = None  # the teacher-KL loss term's estimator; None: off
    teacher_kl_coef: float = 0.0

    def build(self, backend: Any, **parts: Any) -> PolicyTrainer:
        """The trainer over ``backend`` (``parts``: e.g. ``offpolicy_metrics``)."""
        return PolicyTrainer(backend, self, **parts)


def trainer_setup(cfg: RecipeConfig) -> TrainerSetup:
    """Read the recipe once: the edge between the config and the trainer."""
    alg, tr = cfg.algorithm, cfg.trainer
    corr: Selection | None = alg.rollout_correction
    settings = UpdateSettings(
        rollout_n=cfg.rollout.n,
        mini_batch_prompts=tr.ppo_mini_batch_size,
        ppo_epochs=tr.ppo_epochs,
        shuffle_mini_batches=tr.shuffle_mini_batches,
        seed=cfg.run.seed,
        critic_warmup=tr.critic_warmup,
        max_response_length=cfg.data.max_response_length,
        entropy_coeff=alg.entropy_coeff,
        kl_loss_coef=alg.kl_loss_coef if alg.use_kl_loss else 0.0,
        value_clip=alg.value_clip,
    )
    adv_caps = alg.advantage.caps
    reward_keys: tuple[str, ...] = ()
    if adv_caps.needs_reward_components:
        if not isinstance(alg.advantage.params, RewardComponentKeys):
            raise TypeError(
                f"advantage {alg.advantage.name!r} declares needs_reward_components, but its params "
                f"{type(alg.advantage.params).__name__} have no reward_keys (rlzoo.kernel.protocols.RewardComponentKeys)"
            )
        reward_keys = tuple(str(k) for k in alg.advantage.params.reward_keys)
    return TrainerSetup(
        settings,
        advantage=alg.advantage,
        policy_loss=alg.policy_loss,
        loss_agg=alg.loss_agg,
        kl_loss=alg.kl_loss if alg.use_kl_loss else None,
        kl_penalty=alg.kl_penalty if alg.use_kl_in_reward else None,
        kl_ctrl=alg.kl_ctrl if alg.use_kl_in_reward else None,
        correction=corr,
        correction_bypass=corr is not None
        and isinstance(corr.params, CorrectionMode)
        and corr.params.mode == "bypass",
        needs_reference=alg.use_kl_loss or alg.use_kl_in_reward,
        needs_critic=bool(alg.advantage.capability("needs_critic")),
        advantage_reads_old_log_probs=adv_caps.needs_old_log_probs,
        needs_sum_pi_squared=adv_caps.needs_sum_pi_squared,
        reward_keys=reward_keys,
        needs_teacher=bool(adv_caps.needs_teacher) or alg.teacher_kl_coef > 0,
        teacher_kl_loss=alg.teacher_kl_loss if alg.teacher_kl_coef > 0 else None,
        teacher_kl_coef=alg.teacher_kl_coef,
    )


class PolicyTrainer:
    """One training step on a collated batch.

    Args:
        backend: the train backend (log-probs, values, updates).
        setup: what the recipe selected (:class:`TrainerSetup`): the update's numbers, the parts
            (``kl_loss`` / ``kl_penalty`` None when off; the in-reward KL's controller is built
            here from ``kl_ctrl``), the correction and its bypass mode, what the parts need
            computed, and the reward components the advantage reads.
        offpolicy_metrics: ``fn(old, rollout, mask) -> metrics`` logged when no correction is selected.
        teacher: the teacher's own rollout engine (``algorithm.teacher.backend: rollout``), which
            scores the teacher's log-probs instead of ``backend.compute_log_probs(model="teacher")``.
    """

    def __init__(
        self,
        backend: Any,
        setup: TrainerSetup,
        *,
        offpolicy_metrics: Callable[..., Mapping[str, Any]] | None = None,
        teacher: PromptLogProbSource | None = None,
    ) -> None:
        self.backend = backend
        self.teacher = teacher
        self.setup = setup
        self.settings = setup.settings
        self.offpolicy_metrics = offpolicy_metrics
        kc = setup.kl_ctrl
        self.kl_ctrl: FixedKLController | AdaptiveKLController | None = None
        if kc is not None:
            self.kl_ctrl = (
                AdaptiveKLController(kc.kl_coef, kc.target_kl, kc.horizon)
                if kc.type == "adaptive"
                else FixedKLController(kc.kl_coef)
            )
        # the advantage reads old log-probs (or sum_pi_squared): computed before it even on-policy
        self.adv_reads_old = setup.advantage_reads_old_log_probs or setup.needs_sum_pi_squared
        needs_sum_pi_squared, advantage = setup.needs_sum_pi_squared, setup.advantage
        if needs_sum_pi_squared and not isinstance(backend, SumPiSquaredSource):
            raise TypeError(
                f"advantage {advantage.name!r} needs sum_pi_squared (needs_sum_pi_squared), but the train "
                f"backend {type(backend).__name__} has no compute_log_probs_and_sum_pi_squared "
                "(capability supplies_sum_pi_squared); use trainer.backend=native or fsdp2"
            )
        self.step_count = 0

    # -- phases ---------------------------------------------------------------------------------
    def prepare(self, batch: Batch, timer: Callable[[str], Any]) -> dict[str, float]:
        """Fill old / ref log-probs, values, token rewards, correction weights and advantages."""
        m: dict[str, float] = {}
        reuse = self.reuses_log_probs(batch)
        m["actor/old_log_prob_skipped"] = float(reuse)
        with timer("old_log_prob"):
            if (
                self.setup.needs_sum_pi_squared
            ):  # one forward gives both (a SumPiSquaredSource, checked at init)
                old, batch["sum_pi_squared"] = self.backend.compute_log_probs_and_sum_pi_squared(batch)
                batch["old_log_probs"] = (
                    batch["rollout_log_probs"].clone() if self.setup.correction_bypass else old
                )
            elif self.setup.correction_bypass:
                batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            elif not reuse:  # reuse: the update's own forward gives them (PolicyObjective)
                batch["old_log_probs"], _ = self.backend.compute_log_probs(batch)
        if self.setup.needs_reference:
            with timer("ref"):
                batch["ref_log_probs"], _ = self.backend.compute_log_probs(batch, model="ref")
        if self.setup.needs_teacher:
            with timer("teacher"):
                # the teacher scores only the trained tokens (a multi-turn trajectory's observations: 0)
                if self.teacher is not None:  # the teacher's rollout engine: prompt log-probs
                    teacher = engine_teacher_log_probs(self.teacher, batch)  # [B, T]
                else:
                    teacher, _ = self.backend.compute_log_probs(batch, model="teacher")  # [B, T]
                batch["teacher_log_probs"] = teacher * batch["response_mask"].to(teacher.dtype)
            m.update(_teacher_metrics(batch))
        if self.setup.needs_critic:
            with timer("values"):
                batch["values"] = self.backend.compute_values(batch)
        with timer("adv"):
            if self.setup.kl_penalty is not None:
                assert self.kl_ctrl is not None
                mask = batch["response_mask"].float()  # [B, T]
                kl = self.setup.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"])  # [B, T]
                rewards, km = apply_kl_penalty(batch["token_level_scores"], kl, mask, self.kl_ctrl.value)
                self.kl_ctrl.update(km["reward_kl_penalty"], n_steps=len(batch))
                batch["token_level_rewards"] = rewards
                m.update({f"actor/{k}": v for k, v in km.items()})
            else:
                batch["token_level_rewards"] = batch["token_level_scores"]
            if self.setup.correction is not None:
                out = self.setup.correction(
                    CorrectionInputs(
                        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
                    )
                )
                if out.weights is not None:
                    batch["rollout_is_weights"] = out.weights.detach()
                batch["response_mask"] = out.mask.to(batch["response_mask"].dtype)
                m.update({_corr_key(k): v for k, v in out.metrics.items()})
            elif self.offpolicy_metrics is not None and not reuse and "rollout_log_probs" in batch:
                # reuse: measured in the update; no rollout log-probs (demonstrations): nothing to measure
                diag = self.offpolicy_metrics(
                    batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
                )
                m.update({_corr_key(k): v for k, v in diag.items()})
            if not self.setup.policy_loss.caps.reads_advantages:  # nll (demonstrations): none computed
                zeros = torch.zeros_like(batch["token_level_rewards"])  # [B, T]
                batch["advantages"], batch["returns"] = zeros, zeros
                return m
            inputs = AdvantageInputs(
                token_level_rewards=batch["token_level_rewards"],
                response_mask=batch["response_mask"],
                group_ids=batch["group_ids"],
                values=batch.get("values"),
                baseline_rewards=batch.get("baseline_rewards"),
                old_log_probs=batch.get("old_log_probs"),
                sum_pi_squared=batch.get("sum_pi_squared"),
                rollout_is_weights=batch.get("rollout_is_weights"),
                turn_ids=batch.get("turn_ids"),
                teacher_log_probs=batch.get("teacher_log_probs"),
                reward_components=(
                    reward_components(
                        batch, self.setup.reward_keys, f"advantage {self.setup.advantage.name!r}"
                    )
                    if self.setup.reward_keys
                    else None
                ),
            )
            out_adv = self.setup.advantage(inputs)
            batch["advantages"], batch["returns"] = out_adv.advantages, out_adv.returns
        valid = batch["response_mask"].bool()  # [B, T]
        if valid.any():
            a = batch["advantages"][valid]  # [N valid tokens]
            m["critic/advantages/mean"] = a.mean().item()
            m["critic/advantages/max"] = a.max().item()
            m["critic/advantages/min"] = a.min().item()
            m["critic/rewards/mean"] = batch["token_level_rewards"].sum(-1).mean().item()
        return m

    def reuses_log_probs(self, batch: Batch) -> bool:
        """True when the old log-probs need no forward of their own: the update is exactly on-policy.

        With one PPO epoch over one mini-batch there is one optimizer step, and every micro-batch
        of it is evaluated with the weights the old log-probs would be computed with, so
        ``old_log_probs == log_probs.detach()`` (ratio 1, the same loss and gradient). Not when a
        part reads the old log-probs before the update (a rollout correction, bypass mode, a KL
        penalty in the reward, an advantage that reads old log-probs or sum_pi_squared). The
        rollout-vs-trainer drift (``rollout_corr/*``) is then measured on the update's forward.
        """
        st = self.settings
        one_mini_batch = st.mini_batch_prompts is None or st.mini_batch_prompts * st.rollout_n >= len(batch)
        return (
            st.reuse_on_policy_log_probs
            and st.ppo_epochs == 1
            and one_mini_batch
            and not self.setup.correction_bypass
            and self.setup.correction is None
            and self.setup.kl_penalty is None
            and not self.adv_reads_old
        )

    def mini_batches(self, batch: Batch, epoch: int) -> list[Batch]:
        st = self.settings
        size = len(batch) if st.mini_batch_prompts is None else st.mini_batch_prompts * st.rollout_n
        if st.shuffle_mini_batches:
            g = torch.Generator().manual_seed(st.seed * 7919 + self.step_count * 31 + epoch)
            batch = batch.select(torch.randperm(len(batch), generator=g))
        return batch.split(max(1, size))

    def update(self, batch: Batch, timer: Callable[[str], Any]) -> dict[str, float]:
        st = self.settings
        metrics: list[dict[str, float]] = []
        for epoch in range(st.ppo_epochs):
            for mb in self.mini_batches(batch, epoch):
                ctx = agg_context(mb, st.max_response_length)
                if self.setup.needs_critic:
                    with timer("update_critic"):
                        vobj = ValueObjective(self.setup.loss_agg, ctx, st.value_clip)
                        cm = self.backend.update_critic(mb, vobj)
                        metrics.append({**cm, **vobj.summary()})
                if self.step_count >= st.critic_warmup:
                    with timer("update_actor"):
                        obj = PolicyObjective(
                            self.setup.policy_loss,
                            self.setup.loss_agg,
                            ctx,
                            kl_loss=self.setup.kl_loss,
                            kl_coef=st.kl_loss_coef if self.setup.kl_loss is not None else 0.0,
                            teacher_kl_loss=self.setup.teacher_kl_loss,
                            teacher_kl_coef=self.setup.teacher_kl_coef,
                            entropy_coeff=st.entropy_coeff,
                            offpolicy_metrics=self.offpolicy_metrics,
                        )
                        am = self.backend.update_policy(mb, obj)
                        metrics.append({**am, **obj.summary()})
        self.step_count += 1
        return mean_metrics(metrics)

    def step(self, batch: Batch, timer: Callable[[str], Any]) -> dict[str, float]:
        m = self.prepare(batch, timer)
        m.update(self.update(batch, timer))
        return m

    def state_dict(self) -> dict[str, Any]:
        return {
            "step_count": self.step_count,
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step_count = int(state.get("step_count", 0))
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = float(state["kl_coef"])


def engine_teacher_log_probs(source: PromptLogProbSource, batch: Batch) -> Tensor:
    """The teacher's log-probs ``[B, T]`` (fp32, 0 on response padding) of the batch's response
    tokens, scored by an engine's prompt log-probs: each row's real tokens (the left-padded prompt,
    then the right-padded response, as rlzoo.kernel.batch lays them out) are one sequence, scored
    from the response's first token on."""
    ids, attn = batch["input_ids"], batch["attention_mask"].bool()  # [B, S]
    T = batch["responses"].shape[1]
    P = ids.shape[1] - T
    seqs, starts, lengths, rows = [], [], [], []
    for i in range(ids.shape[0]):
        p, r = int(attn[i, :P].sum()), int(attn[i, P:].sum())
        if r == 0:
            continue
        if p == 0:
            raise ValueError(
                f"teacher: row {i} has no prompt token; an engine scores a token given its prefix"
            )
        seqs.append(ids[i][attn[i]].tolist())
        starts.append(p)
        lengths.append(r)
        rows.append(i)
    out = torch.zeros(ids.shape[0], T, dtype=torch.float32)
    scored = source.prompt_log_probs(seqs, starts) if seqs else []
    if len(scored) != len(seqs):
        raise ValueError(f"teacher: the engine scored {len(scored)} sequences of {len(seqs)}")
    for i, r, lp in zip(rows, lengths, scored):
        if len(lp) != r:
            raise ValueError(
                f"teacher: the engine gave {len(lp)} log-probs for row {i}'s {r} response tokens"
            )
        out[i, :r] = torch.tensor(lp, dtype=torch.float32)
    return out.to(ids.device)


def _teacher_metrics(batch: Batch) -> dict[str, float]:
    """``distill/reverse_kl``: the mean over trained tokens of log pi_student - log pi_teacher (k1 of
    the reverse KL, on the student's samples), with the student's log-probs at hand (the trainer's
    old log-probs, else the rollout's); ``distill/teacher_log_prob``: the teacher's mean log-prob."""
    valid = batch["response_mask"].bool()  # [B, T]
    if not valid.any():
        return {}
    teacher = batch["teacher_log_probs"][valid]  # [N]
    out = {"distill/teacher_log_prob": teacher.mean().item()}
    student = batch.get("old_log_probs")
    if student is None:
        student = batch.get("rollout_log_probs")
    if student is not None:
        out["distill/reverse_kl"] = (student[valid] - teacher).mean().item()
    return out


def _corr_key(k: str) -> str:
    """Correction metrics under ``rollout_corr/`` (parts may already prefix them)."""
    return k if k.startswith("rollout_corr/") else f"rollout_corr/{k}"
