"""The ``reasoning_gym`` dataset and scorer (see :mod:`rlzoo.tasks.reasoning_gym`).

An entry of a reasoning-gym task is ``{"question", "answer", "metadata"}``; its verifier reads the
metadata (e.g. the puzzle it must check an answer against). Parquet cannot hold metadata whose
shape differs from task to task, so the entry travels in ``extra_info`` as JSON, encoded
losslessly: tuples, sets and dicts with non-string keys are tagged (``{"$tuple": [...]}``, ...),
so the verifier reads what the generator wrote, with the same types (a numpy scalar comes back as
the equal Python scalar). A value JSON cannot hold is refused, naming the task and the type.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError, import_optional
from rlzoo.tasks._stamp import build_splits

logger = logging.getLogger("rlzoo")

DATA_SOURCE_PREFIX = "reasoning_gym/"
_TAGS = ("$tuple", "$set", "$frozenset", "$items", "$dict")


class ReasoningGymError(RlzooError, ValueError):
    """A reasoning-gym task, its config or one of its entries cannot be used; the message says why."""


def _rg() -> Any:
    return import_optional(
        "reasoning_gym",
        "the reasoning_gym dataset and scorer need the reasoning-gym package: pip install rlzoo[reasoning-gym]",
        ReasoningGymError,
    )


def task_names() -> list[str]:
    """Every task reasoning-gym registers (its ``factory.DATASETS``)."""
    return sorted(_rg().factory.DATASETS)


# ---------------------------------------------------------------------------------------------
# lossless JSON
# ---------------------------------------------------------------------------------------------
def encode(obj: Any, where: str = "entry") -> Any:
    """``obj`` as JSON-ready data that :func:`decode` turns back into an equal object of the same
    types (tuples, sets, non-string dict keys tagged); anything else raises, naming ``where``."""
    if type(obj).__module__ == "numpy" and getattr(obj, "shape", None) == ():  # a numpy scalar
        return encode(obj.item(), where)  # the equal Python scalar
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return {"$float": repr(obj)}
        return obj
    if isinstance(obj, list):
        return [encode(v, where) for v in obj]
    if isinstance(obj, tuple):
        return {"$tuple": [encode(v, where) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        tag = "$set" if isinstance(obj, set) else "$frozenset"
        return {tag: [encode(v, where) for v in sorted(obj, key=repr)]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (
            len(obj) == 1 and next(iter(obj)) in (*_TAGS, "$float")
        ):
            return {k: encode(v, where) for k, v in obj.items()}
        return {"$items": [[encode(k, where), encode(v, where)] for k, v in obj.items()]}
    raise ReasoningGymError(
        f"{where}: a {type(obj).__name__} value ({obj!r:.80}) cannot be stored losslessly as JSON "
        "(supported: None, bool, int, float, str, list, tuple, set, dict)"
    )


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            ((tag, value),) = obj.items()
            if tag == "$tuple":
                return tuple(decode(v) for v in value)
            if tag == "$set":
                return {decode(v) for v in value}
            if tag == "$frozenset":
                return frozenset(decode(v) for v in value)
            if tag == "$items":
                return {decode(k): decode(v) for k, v in value}
            if tag == "$float":
                return float(value)
        return {k: decode(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------------------------------
# the dataset
# ---------------------------------------------------------------------------------------------
def make_task(task: str, config: Mapping[str, Any], size: int, seed: int) -> Any:
    """``reasoning_gym.create_dataset(task, size=size, seed=seed, **config)``, with clear errors."""
    rg = _rg()
    if task not in rg.factory.DATASETS:
        near = difflib.get_close_matches(task, list(rg.factory.DATASETS), n=6)
        raise ReasoningGymError(
            f"reasoning-gym has no task {task!r}"
            + (f"; similar: {', '.join(sorted(near))}" if near else "")
            + f" ({len(rg.factory.DATASETS)} tasks: python -m rlzoo.tasks._reasoning_gym)"
        )
    try:
        return rg.create_dataset(task, size=size, seed=seed, **dict(config))
    except (TypeError, AssertionError, ValueError) as exc:
        _, config_cls = rg.factory.DATASETS[task]
        fields = sorted(getattr(config_cls, "__dataclass_fields__", {}))
        raise ReasoningGymError(
            f"reasoning-gym task {task!r} refused config {dict(config)!r}: {type(exc).__name__}: {exc}. "
            f"Its config fields ({config_cls.__name__}): {', '.join(fields)}"
        ) from exc


def rows(
    task: str, config: Mapping[str, Any], entries: list[Any], split: str, system: str
) -> list[dict[str, Any]]:
    """Rows of rlzoo's prompt schema for ``entries`` of ``task`` (made with ``config``)."""
    cfg_json = json.dumps(encode(dict(config), f"task {task!r}: config"), sort_keys=True)
    out = []
    for i, e in enumerate(entries):
        entry = {"question": e["question"], "answer": e["answer"], "metadata": e.get("metadata", {})}
        prompt = [{"role": "system", "content": system}] if system else []
        prompt.append({"role": "user", "content": str(e["question"])})
        out.append(
            {
                "data_source": DATA_SOURCE_PREFIX + task,
                "prompt": prompt,
                "ability": "reasoning",
                # tasks with many right answers (answer None) are checked by the verifier alone
                "reward_model": {
                    "style": "rule",
                    "ground_truth": "" if e["answer"] is None else str(e["answer"]),
                },
                "extra_info": {
                    "split": split,
                    "index": i,
                    "task": task,
                    "config": cfg_json,
                    "entry": json.dumps(encode(entry, f"task {task!r}: entry {split}/{i}")),
                },
            }
        )
    return out


def prepare(out_dir: Path, params: Any) -> dict[str, Path]:
    rg = _rg()

    def build() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        system = ""
        if params.system_prompt:
            prompts = rg.utils.SYSTEM_PROMPTS
            if params.system_prompt not in prompts:
                raise ReasoningGymError(
                    f"system_prompt {params.system_prompt!r} is not one of reasoning-gym's SYSTEM_PROMPTS "
                    f"({', '.join(prompts)}); '' for none"
                )
            system = prompts[params.system_prompt]
        config = dict(params.config)
        val = list(make_task(params.task, config, params.val_size, params.seed + 1))
        train_all = list(make_task(params.task, config, params.train_size, params.seed))
        held_out = {e["question"] for e in val}
        train = [e for e in train_all if e["question"] not in held_out]
        if len(train) < len(train_all):
            logger.info(
                "reasoning_gym %s: dropped %d of %d training problems that are also validation problems",
                params.task,
                len(train_all) - len(train),
                len(train_all),
            )
        if not train:
            raise ReasoningGymError(
                f"reasoning_gym {params.task}: every training problem is also a validation problem (the task "
                "has few distinct problems under this config); lower val_size or widen the config"
            )
        return rows(params.task, config, train, "train", system), rows(
            params.task, config, val, "val", system
        )

    return build_splits(out_dir, "reasoning_gym", params, build)


# ---------------------------------------------------------------------------------------------
# the scorer
# ---------------------------------------------------------------------------------------------
_VERIFIERS: dict[tuple[str, str], Any] = {}


def verifier(task: str, config_json: str) -> Any:
    """The task's dataset object (built once per task and config): its ``score_answer`` verifies."""
    key = (task, config_json)
    if key not in _VERIFIERS:
        _VERIFIERS[key] = make_task(task, decode(json.loads(config_json)), 1, 0)
    return _VERIFIERS[key]


def score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
) -> dict[str, Any]:
    missing = [k for k in ("task", "config", "entry") if k not in (extra_info or {})]
    if missing:
        raise ReasoningGymError(
            f"the reasoning_gym scorer needs extra_info {missing} (written by the reasoning_gym dataset); "
            f"sample of data source {data_source!r} has {sorted(extra_info or {})}"
        )
    if params.answer_tag:
        answer = _rg().utils.extract_answer(response)
    else:
        answer = response.strip()
    entry = decode(json.loads(extra_info["entry"]))
    check = verifier(str(extra_info["task"]), str(extra_info["config"]))
    try:
        value = float(check.score_answer(answer, entry))
    except Exception as exc:  # some verifiers parse the answer and raise on one they cannot read
        logger.debug("reasoning_gym %s: the verifier raised on %r: %s", extra_info["task"], answer, exc)
        return {"score": 0.0, "acc": 0.0, "pred": "" if answer is None else answer, "unparsed": 1.0}
    return {
        "score": value,
        "acc": float(value >= 1.0),
        "pred": "" if answer is None else answer,
        "unparsed": 0.0,
    }


if __name__ == "__main__":  # the task names
    print("\n".join(task_names()))
