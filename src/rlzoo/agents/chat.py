"""Chat-template deltas: the ids an observation adds after a model's turn, without touching the
ids the model sampled.

After a model turn the trajectory holds the prompt's ids and every turn's ids so far; the model's
last turn ends with its stop token (the engine keeps it). An observation (tool results, the
environment's reply) is appended as the chat template's *delta*: render the conversation with
and without the new messages, and take the ids the longer rendering has after the stop token that
closes the last assistant turn::

    before = ids(render(conversation))                          # ... <|im_start|>assistant\\nX<|im_end|>\\n
    after  = ids(render(conversation + new, add_generation_prompt=True))
    k      = 1 + position of the m-th stop token in after       # m: stop tokens in before
    delta  = after[k:]                                          # \\n<|im_start|>user\\n<tool_response>...

A template that rewrites *earlier* turns when a message is added (Qwen3's drops the reasoning of
assistant turns before the last user message) is not append-only: rendering the final
conversation then differs from the trajectory. rlzoo keeps the trajectory -- the ids the model was
actually fed and sampled, turn by turn -- and finds the end of the last turn by counting stop
tokens, so the delta is still the template's rendering of the new messages;
:meth:`ChatTemplate.divergence` says where the renderings part. A template whose turns do not end
with a stop token cannot be used (:class:`TemplateTurnError`).

The sampled ids themselves are never rendered: the conversation's assistant messages carry the
turn's decoded text only so that the template can render the messages *before* the delta, which
are discarded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import Message, Tool

__all__ = ["ChatTemplate", "TemplateTurnError", "tool_schema"]


class TemplateTurnError(RlzooError):
    """The end of the model's turn cannot be found in the template's rendering (no stop token)."""


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI-style function schema chat templates take in ``tools=``."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }


class ChatTemplate:
    """Renders a conversation to ids with a tokenizer's chat template (and the tools' schemas).

    Args:
        tokenizer: a HF tokenizer with a chat template.
        tools: the tools offered (their schemas go to the template's ``tools``; none: not passed).
        stop_ids: the ids that end a model's turn (the engine's EOS / stop tokens).
        template_kwargs: extra ``apply_chat_template`` arguments (e.g. ``enable_thinking``).
        memo: how many renderings :meth:`ids` keeps (the least recently used go first), for a
            template that renders the same conversations again (the gateway: ``rollout.n``
            episodes of a row open with the same messages); 0: none. A rendering is a function of
            the messages alone, so a kept one is the ids rendering them again would give.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Tool] = (),
        stop_ids: Sequence[int] = (),
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        memo: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.schemas = [tool_schema(t) for t in tools]
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        if not self.stop_ids:
            raise ValueError("ChatTemplate needs the stop token ids that end a model's turn")
        self.kwargs = dict(template_kwargs or {})
        self.memo = memo
        self._kept: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()

    def text(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        kw = dict(self.kwargs)
        if self.schemas:
            kw["tools"] = self.schemas
        out = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kw
        )
        return str(out)

    def ids(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
        key = (repr(list(messages)), add_generation_prompt) if self.memo else None
        if key is not None and key in self._kept:
            self._kept.move_to_end(key)
            return list(self._kept[key])
        text = self.text(messages, add_generation_prompt=add_generation_prompt)
        out = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if key is not None:
            self._kept[key] = out
            if len(self._kept) > self.memo:
                self._kept.popitem(last=False)
            return list(out)
        return out

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The first observation rendered as a prompt (with the generation prompt)."""
        return self.ids(messages, add_generation_prompt=True)

    def delta_ids(self, conversation: Sequence[Message], new: Sequence[Message]) -> list[int]:
        """Ids that follow the last assistant turn's stop token when ``new`` messages are added and
        the model is asked for its next turn (module docstring).

        The end of the model's turn is found by counting: it is the ``m``-th stop token of the longer
        rendering, ``m`` being the number of stop tokens in the rendering without ``new``. So a
        template that rewrites *earlier* turns when a message is added (one that drops past
        reasoning, say) still gives the right delta; the trajectory keeps the ids the model
        actually saw for those turns (:meth:`divergence` says where the two renderings part).
        """
        before = self.ids(conversation, add_generation_prompt=False)
        after = self.ids([*conversation, *new], add_generation_prompt=True)
        m = sum(1 for t in before if t in self.stop_ids)
        ends = [i for i, t in enumerate(after) if t in self.stop_ids]
        if m == 0 or len(ends) < m:
            raise TemplateTurnError(
                "the chat template does not close an assistant turn with a stop token "
                f"({sorted(self.stop_ids)}): the end of the model's turn cannot be found in its "
                "rendering. Use a template that ends assistant turns with the EOS token"
            )
        return after[ends[m - 1] + 1 :]

    def divergence(
        self, conversation: Sequence[Message], new: Sequence[Message]
    ) -> tuple[int, str, str] | None:
        """Where adding ``new`` changes the rendering of ``conversation`` (token index, the ids from
        there before and after, decoded), or None when the template is append-only here."""
        before = self.ids(conversation, add_generation_prompt=False)
        after = self.ids([*conversation, *new], add_generation_prompt=True)
        k = next((i + 1 for i in range(len(before) - 1, -1, -1) if before[i] in self.stop_ids), len(before))
        if after[:k] == before[:k]:
            return None
        at = next(i for i in range(k) if i >= len(after) or after[i] != before[i])
        return at, self._show(before[at : at + 8]), self._show(after[at : at + 8])

    def probe(self) -> None:
        """Render a two-turn conversation once (user, assistant, tool result, user): a template that
        cannot serve a multi-turn rollout fails here, before any model is loaded."""
        conv: list[Message] = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
        for new in ([{"role": "tool", "content": "3"}], [{"role": "user", "content": "4"}]):
            try:
                self.delta_ids(conv, new)
            except TemplateTurnError:
                raise
            except Exception as exc:  # a template error (e.g. a role it refuses)
                raise TemplateTurnError(
                    f"the chat template cannot render a {new[0]['role']!r} message after an assistant turn: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    def _show(self, ids: Sequence[int]) -> str:
        return repr(self.tokenizer.decode(list(ids)))
