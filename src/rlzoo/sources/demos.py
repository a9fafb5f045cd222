"""Demonstrations for supervised fine-tuning: Parquet rows -> token ids with the loss mask.

A demonstration is a conversation. It is laid out as the multi-turn rollout lays out a trajectory
(:mod:`rlzoo.agents.rollout`, :mod:`rlzoo.agents.chat`), so SFT trains on exactly the ids the
policy sees and samples::

    prompt_ids   = template.prompt_ids(messages before the first assistant turn)
    turn ids     = the assistant turn as the template renders it after its generation prompt, up to
                   and with the stop token that closes it                          mask 1 (trained)
    between turns: the template's delta of the messages between two assistant turns (tool results,
                   user replies; template.delta_ids, as an observation)            mask 0 (context)

Messages after the last assistant turn are dropped (nothing follows them). A row is either a
chat (``messages``: roles ``system`` / ``user`` / ``assistant`` / ``tool``, assistant turns with
text or ``tool_calls`` as the template renders them) or ``prompt`` + ``response`` (a chat or a text
prompt, then one assistant turn).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.agents.chat import ChatTemplate, TemplateTurnError
from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import Message


class DemoError(RlzooError, ValueError):
    """A demonstrations file or row cannot be trained on."""


@dataclass(frozen=True)
class Demo:
    """One demonstration as the trainer sees it."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # one per response id: 1 on assistant tokens (with their stop token)
    data: dict[str, Any] = field(default_factory=dict)  # data_source, index, extra_info of the row


def render(template: ChatTemplate, messages: Sequence[Message]) -> tuple[list[int], list[int], list[int]]:
    """``(prompt_ids, response_ids, loss_mask)`` of one conversation (module docstring)."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        raise DemoError("a demonstration needs at least one assistant message (the tokens it trains)")
    if first == 0:
        raise DemoError(
            "a demonstration needs a prompt: at least one message before the first assistant turn"
        )
    conversation: list[Message] = list(messages[:first])
    prompt = template.prompt_ids(conversation)
    response: list[int] = []
    mask: list[int] = []
    i = first
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") != "assistant":
            j = i
            while j < len(messages) and messages[j].get("role") != "assistant":
                j += 1
            if j == len(messages):
                break  # nothing the model says follows them
            new = list(messages[i:j])
            delta = template.delta_ids(conversation, new)
            response += delta
            mask += [0] * len(delta)
            conversation += new
            i = j
            continue
        turn = _turn_ids(template, conversation, msg)
        response += turn
        mask += [1] * len(turn)
        conversation.append(msg)
        i += 1
        if i < len(messages) and messages[i].get("role") == "assistant":  # two turns in a row
            delta = template.delta_ids(conversation, [])  # the next generation prompt
            response += delta
            mask += [0] * len(delta)
    return prompt, response, mask


def _turn_ids(template: ChatTemplate, conversation: Sequence[Message], msg: Message) -> list[int]:
    """The ids of assistant ``msg`` after ``conversation``'s generation prompt, with its stop token."""
    context = template.ids(conversation, add_generation_prompt=True)
    full = template.ids([*conversation, msg], add_generation_prompt=False)
    if full[: len(context)] != context:
        at = next(k for k in range(len(context)) if k >= len(full) or full[k] != context[k])
        raise DemoError(
            "the chat template renders an assistant turn that does not start after its generation prompt "
            f"(the renderings part at token {at}); such a template cannot train the ids a policy samples"
        )
    rest = full[len(context) :]
    end = next((k for k, t in enumerate(rest) if t in template.stop_ids), None)
    if end is None:
        raise TemplateTurnError(
            "the chat template does not close an assistant turn with a stop token "
            f"({sorted(template.stop_ids)}): the end of the turn a demonstration trains cannot be found"
        )
    return rest[: end + 1]


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------
def _clean(messages: Any, where: str) -> list[Message]:
    """Messages as the templates take them: ``{role, content, ...}`` without the null fields a
    Parquet struct column fills in; ``tool_calls`` arguments as the OpenAI format's JSON text."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise DemoError(f"{where}: expected a list of chat messages, got {type(messages).__name__}")
    out: list[Message] = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise DemoError(f"{where}: message {k} is not a {{role, content}} mapping: {m!r}")
        msg = {key: v for key, v in m.items() if v is not None}
        msg.setdefault("content", "")
        if msg.get("tool_calls") is not None:
            msg["tool_calls"] = [_tool_call(c) for c in msg["tool_calls"]]
        out.append(msg)
    return out


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    call = {k: v for k, v in call.items() if v is not None}
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        with contextlib.suppress(ValueError):
            fn["arguments"] = json.loads(fn["arguments"])
    call["function"] = fn
    return call


def read_conversations(
    files: Iterable[str | Path], *, messages_key: str, prompt_key: str, response_key: str
) -> list[tuple[list[Message], dict[str, Any]]]:
    """Every row of ``files`` as (messages, row data), checked; one error lists what is wrong."""
    import pyarrow.parquet as pq

    out: list[tuple[list[Message], dict[str, Any]]] = []
    for f in files:
        path = Path(f).expanduser()
        if not path.is_file():
            raise DemoError(f"demonstrations file {path} not found")
        table = pq.read_table(path)
        cols = set(table.column_names)
        if messages_key not in cols and not {prompt_key, response_key} <= cols:
            raise DemoError(
                f"{path}: a demonstrations file needs a {messages_key!r} column (chat messages) or "
                f"{prompt_key!r} + {response_key!r} columns; it has {', '.join(sorted(cols))}"
            )
        for i, row in enumerate(table.to_pylist()):
            where = f"{path} row {i}"
            if messages_key in cols:
                messages = _clean(row[messages_key], where)
            else:
                prompt, reply = row[prompt_key], row[response_key]
                if not isinstance(reply, str):
                    raise DemoError(f"{where}: {response_key!r} must be text, got {type(reply).__name__}")
                head = (
                    [{"role": "user", "content": prompt}]
                    if isinstance(prompt, str)
                    else _clean(prompt, where)
                )
                messages = [*head, {"role": "assistant", "content": reply}]
            data = {
                "data_source": str(row.get("data_source") or "demonstrations"),
                "index": len(out),
                "extra_info": row.get("extra_info"),
            }
            out.append((messages, data))
    if not out:
        raise DemoError("the demonstrations files hold no rows")
    return out


def write_conversations(path: Path, conversations: Sequence[tuple[list[Message], Mapping[str, Any]]]) -> Path:
    """Write demonstrations (messages + the row's ``data_source`` / ``extra_info``) as Parquet, into
    a new file only (written aside, then renamed; an existing file is never replaced)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = path.expanduser()
    if path.exists():
        raise DemoError(f"{path} exists; rlzoo writes demonstrations into a new file only")
    rows = [
        {
            "messages": [
                {"role": m["role"], "content": m.get("content", ""), "name": m.get("name")} for m in msgs
            ],
            "data_source": str(data.get("data_source") or "demonstrations"),
            "extra_info": json.dumps(data.get("extra_info"), default=str),
        }
        for msgs, data in conversations
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.writing")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.rename(path)
    return path


def build_demos(
    template: ChatTemplate,
    conversations: Sequence[tuple[list[Message], dict[str, Any]]],
    *,
    max_prompt_length: int | None,
    max_response_length: int,
) -> tuple[list[Demo], dict[str, int]]:
    """Rendered demonstrations, and how many were dropped for length (``too_long``)."""
    demos: list[Demo] = []
    dropped = 0
    for messages, data in conversations:
        prompt, response, mask = render(template, messages)
        if len(response) > max_response_length or (
            max_prompt_length is not None and len(prompt) > max_prompt_length
        ):
            dropped += 1
            continue
        demos.append(Demo(prompt, response, mask, data))
    if not demos:
        raise DemoError(
            f"every one of {len(conversations)} demonstrations is longer than data.max_prompt_length / "
            f"data.max_response_length={max_response_length} tokens; raise them"
        )
    return demos, {"total": len(conversations), "kept": len(demos), "too_long": dropped}


class DemoSet:
    """The rendered demonstrations as a dataset of items (:class:`~rlzoo.data.dataset.PromptLoader`)."""

    def __init__(self, demos: Sequence[Demo]) -> None:
        self.demos = list(demos)

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, i: int) -> Demo:
        return self.demos[i]
