"""Prompt datasets for RL: parquet files in rlzoo's schema -> tokenized prompts, and a resumable loader.

:class:`PromptDataset` reads parquet files (checking their columns first), renders each prompt's
chat messages with the tokenizer's chat template, tokenizes them, and drops the rows that cannot
be trained on, counting each reason (or raises, in strict mode). :class:`PromptLoader` serves
batches of its items epoch after epoch, in an order fixed by a seed, and can be checkpointed and
resumed mid-epoch without losing or repeating a prompt.

Importing this module does not import torch; ``pyarrow`` and ``PIL`` are imported on use.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlzoo.data.schema import (
    IMAGE_PLACEHOLDER,
    OPTIONAL_COLUMNS,
    RESPONSE_COLUMN,
    ground_truth_column,
    row_ground_truth,
    validate_files,
)
from rlzoo.kernel.errors import RlzooError

logger = logging.getLogger("rlzoo.data")

Truncation = Literal["error", "left", "right", "filter"]
TRUNCATIONS: tuple[str, ...] = ("error", "left", "right", "filter")

#: Why a row is dropped, and what the log says about it.
REASONS: dict[str, str] = {
    "missing_ground_truth": "no ground truth (null or empty)",
    "empty_prompt": "empty prompt (no message with text)",
    "bad_prompt": "prompt is not a list of {role, content} messages",
    "unreadable_image": "an image cannot be read",
    "too_long": "prompt longer than max_prompt_length tokens",
}
_MAX_EXAMPLES = 5


class DataError(RlzooError, ValueError):
    """Rows of a prompt file cannot be used (strict mode, ``truncation='error'``) or setup is wrong."""


@dataclass
class FilterStats:
    """What :class:`PromptDataset` read, kept and dropped (``dropped``: reason -> rows)."""

    total: int = 0
    kept: int = 0
    truncated: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    #: reason -> first few ``"file row N: detail"`` strings (for messages)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < _MAX_EXAMPLES:
            ex.append(where)

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def as_dict(self) -> dict[str, int]:
        """Flat counts, e.g. for metrics: ``{"total", "kept", "truncated", "dropped/<reason>"...}``."""
        out = {"total": self.total, "kept": self.kept, "truncated": self.truncated}
        out.update({f"dropped/{k}": v for k, v in sorted(self.dropped.items())})
        return out

    def describe(self) -> str:
        lines = []
        for reason, n in sorted(self.dropped.items(), key=lambda kv: -kv[1]):
            lines.append(f"{n} row(s): {REASONS.get(reason, reason)} [{reason}]")
            lines += [f"    e.g. {e}" for e in self.examples.get(reason, [])]
        return "\n".join(lines)


def _load_image(img: Any, base: Path) -> Any:
    """Decode one image cell (bytes, ``{"bytes", "path"}`` or a path) to a PIL image."""
    from PIL import Image

    if isinstance(img, Mapping):
        data, path = img.get("bytes"), img.get("path")
    elif isinstance(img, (bytes, bytearray)):
        data, path = img, None
    elif isinstance(img, str):
        data, path = None, img
    elif isinstance(img, Image.Image):
        return img
    else:
        raise TypeError(f"unsupported image cell {type(img).__name__}")
    if data:
        im = Image.open(io.BytesIO(data))
    elif path:
        p = Path(path)
        if not p.is_absolute() and not p.exists():
            p = base / p
        im = Image.open(p)
    else:
        raise ValueError("image has neither bytes nor path")
    im.load()
    return im


def _check_image(img: Any, base: Path, have_pil: bool) -> str | None:
    """None when the image can be read, else why not."""
    if not have_pil:  # without PIL, only check that there is something to read
        if isinstance(img, Mapping):
            if img.get("bytes") or (img.get("path") and Path(img["path"]).exists()):
                return None
            return "no bytes and no readable path"
        return None if img else "empty image"
    try:
        _load_image(img, base)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _messages(prompt: Any) -> list[dict[str, Any]] | None:
    """The prompt cell as a list of ``{role, content}``; a plain string is one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) and "content" in m for m in prompt):
        return [dict(m) for m in prompt]
    return None


def _multimodal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split ``<image>`` placeholders into structured content (what processors' templates expect)."""
    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
            out.append(m)
            continue
        parts: list[dict[str, Any]] = []
        for i, chunk in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i > 0:
                parts.append({"type": "image"})
            if chunk:
                parts.append({"type": "text", "text": chunk})
        out.append({**m, "content": parts})
    return out


class PromptDataset:
    """Tokenized prompts from parquet files in rlzoo's schema (see :mod:`rlzoo.data.schema`).

    Args:
        files: parquet files (a single path is accepted too). Their columns are checked before
            anything else is read; a :class:`~rlzoo.data.schema.SchemaError` names each file and
            missing column.
        tokenizer: a Hugging Face tokenizer, or a path / hub name to load one from.
        prompt_key: column with the chat messages (a plain string is taken as one user message).
        max_prompt_length: longest prompt in tokens (None: no limit). For rows with images and a
            ``processor``, the length counts the image tokens the processor expands.
        truncation: what to do with a longer prompt: ``"filter"`` drops it (counted),
            ``"error"`` raises listing them, ``"left"`` keeps the last tokens, ``"right"`` the first
            (rows with images are never cut; they are dropped as too long).
        strict: raise :class:`DataError` listing every bad row instead of dropping them.
        apply_chat_template: render messages with the tokenizer's (or processor's) chat template
            and ``add_generation_prompt=True``; False joins the message contents with newlines
            and lets the tokenizer add its special tokens.
        processor: a multimodal processor (e.g. Qwen2.5-VL's); when given, ``<image>``
            placeholders become image entries of the message content and its chat template
            renders them.
        chat_template_kwargs: extra arguments of ``apply_chat_template`` (e.g. ``enable_thinking``).
        user_dataset: an instance of the user's dataset class (``data.custom_cls``), built over
            ``files``: its rows are read instead of the files' (see
            :func:`rlzoo.data.user_file.user_rows`), and the files' columns are not checked.

    Each item (``dataset[i]``) is a dict: ``prompt_ids`` (list[int]), ``prompt_text`` (the
    rendered prompt), ``messages``, ``ground_truth``, ``data_source``, ``ability``, ``extra_info``
    (dict), ``images`` (decoded PIL images; the raw cells when PIL is missing; None without
    images), ``response`` (the row's own reply, None without the column) and ``index`` (position
    in this dataset, 0..len-1, stable for given files).
    ``filter_stats`` (:class:`FilterStats`) says what was read, kept and dropped and why.
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int | None = None,
        truncation: Truncation = "filter",
        strict: bool = False,
        apply_chat_template: bool = True,
        processor: Any = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        user_dataset: Any = None,
    ) -> None:
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}")
        if max_prompt_length is not None and max_prompt_length <= 0:
            raise ValueError(f"max_prompt_length must be positive, got {max_prompt_length}")
        self.files = [str(files)] if isinstance(files, (str, Path)) else [str(f) for f in files]
        self.user_dataset = user_dataset
        if user_dataset is None:
            validate_files(self.files, prompt_key=prompt_key)  # before any tokenizer or row is loaded
        if tokenizer is None and processor is not None:
            tokenizer = getattr(processor, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("PromptDataset needs a tokenizer (or a processor that has one)")
        if isinstance(tokenizer, (str, Path)):
            from rlzoo.data.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.processor = processor
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.strict = strict
        self.apply_chat_template = apply_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if apply_chat_template:
            self._check_chat_template()
        try:
            import PIL  # noqa: F401

            self._have_pil = True
        except ImportError:
            self._have_pil = False
        self.filter_stats = FilterStats()
        self._items: list[dict[str, Any]] = []
        self._load()

    # -- loading --------------------------------------------------------------------------------
    def _check_chat_template(self) -> None:
        owner = self.processor if self.processor is not None else self.tokenizer
        if getattr(owner, "chat_template", None) or getattr(self.tokenizer, "chat_template", None):
            return
        name = getattr(owner, "name_or_path", None) or type(owner).__name__
        raise DataError(
            f"tokenizer {name!r} has no chat template, so prompts cannot be rendered as chat. "
            "Use a chat/instruct model's tokenizer, set tokenizer.chat_template, or pass "
            "apply_chat_template=False (data.apply_chat_template: false) to use the raw text"
        )

    def _render(self, messages: list[dict[str, Any]], has_images: bool) -> str:
        if not self.apply_chat_template:
            return "\n".join(str(m.get("content") or "") for m in messages)
        if self.processor is not None:
            msgs = _multimodal(messages) if has_images else messages
            return self.processor.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )

    def _sources(self) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
        """``(file, ground-truth column, rows)`` of each source: the parquet files, or the user's
        dataset (one source, named by its class)."""
        if self.user_dataset is not None:
            from rlzoo.data.user_file import user_rows

            name = f"{type(self.user_dataset).__name__}({', '.join(self.files)})"
            yield name, "ground_truth", user_rows(self.user_dataset, self.prompt_key)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        for file in self.files:
            try:
                schema = pq.read_schema(file)
                gt_col = ground_truth_column(schema.names)
                assert gt_col is not None  # validate_files checked it
                columns = ["data_source", self.prompt_key, gt_col]
                columns += [c for c in OPTIONAL_COLUMNS if c in schema.names and c not in columns]
                rows = pq.read_table(file, columns=columns).to_pylist()
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise DataError(
                    f"{file}: cannot read this parquet file ({type(exc).__name__}: {exc}); it may be "
                    "truncated or corrupt: prepare it again (delete it and rerun, or `rlzoo prepare`)"
                ) from exc
            yield file, gt_col, rows

    def _load(self) -> None:
        stats = self.filter_stats
        pending: list[dict[str, Any]] = []
        warned_no_processor = False
        for file, gt_col, rows in self._sources():
            base = Path(self.files[0] if self.user_dataset is not None and self.files else file).parent
            for r, row in enumerate(rows):
                stats.total += 1
                where = f"{file} row {r}"
                gt = row_ground_truth(row, gt_col)
                if gt is None or (isinstance(gt, str) and not gt.strip()):
                    stats.add("missing_ground_truth", where)
                    continue
                messages = _messages(row.get(self.prompt_key))
                if messages is None:
                    stats.add("bad_prompt", f"{where}: {str(row.get(self.prompt_key))[:80]!r}")
                    continue
                if not any(isinstance(m.get("content"), str) and m["content"].strip() for m in messages):
                    stats.add("empty_prompt", where)
                    continue
                images = row.get("images") or None
                if images:
                    bad = next(
                        (why for why in (_check_image(im, base, self._have_pil) for im in images) if why),
                        None,
                    )
                    if bad:
                        stats.add("unreadable_image", f"{where}: {bad}")
                        continue
                    if self.processor is None and not warned_no_processor:
                        warned_no_processor = True
                        logger.warning(
                            "%s has rows with images but no processor was given: images are passed "
                            "through and %s stays literal text in the prompt",
                            file,
                            IMAGE_PLACEHOLDER,
                        )
                pending.append(
                    {
                        "messages": messages,
                        "ground_truth": gt,
                        "data_source": row.get("data_source") or "default",
                        "ability": row.get("ability"),
                        "extra_info": dict(row.get("extra_info") or {}),
                        "images": images,
                        "response": row.get(RESPONSE_COLUMN),
                        "_where": where,
                        "_base": base,
                    }
                )
        self._tokenize(pending)
        self._finish()

    def _tokenize(self, pending: list[dict[str, Any]]) -> None:
        stats = self.filter_stats
        texts = [self._render(p["messages"], bool(p["images"])) for p in pending]
        add_special = not self.apply_chat_template  # a chat template already holds its special tokens
        ids_list = self.tokenizer(texts, add_special_tokens=add_special)["input_ids"] if texts else []
        too_long: list[str] = []
        limit = self.max_prompt_length
        for p, text, ids in zip(pending, texts, ids_list):
            ids = list(ids)
            length = len(ids)
            if limit is not None and p["images"] and self.processor is not None:
                length = self._expanded_length(text, p)
            if limit is not None and length > limit:
                detail = f"{p['_where']}: {length} tokens"
                if self.truncation == "error":
                    too_long.append(detail)
                    continue
                if self.truncation == "filter" or p["images"]:
                    stats.add("too_long", detail)
                    continue
                ids = ids[-limit:] if self.truncation == "left" else ids[:limit]
                text = self.tokenizer.decode(ids)
                stats.truncated += 1
            self._items.append(
                {
                    "prompt_ids": ids,
                    "prompt_text": text,
                    "messages": p["messages"],
                    "ground_truth": p["ground_truth"],
                    "data_source": p["data_source"],
                    "ability": p["ability"],
                    "extra_info": p["extra_info"],
                    "images": p["images"],
                    "response": p["response"],
                    "_base": p["_base"],
                }
            )
        if too_long:
            shown = "\n  ".join(too_long[:20])
            more = f"\n  ... and {len(too_long) - 20} more" if len(too_long) > 20 else ""
            raise DataError(
                f"{len(too_long)} prompt(s) are longer than max_prompt_length={limit} tokens "
                f"(truncation='error'):\n  {shown}{more}\nRaise max_prompt_length, or set "
                "truncation to 'filter' (drop them), 'left' or 'right'"
            )

    def _expanded_length(self, text: str, p: dict[str, Any]) -> int:
        images = [_load_image(im, p["_base"]) for im in p["images"]]
        out = self.processor(text=[text], images=images, return_tensors=None)
        return len(out["input_ids"][0])

    def _finish(self) -> None:
        stats = self.filter_stats
        stats.kept = len(self._items)
        for i, item in enumerate(self._items):
            item["index"] = i
        if stats.num_dropped and self.strict:
            raise DataError(
                f"{stats.num_dropped} of {stats.total} prompt row(s) in {', '.join(self.files)} "
                f"cannot be used (strict mode):\n{stats.describe()}\nFix the data, or set strict "
                "to false to drop these rows"
            )
        for reason, n in sorted(stats.dropped.items()):
            logger.warning(
                "dropped %d of %d prompt row(s): %s [%s]; e.g. %s",
                n,
                stats.total,
                REASONS.get(reason, reason),
                reason,
                "; ".join(stats.examples.get(reason, [])[:2]),
            )
        if stats.truncated:
            logger.info(
                "truncated %d prompt(s) to %s tokens (%s)",
                stats.truncated,
                self.max_prompt_length,
                self.truncation,
            )
        logger.info(
            "prompts: read %d row(s) from %d file(s), kept %d, dropped %d",
            stats.total,
            len(self.files),
            stats.kept,
            stats.num_dropped,
        )
        if not self._items:
            raise DataError(
                f"no usable prompt in {', '.join(self.files)} ({stats.total} row(s) read)"
                + (f":\n{stats.describe()}" if stats.num_dropped else "")
            )

    # -- access ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self._items[i]
        out = {k: v for k, v in item.items() if not k.startswith("_")}
        out["prompt_ids"] = list(item["prompt_ids"])
        out["extra_info"] = dict(item["extra_info"])
        if item["images"]:
            out["images"] = (
                [_load_image(im, item["_base"]) for im in item["images"]]
                if self._have_pil
                else list(item["images"])
            )
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]


class PromptLoader:
    """Batches of a dataset's items, epoch after epoch, resumable mid-epoch.

    Each epoch visits every item once, in ``range(len(dataset))`` order, or shuffled with a
    permutation that depends only on ``(seed, epoch)``, so a run with the same seed sees the
    same batches. With ``drop_last`` the last incomplete batch of each epoch is skipped (the
    shuffle makes those prompts differ from epoch to epoch); without it the last batch is short.

    ``next(loader)`` returns the next batch (a list of items) and moves into the next epoch when
    one ends; it raises ``StopIteration`` after ``num_epochs`` epochs (never when None).
    :meth:`epoch_batches` iterates only over what is left of the current epoch. A batch counts as
    consumed once returned: :meth:`state_dict` taken then and loaded into a new loader over the
    same dataset continues with the next batch, so no prompt is lost or repeated.

    ``sampler`` (the user's ``data.sampler``): iterating it gives each epoch's indices instead
    (``set_epoch(epoch)`` is called first when it has one); an epoch then holds as many prompts as
    it gives. The current epoch's order is kept in :meth:`state_dict`, with the sampler's own
    ``state_dict()`` when it has one; one without is replayed up to the resumed epoch on load.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_epochs: int | None = None,
        sampler: Any = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        n = len(dataset)
        if drop_last and n < batch_size:
            raise DataError(
                f"the dataset has {n} prompt(s), fewer than one batch of {batch_size} "
                "(with drop_last every batch would be dropped); lower the batch size or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_epochs = num_epochs
        self.epoch = 0
        self.position = 0  # items of the current epoch already returned
        self._order: list[int] | None = None
        self.sampler = sampler
        self._drawn = 0  # epochs drawn from the sampler so far

    # -- order ----------------------------------------------------------------------------------
    def order(self, epoch: int) -> list[int]:
        """The item indices of ``epoch`` in the order they are served (with a sampler: the current
        epoch's only, as a sampler is drawn once per epoch)."""
        n = len(self.dataset)
        if self.sampler is not None:
            if epoch != self.epoch:
                raise ValueError(
                    f"a sampler's order is known for the current epoch {self.epoch} only, not {epoch}"
                )
            return self._current()
        if not self.shuffle:
            return list(range(n))
        import numpy as np

        return np.random.default_rng([self.seed, epoch]).permutation(n).tolist()

    def _current(self) -> list[int]:
        if self._order is None:
            self._order = self._draw(self.epoch) if self.sampler is not None else self.order(self.epoch)
        return self._order

    def _draw(self, epoch: int) -> list[int]:
        """The sampler's next epoch of indices, checked."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        n = len(self.dataset)
        name = type(self.sampler).__name__
        try:
            order = [int(i) for i in iter(self.sampler)]
        except (TypeError, ValueError) as exc:
            raise DataError(f"data.sampler {name}: iterating it must give dataset indices ({exc})") from exc
        self._drawn += 1
        bad = [i for i in order if not 0 <= i < n]
        if bad:
            raise DataError(
                f"data.sampler {name} gave indices outside 0..{n - 1} (e.g. {bad[:3]}); the dataset has {n} "
                "prompts after filtering: index them, not the rows of the files"
            )
        if not order or (self.drop_last and len(order) < self.batch_size):
            raise DataError(
                f"data.sampler {name} gave {len(order)} indices for epoch {epoch}, fewer than one batch of "
                f"{self.batch_size}"
            )
        return order

    def _epoch_length(self) -> int:
        return len(self._current()) if self.sampler is not None else len(self.dataset)

    def batches_per_epoch(self) -> int:
        n = (
            len(self.sampler)
            if self.sampler is not None and hasattr(self.sampler, "__len__")
            else len(self.dataset)
        )
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch()

    def _epoch_done(self) -> bool:
        left = self._epoch_length() - self.position
        return left <= 0 or (self.drop_last and left < self.batch_size)

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> PromptLoader:
        return self

    def _advance_if_done(self) -> None:
        if self._epoch_done():
            self.epoch += 1
            self.position = 0
            self._order = None

    def _finished(self) -> bool:
        return self.num_epochs is not None and self.epoch >= self.num_epochs

    def __next__(self) -> list[dict[str, Any]]:
        self._advance_if_done()
        if self._finished():
            raise StopIteration
        indices = self._current()[self.position : self.position + self.batch_size]
        self.position += len(indices)
        return [self.dataset[i] for i in indices]

    def epoch_batches(self) -> Iterator[list[dict[str, Any]]]:
        """The batches left in the current epoch (all of the next one when this one is done)."""
        self._advance_if_done()
        if self._finished():
            return
        while not self._epoch_done():
            yield next(self)

    # -- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "dataset_size": len(self.dataset),
        }
        if self.sampler is not None:
            out["sampler"] = {
                "order": None if self._order is None else list(self._order),
                "drawn": self._drawn,
                "state": _encode(self.sampler.state_dict())
                if callable(getattr(self.sampler, "state_dict", None))
                else None,
            }
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where the loader that wrote ``state`` stopped.

        The dataset must hold the same prompts (its size is checked); the batch size may differ.
        """
        n = len(self.dataset)
        size = state.get("dataset_size", n)
        if size != n:
            raise DataError(
                f"cannot resume the prompt loader: the checkpoint was taken over {size} prompts, "
                f"this dataset has {n} (different files or filtering); resuming would lose or "
                "repeat prompts"
            )
        position = int(state["position"])
        if not 0 <= position <= n:
            raise DataError(f"cannot resume the prompt loader: position {position} is outside 0..{n}")
        self.epoch = int(state["epoch"])
        self.position = position
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.drop_last = bool(state.get("drop_last", self.drop_last))
        self._order = None
        if self.sampler is not None:
            self._load_sampler(state.get("sampler"))

    def _load_sampler(self, saved: Mapping[str, Any] | None) -> None:
        """The sampler where the checkpointed run had it: the current epoch's saved order, and the
        sampler's own state, or the sampler replayed through the epochs the run drew."""
        name = type(self.sampler).__name__
        if saved is None:
            raise DataError(
                f"cannot resume with data.sampler {name}: the checkpoint was taken without a sampler"
            )
        order = saved.get("order")
        drawn = int(saved.get("drawn", 0))
        if callable(getattr(self.sampler, "load_state_dict", None)) and saved.get("state") is not None:
            self.sampler.load_state_dict(_decode(saved["state"]))
            self._drawn = drawn
        else:  # replay: a sampler whose randomness is its own draws the same epochs again
            replayed: list[int] | None = None
            self._drawn = 0
            for e in range(drawn):
                replayed = self._draw(self.epoch - drawn + 1 + e)
            if order is not None and replayed is not None and replayed != list(order):
                logger.warning(
                    "data.sampler %s: replayed to epoch %d it gives another order than the checkpointed run "
                    "(its randomness is not its own); this epoch continues in the saved order, later "
                    "epochs may differ from an uninterrupted run (give the sampler state_dict / "
                    "load_state_dict to make them exact)",
                    name,
                    self.epoch,
                )
        self._order = None if order is None else [int(i) for i in order]


def _encode(state: Any) -> Any:
    """A sampler's ``state_dict()`` as JSON (checkpoints are JSON): as it is when it is JSON already,
    else its ``torch.save`` bytes in base64 (e.g. a ``torch.Generator``'s state tensor)."""
    import json

    try:
        json.dumps(state)
        return state
    except (TypeError, ValueError):
        import base64

        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        return {"__torch_base64__": base64.b64encode(buf.getvalue()).decode()}


def _decode(state: Any) -> Any:
    if isinstance(state, Mapping) and set(state) == {"__torch_base64__"}:
        import base64

        import torch

        return torch.load(io.BytesIO(base64.b64decode(state["__torch_base64__"])), weights_only=False)
    return state
