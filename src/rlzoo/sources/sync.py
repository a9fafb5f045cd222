"""The synchronous runner: the batch source "generate now" for the one loop (:mod:`rlzoo.train.loop`).

prompts -> rollout (n per prompt) -> rewards -> [filter / refill] -> the loop's update -> weight push
every step. Validation, checkpoints, metrics and resume are the loop's.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import Message, RefillLimit, RewardResult, Sample
from rlzoo.sources.params import SyncParams
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.loop import StepTimer
from rlzoo.train.session import Session

logger = logging.getLogger("rlzoo")

#: data key of a greedy-baseline sample: the request id whose samples it is the baseline for
BASELINE_OF = "greedy_baseline_of"


def generate_groups(
    s: Session, loader: Any, step: int, timer: StepTimer
) -> tuple[Batch | None, dict[str, float]]:
    """One training batch of groups: generate, score, filter (refilling), greedy baselines.

    The trainer waits through the generation and the scoring (``timer.wait``). Returns no batch
    when a sample filter dropped every group (the step is skipped).
    """
    want = s.plan.prompts_per_step
    kept_s: list[Sample] = []
    kept_r: list[RewardResult] = []
    rounds, dropped = 0, 0
    flt = s.reward.sample_filter
    max_rounds = flt.params.max_num_gen_batches if flt and isinstance(flt.params, RefillLimit) else 0
    refills = flt is not None and flt.capability("refills")
    while True:
        rounds += 1
        items = list(next(loader))
        reqs = s.train_requests(items, step, rounds)
        if s.reward.greedy_baseline:  # one greedy response per prompt, tagged with the request it serves
            greedy_reqs = s.train_requests(items, step, rounds, greedy=True)
            for g, r in zip(greedy_reqs, reqs):
                g.data[BASELINE_OF] = r.request_id
            reqs += greedy_reqs
        with timer.wait("gen"):
            samples = s.rollout.generate(reqs)
        with timer.wait("reward"):
            results = s.score(samples)
        if s.reward.greedy_baseline:
            base = {
                smp.data[BASELINE_OF]: r.reward for smp, r in zip(samples, results) if BASELINE_OF in smp.data
            }
            pairs = [(smp, r) for smp, r in zip(samples, results) if BASELINE_OF not in smp.data]
            for smp, _ in pairs:
                smp.data["baseline_reward"] = base.get(smp.request_id, 0.0)
            samples, results = [p[0] for p in pairs], [p[1] for p in pairs]
        if flt is not None:
            keep = s.keep(samples, results)
            dropped += len({smp.request_id for smp, k in zip(samples, keep) if not k})
            samples = [smp for smp, k in zip(samples, keep) if k]
            results = [r for r, k in zip(results, keep) if k]
        kept_s += samples
        kept_r += results
        groups = len({smp.request_id for smp in kept_s})
        if not refills or groups >= want or (max_rounds and rounds >= max_rounds):
            break
    extra = {"rollout/gen_rounds": float(rounds), "rollout/dropped_groups": float(dropped)}
    if not kept_s:
        # every group had zero reward variance (zero advantage: nothing to learn from)
        logger.warning(
            "step %d: the sample filter dropped all %d groups after %d generation round(s); skipping "
            "the update (raise max_num_gen_batches, or the data may be too hard / too easy)",
            step,
            dropped,
            rounds,
        )
        return None, extra
    order: dict[str, int] = {}
    for smp in kept_s:
        order.setdefault(smp.request_id, len(order))
    chosen = {rid for rid, i in order.items() if i < want}
    pairs = [(smp, r) for smp, r in zip(kept_s, kept_r) if smp.request_id in chosen]
    samples, results = [p[0] for p in pairs], [p[1] for p in pairs]
    max_len = s.data.max_response_length
    batch = samples_to_batch(samples, results, s.pad_token_id, max_response_length=max_len)
    if s.reward.greedy_baseline:
        import torch

        batch["baseline_rewards"] = torch.tensor([smp.data.get("baseline_reward", 0.0) for smp in samples])
    return batch, extra  # the batch's own metrics (critic/score, agent/* ...) are the loop's


def on_policy_draw(seed: int, step: int) -> float:
    """``u`` uniform in [0, 1) of one step (TRL's GKD draws ``random.random()`` per training step):
    a function of (seed, step) only, so a resumed run draws what the uninterrupted one did."""
    return random.Random(seed * 1_000_003 + step).random()


def reply_ids(template: Any, prompt: Sequence[Message], reply: str, eos: int) -> list[int]:
    """The ids the policy would sample for ``reply`` after ``prompt``: the template's rendering of the
    assistant turn after its generation prompt, up to and with its stop token (as a demonstration's
    turn, :mod:`rlzoo.sources.demos`); a template that closes the turn with no stop token (e.g. the
    quickstart's) gets ``eos`` appended, the token a sampled response ends with."""
    from rlzoo.agents.chat import TemplateTurnError
    from rlzoo.sources.demos import _turn_ids

    turn: Message = {"role": "assistant", "content": reply}
    try:
        return _turn_ids(template, prompt, turn)
    except TemplateTurnError:
        context = template.ids(prompt, add_generation_prompt=True)
        full = template.ids([*prompt, turn], add_generation_prompt=False)
        return [*full[len(context) :], eos]


def dataset_samples(s: Session, items: Sequence[dict[str, Any]], step: int, template: Any) -> list[Sample]:
    """The items' own ``response`` as samples (:func:`reply_ids`), cut to
    ``data.max_response_length``, each repeated ``rollout.n`` times (a group, as a generated batch
    holds), trained on every token."""
    from rlzoo.sources.demos import DemoError

    version = int(s.rollout.version)
    limit = s.data.max_response_length
    out: list[Sample] = []
    for j, item in enumerate(items):
        reply = item.get("response")
        if not isinstance(reply, str) or not reply.strip():
            raise DemoError(
                f"runner.on_policy_fraction < 1: training row {item.get('index')} has no response ({reply!r}); "
                "every training row needs a non-empty 'response', or set runner.on_policy_fraction=1"
            )
        response = reply_ids(template, item["messages"], reply, s.backends.stop_ids[0])
        cut = len(response) > limit
        response = response[:limit]
        data = {k: item.get(k) for k in ("ground_truth", "data_source", "extra_info", "index")}
        for k in range(s.sampling.train.n):
            out.append(
                Sample(
                    request_id=f"s{step}d{j}",
                    index=k,
                    prompt_ids=list(item["prompt_ids"]),
                    response_ids=list(response),
                    rollout_log_probs=[0.0] * len(response),
                    versions=[version] * len(response),
                    finish_reason="length" if cut else "stop",
                    data=dict(data),
                )
            )
    return out


class GenerateNow:
    """Batch source of ``sync``: generate the step's batch when the loop asks for it (or, with
    ``on_policy_fraction < 1``, take the step's rows' own responses: :class:`SyncParams`)."""

    def __init__(self, params: SyncParams, session: Session) -> None:
        self.s = session
        self.fraction = params.on_policy_fraction
        self.loader = session.make_loader(session.plan.prompts_per_step)
        self._metrics: dict[str, float] = {}
        self._template: Any = None
        if self.fraction < 1.0:  # the files may have been prepared after validate: check them again
            from rlzoo.agents.chat import ChatTemplate
            from rlzoo.data.schema import rows_without_response
            from rlzoo.kernel.errors import ConfigError

            bad = rows_without_response(list(session.data.train.files))
            if bad:
                raise ConfigError(
                    [
                        f"runner.on_policy_fraction: {self.fraction} needs a response in every training row, but {bad}"
                    ]
                )
            data = session.data
            self._template = ChatTemplate(
                data.tokenizer, [], session.backends.stop_ids, data.chat_template_kwargs
            )

    def resume(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])

    def next_batch(self, step: int, timer: StepTimer) -> Batch | None:
        if self.fraction >= 1.0 or on_policy_draw(self.s.sampling.seed, step) <= self.fraction:
            batch, self._metrics = generate_groups(self.s, self.loader, step, timer)
            if self.fraction < 1.0:
                self._metrics["rollout/on_policy"] = 1.0
            return batch
        with timer("data"):
            samples = dataset_samples(self.s, list(next(self.loader)), step, self._template)
        with timer.wait("reward"):
            results = self.s.score(samples)
        batch = samples_to_batch(
            samples, results, self.s.pad_token_id, max_response_length=self.s.data.max_response_length
        )
        del batch.tensors["rollout_log_probs"]  # not sampled: nothing to measure the trainer against
        self._metrics = {"rollout/on_policy": 0.0}
        return batch

    def push_weights(self, timer: StepTimer) -> dict[str, float]:
        return self.s.sync_weights()

    def step_done(self, batch: Batch | None) -> dict[str, float]:
        return self._metrics  # the generation's: rounds, dropped groups, response lengths ...

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict(), "pending": []}
