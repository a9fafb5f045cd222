"""What the model wrote, kept with the run: one Parquet file of samples per step.

``RUN_DIR/samples/step_000007.parquet`` holds the trained samples of step 7 (at most
``run.samples.max_per_step``), ``RUN_DIR/samples/val/step_000007.parquet`` the validation samples
of the validation that ran at step 7 (step 0: before training). One row per sample
(:data:`COLUMNS` lists them); with ``keep_tokens`` the per-token lists line up with
``response_ids``: ``model_mask`` (1: the model sampled it, 0: an environment or tool wrote it),
``tokens`` (each token's text), ``logprobs`` (the rollout's), ``versions`` (the policy version that
produced it), ``advantages`` and ``token_rewards``.

Written like ``metrics.jsonl``: safe to kill at any point. A file is written under a hidden
temporary name and renamed into place, so a step's file is either whole or absent. On a resume
from step S the files of steps after S are those of the abandoned branch: the ones rlzoo wrote
(its mark is in the file's schema metadata) are removed before the first step, and a step's file
is only ever replaced when rlzoo wrote it; any other file in the way is an error, never touched.
The samples of steps 1..N are then each there exactly once, as the metrics rows are.

**Off the trainer's critical path.** A step's rows (token texts, per-token lists: seconds a step
for long responses) are built and written on a background thread, one step at a time: the next
step's samples wait for the previous step's to be on disk (:meth:`SampleWriter.flush`), so at most
the latest step's are in flight. The loop flushes before every checkpoint and on every exit, so a
checkpoint of step S comes after the samples of steps 1..S are on disk; a kill -9 later can cut
only samples of steps after the checkpoint, which a resume redoes (and which the rule above
removes, if whole, before redoing them). A write that fails for any reason but a refusing disk
(a warning, as before) stops the run at the next flush, naming the step.

The file format and its readers (``rlzoo view``, ``rlzoo eval``, tests) are
:mod:`rlzoo.report.samples`'s.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.report.samples import COLUMNS, STEP_FILE, TEMP_FILE, is_ours, samples_dir, schema, step_file
from rlzoo.system.failpoints import failpoint

if TYPE_CHECKING:
    from rlzoo.kernel.batch import Batch
    from rlzoo.kernel.protocols import RewardResult, Sample
    from rlzoo.recipe.types import SamplesSection

logger = logging.getLogger("rlzoo")


def token_texts(tokenizer: Any, ids: Sequence[int], window: int = 3) -> list[str]:
    """Each token's text as it reads in context: the text it adds to the ``window`` tokens before it
    (word-level tokenizers join words with spaces, SentencePiece and byte-level BPE mark them: either
    way the pieces concatenate to the decoded text); a token whose piece is not a clean suffix falls
    back to its own decode. Two batched decodes per sample (a fast tokenizer's loop is native)."""
    ids = [int(t) for t in ids]
    before = [ids[max(0, j - window) : j] for j in range(len(ids))]
    with_it = [ids[max(0, j - window) : j + 1] for j in range(len(ids))]
    decode = getattr(tokenizer, "batch_decode", None)
    if callable(decode):
        b, w = decode(before), decode(with_it)
    else:
        b, w = [tokenizer.decode(x) for x in before], [tokenizer.decode(x) for x in with_it]
    return [wj[len(bj) :] if wj.startswith(bj) else tokenizer.decode([t]) for t, bj, wj in zip(ids, b, w)]


class SampleWriter:
    """Writes each step's samples (see the module docstring); built by the session.

    Args:
        run_dir: the run directory (locked by the session: one writer).
        settings: ``run.samples``.
        tokenizer: decodes prompts, responses and token pieces.
        resumed_from: the checkpoint step this run resumed from (None: a fresh run).
    """

    def __init__(
        self, run_dir: Path, settings: SamplesSection, tokenizer: Any, resumed_from: int | None = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.settings = settings
        self.tokenizer = tokenizer
        self._pool: ThreadPoolExecutor | None = None  # the background writer, started on first use
        self._pending: tuple[int, str, Future[Path | None]] | None = None  # (step, split, its write)
        for split in ("train", "val"):
            folder = samples_dir(self.run_dir, split)
            if not folder.is_dir():
                continue
            for f in folder.iterdir():
                if TEMP_FILE.match(f.name):  # a write a kill cut short: ours by its name, never renamed in
                    f.unlink(missing_ok=True)
                m = STEP_FILE.match(f.name)
                if resumed_from is not None and m and int(m.group(1)) > resumed_from and is_ours(f):
                    f.unlink()  # the abandoned branch's samples: this run writes those steps again

    @property
    def enabled(self) -> bool:
        return self.settings.every > 0

    def due(self, step: int) -> bool:
        return self.enabled and step % self.settings.every == 0

    # -- rows ------------------------------------------------------------------------------------
    def train_rows(
        self, step: int, batch: Batch, model_mask: Any, policy_version: Callable[[int], int]
    ) -> list[dict[str, Any]]:
        """Rows of a trained batch (after the update: it holds advantages and token rewards).
        ``model_mask``: the batch's ``response_mask`` as collated, before any correction masked tokens."""
        n_rows = min(len(batch), self.settings.max_per_step)
        attn = batch["attention_mask"]  # [B, P+T]
        T = batch["responses"].shape[1]
        P = attn.shape[1] - T
        adv = batch.get("advantages")
        tok_r = batch.get("token_level_rewards")
        if tok_r is None:
            tok_r = batch["token_level_scores"]
        infos = batch.get("reward_info") or [{}] * len(batch)
        agents = batch.get("agent") or [None] * len(batch)
        rollout_lp = batch.get("rollout_log_probs")  # [B, T]; None for demonstrations (runner sft)
        rows = []
        for i in range(n_rows):
            prompt = [int(t) for t, a in zip(batch["input_ids"][i, :P].tolist(), attn[i, :P].tolist()) if a]
            n = int(attn[i, P:].sum().item())
            response = [int(t) for t in batch["responses"][i, :n].tolist()]
            mask = [int(m) for m in model_mask[i, :n].tolist()]
            advs = [float(a) for a in adv[i, :n].tolist()] if adv is not None else []
            model_adv = [a for a, m in zip(advs, mask) if m]
            rows.append(
                self._row(
                    step,
                    "train",
                    uid=batch["uid"][i],
                    request_id=batch["request_id"][i],
                    data_source=batch["data_source"][i],
                    prompt_ids=prompt,
                    response_ids=response,
                    model_mask=mask,
                    logprobs=[float(x) for x in rollout_lp[i, :n].tolist()] if rollout_lp is not None else [],
                    versions=[policy_version(int(v)) for v in batch["versions"][i][:n]],
                    advantages=advs,
                    token_rewards=[float(x) for x in tok_r[i, :n].tolist()],
                    info=infos[i],
                    failed=bool((batch.get("failed") or [False] * len(batch))[i]),
                    finish_reason=str(batch["finish_reason"][i]),
                    agent=agents[i],
                    advantage=sum(model_adv) / len(model_adv) if model_adv else None,
                )
            )
        return rows

    def val_rows(
        self, step: int, samples: Sequence[Sample], results: Sequence[RewardResult]
    ) -> list[dict[str, Any]]:
        rows = []
        for s, r in list(zip(samples, results))[: self.settings.max_per_step]:
            mask = list(s.loss_mask) if s.loss_mask is not None else [1] * len(s.response_ids)
            rows.append(
                self._row(
                    step,
                    "val",
                    uid=s.uid,
                    request_id=s.request_id,
                    data_source=str(s.data.get("data_source", "default")),
                    prompt_ids=list(s.prompt_ids),
                    response_ids=list(s.response_ids),
                    model_mask=[int(bool(m)) for m in mask],
                    logprobs=list(s.rollout_log_probs),
                    versions=[],
                    advantages=[],
                    token_rewards=[],
                    info={"score": float(r.score), **r.info},
                    failed=bool(r.failed),
                    finish_reason=s.finish_reason,
                    agent=s.agent,
                    advantage=None,
                    reward=float(r.reward),
                )
            )
        return rows

    def _row(
        self,
        step: int,
        split: str,
        *,
        uid: str,
        request_id: str,
        data_source: str,
        prompt_ids: list[int],
        response_ids: list[int],
        model_mask: list[int],
        logprobs: list[float],
        versions: list[int],
        advantages: list[float],
        token_rewards: list[float],
        info: Mapping[str, Any],
        failed: bool,
        finish_reason: str,
        agent: Mapping[str, Any] | None,
        advantage: float | None,
        reward: float | None = None,
    ) -> dict[str, Any]:
        tok = self.tokenizer
        keep = self.settings.keep_tokens
        score = info.get("score")
        row: dict[str, Any] = {
            "step": step,
            "split": split,
            "uid": uid,
            "request_id": request_id,
            "data_source": data_source,
            "prompt": tok.decode(prompt_ids),
            "response": tok.decode(response_ids),
            "reward": reward if reward is not None else (sum(token_rewards) if token_rewards else score),
            "score": _num(score),
            "acc": _num(info.get("acc", score)),
            "reward_info": json.dumps(dict(info), default=str),
            "failed": failed,
            "finish_reason": finish_reason,
            "truncated": finish_reason == "length" or bool(agent and agent.get("truncated")),
            "response_length": len(response_ids),
            "model_tokens": sum(model_mask),
            "advantage": advantage,
            "turns": int(agent["turns"]) if agent else 1,
            "tool_calls": int(agent.get("tool_calls", 0)) if agent else 0,
            "agent": json.dumps(dict(agent), default=str) if agent else None,
        }
        if keep:
            row.update(
                prompt_ids=prompt_ids,
                response_ids=response_ids,
                tokens=token_texts(tok, response_ids),
                model_mask=model_mask,
                logprobs=logprobs if self.settings.logprobs else None,
                versions=versions or None,
                advantages=advantages or None,
                token_rewards=token_rewards or None,
            )
        return row

    # -- files -----------------------------------------------------------------------------------
    def write(self, step: int, rows: Sequence[Mapping[str, Any]], split: str = "train") -> Path | None:
        """``rows`` as ``samples/[val/]step_K.parquet``, atomically (temporary name, then rename)."""
        if not rows:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        out = step_file(self.run_dir, step, split)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists() and not is_ours(out):
            raise RlzooError(
                f"{out} is in the way of step {step}'s samples and was not written by rlzoo; move it "
                "out of the run directory (rlzoo never overwrites a file it did not write)"
            )
        table = pa.Table.from_pylist([{c: r.get(c) for c in COLUMNS} for r in rows], schema=schema())
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        try:
            pq.write_table(table, tmp, compression="zstd")
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        except OSError as exc:  # a full or read-only disk: the samples are not worth the run
            tmp.unlink(missing_ok=True)
            logger.warning(
                "rlzoo: could not write step %d's samples to %s (%s); training goes on without them "
                "(what else the disk refuses stops the run with a message)",
                step,
                out,
                exc,
            )
            return None
        failpoint("samples:staged")
        os.replace(tmp, out)
        return out

    def write_train(
        self, step: int, batch: Batch, model_mask: Any, policy_version: Callable[[int], int]
    ) -> None:
        """Step ``step``'s trained samples, built and written in the background (:meth:`flush`).
        ``batch`` and ``model_mask`` must not change afterwards (the loop's batch of a finished
        update does not); ``policy_version`` must not either (the loop passes a copy of its map)."""
        if self.due(step):
            self._submit(
                step,
                "train",
                lambda: self.write(step, self.train_rows(step, batch, model_mask, policy_version)),
            )

    def write_val(self, step: int, samples: Sequence[Sample], results: Sequence[RewardResult]) -> None:
        if self.settings.val:
            self._submit(
                step, "val", lambda: self.write(step, self.val_rows(step, samples, results), split="val")
            )

    # -- the background writer ---------------------------------------------------------------------
    def _submit(self, step: int, split: str, job: Callable[[], Path | None]) -> None:
        self.flush()  # one step at a time: the previous step's samples are on disk first
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlzoo-samples")
        self._pending = (step, split, self._pool.submit(job))

    def flush(self) -> None:
        """Wait until every sample handed in is on disk (or refused by the disk: a warning). Any
        other failure of the write is raised here, naming its step."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        step, split, fut = pending
        try:
            fut.result()
        except Exception as exc:
            raise RlzooError(
                f"writing step {step}'s {split} samples to {samples_dir(self.run_dir, split)} failed: {exc!r}"
            ) from exc

    def close(self) -> None:
        """Flush, then stop the background thread (every exit of the run: its error, if any, raised)."""
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
