"""The ``sft`` runner: batches of demonstrations for the one loop (supervised fine-tuning).

Each step draws ``data.train_batch_size`` demonstrations (:mod:`rlzoo.sources.demos`: rendered
with the chat template code the multi-turn rollout uses, loss on the assistant tokens only) and
collates them as the rollout's samples are collated, one sample per demonstration, with no rollout
log-probs and zero rewards; ``policy_loss: nll`` trains on them. Validation, checkpoints, resume,
export, LoRA and the train backends are the loop's, as for every runner. The demonstrations' order
is the prompt loader's (seeded, resumable mid-epoch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from rlzoo.agents.chat import ChatTemplate
from rlzoo.data.dataset import PromptLoader
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import Demonstrates, Message, Sample, Tool
from rlzoo.sources.demos import Demo, DemoError, DemoSet, build_demos, read_conversations, write_conversations
from rlzoo.sources.params import SFTParams
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.loop import StepTimer
from rlzoo.train.session import Session

logger = logging.getLogger("rlzoo")


def _tools(session: Session) -> list[Tool]:
    """The tools a trajectory offers (the environment's own, then rollout.tools): their schemas go
    to the template as the rollout gives them."""
    agent = session.backends.agent
    if agent is None:
        return []
    return [*agent.make_env().tools(), *agent.tools]


def generate_demos(session: Session, count: int) -> list[tuple[list[Message], dict[str, Any]]]:
    """``count`` demonstrations: the environment's solutions of the first training rows, in order."""
    agent = session.backends.agent
    env = agent.make_env() if agent is not None else None
    if not isinstance(env, Demonstrates):
        raise DemoError(
            f"runner.generate: the environment {agent.env_name if agent else None!r} has no solve(row) "
            "(rlzoo.kernel.protocols.Demonstrates) to write demonstrations with; give runner.files that exist"
        )
    train = session.data.train
    if len(train) < count:
        raise DemoError(
            f"runner.generate: {count} demonstrations asked, the training data has {len(train)} rows"
        )
    out = []
    for i in range(count):
        item = train[i]
        row = {k: item.get(k) for k in ("ground_truth", "data_source", "extra_info", "prompt_text", "index")}
        row["prompt_ids"] = list(item["prompt_ids"])
        env = agent.make_env() if agent is not None else env  # one environment per episode
        assert isinstance(env, Demonstrates)
        out.append(
            (list(env.solve(row)), {"data_source": row["data_source"], "extra_info": row["extra_info"]})
        )
    return out


class FromDemonstrations:
    """Batch source of ``sft``: the step's demonstrations, collated as samples."""

    def __init__(self, params: SFTParams, session: Session) -> None:
        self.s = session
        files = [Path(f).expanduser() for f in params.files]
        if params.generate and not files[0].exists():
            write_conversations(files[0], generate_demos(session, params.generate))
            print(f"rlzoo: sft: wrote {params.generate} demonstrations to {files[0]}", flush=True)
        conversations = read_conversations(
            files,
            messages_key=params.messages_key,
            prompt_key=params.prompt_key,
            response_key=params.response_key,
        )
        template = ChatTemplate(
            session.data.tokenizer,
            _tools(session),
            session.backends.stop_ids,
            session.data.chat_template_kwargs,
        )
        data = session.data
        demos, stats = build_demos(
            template,
            conversations,
            max_prompt_length=data.max_prompt_length or None,
            max_response_length=data.max_response_length,
        )
        if stats["too_long"]:
            logger.warning(
                "sft: %d of %d demonstrations dropped: longer than data.max_prompt_length=%d / "
                "data.max_response_length=%d tokens",
                stats["too_long"],
                stats["total"],
                data.max_prompt_length,
                data.max_response_length,
            )
        print(f"rlzoo: sft: {stats['kept']} demonstrations from {', '.join(map(str, files))}", flush=True)
        self.demos = DemoSet(demos)
        size = session.plan.prompts_per_step
        if len(self.demos) < size:
            raise DemoError(
                f"runner sft: {len(self.demos)} demonstrations, fewer than one step's data.train_batch_size={size}; "
                "lower data.train_batch_size or add demonstrations"
            )
        self.loader = PromptLoader(self.demos, size, shuffle=data.shuffle, seed=session.sampling.seed)
        self._metrics: dict[str, float] = {}

    def resume(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])

    def next_batch(self, step: int, timer: StepTimer) -> Batch | None:
        with timer("data"):
            demos = [cast(Demo, d) for d in next(self.loader)]  # the loader serves DemoSet's items
            version = int(self.s.rollout.version)
            samples = [
                Sample(
                    request_id=f"s{step}-{j}",
                    index=0,
                    prompt_ids=list(d.prompt_ids),
                    response_ids=list(d.response_ids),
                    rollout_log_probs=[0.0] * len(d.response_ids),
                    versions=[version] * len(d.response_ids),
                    finish_reason="stop",
                    data=dict(d.data),
                    loss_mask=list(d.loss_mask),
                )
                for j, d in enumerate(demos)
            ]
            batch = samples_to_batch(
                samples, None, self.s.pad_token_id, max_response_length=self.s.data.max_response_length
            )
            del batch.tensors["rollout_log_probs"]  # no rollout: nothing to measure the trainer against
        self._metrics = _demo_metrics(demos, self.loader.epoch)
        return batch

    def push_weights(self, timer: StepTimer) -> dict[str, float]:
        return self.s.sync_weights()  # validation generates with the trained weights

    def step_done(self, batch: Batch | None) -> dict[str, float]:
        return self._metrics

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict(), "pending": []}


def _demo_metrics(demos: Sequence[Any], epoch: int) -> dict[str, float]:
    trained = [sum(d.loss_mask) for d in demos]
    return {
        "sft/epoch": float(epoch),
        "sft/trained_tokens": float(sum(trained)),
        "sft/turns/mean": sum(_turns(d.loss_mask) for d in demos) / max(len(demos), 1),
    }


def _turns(mask: Sequence[int]) -> int:
    return sum(1 for k, m in enumerate(mask) if m and (k == 0 or not mask[k - 1]))
