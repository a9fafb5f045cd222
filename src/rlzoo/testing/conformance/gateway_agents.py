"""The ``agent`` kind's suite: a user's agent plays episodes against a stub OpenAI server.

:class:`AgentConformance` builds the agent (``factory(params) -> Agent``), runs ``run(client, row)``
against :class:`StubOpenAI` (a loopback server that answers each chat call with the next of
:attr:`~AgentConformance.replies` and records the requests) and checks the contract: the agent calls
the ``base_url`` it was given, with its ``api_key`` and ``model``; it returns an
:class:`~rlzoo.kernel.protocols.AgentResult` (a finite reward or None, a final answer that is text
or None) within :attr:`~AgentConformance.timeout_s`; and, when set, the expected result.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from rlzoo.kernel.protocols import Agent, AgentResult, ClientConfig
from rlzoo.testing.conformance.base import ComponentConformance

__all__ = ["AgentConformance", "StubOpenAI"]

KEY = "conformance-key"
MODEL = "conformance-model"


class StubOpenAI:
    """A loopback OpenAI-compatible server: each chat call gets the next reply (the last repeats);
    :attr:`requests` records ``(path, authorization header, JSON body)``."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies) or [""]
        self.requests: list[tuple[str, str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                stub.requests.append((self.path, self.headers.get("Authorization", ""), None))
                self._send(
                    200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "x"}]}
                )

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                stub.requests.append((self.path, self.headers.get("Authorization", ""), body))
                n = sum(1 for r in stub.requests if r[2] is not None)
                text = stub.replies[min(n, len(stub.replies)) - 1]
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                if self.path.endswith("/completions") and not self.path.endswith("/chat/completions"):
                    choice: dict[str, Any] = {
                        "index": 0,
                        "text": text,
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                    obj = "text_completion"
                else:
                    choice = {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                    obj = "chat.completion"
                self._send(
                    200,
                    {
                        "id": "x",
                        "object": obj,
                        "created": 0,
                        "model": MODEL,
                        "choices": [choice],
                        "usage": usage,
                    },
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def client(self) -> ClientConfig:
        return ClientConfig(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, model=MODEL)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _result(out: Any) -> AgentResult:
    if inspect.isawaitable(out):

        async def wait() -> Any:
            return await out

        out = asyncio.run(wait())
    return out  # type: ignore[no-any-return]


class AgentConformance(ComponentConformance):
    """``factory(params) -> Agent``: ``run(client, row)`` plays one episode through the gateway.

    Set :attr:`row` to a dataset row the agent accepts and :attr:`replies` to what the stub
    "model" says, call after call; :attr:`expected_reward` / :attr:`expected_final_answer` (worked
    out by hand) are checked when set.
    """

    kind = "agent"
    row: ClassVar[Mapping[str, Any]] = {"prompt_text": "hello", "ground_truth": "1", "extra_info": {}}
    replies: ClassVar[Sequence[str]] = ("1",)
    expected_reward: ClassVar[float | None] = None
    expected_final_answer: ClassVar[str | None] = None
    timeout_s: ClassVar[float] = 60.0

    def make_agent(self) -> Any:
        agent = self.make_part()(self.params)
        assert isinstance(agent, Agent), f"{self.name}: the factory must return an Agent (run), got {agent!r}"
        return agent

    def play(self) -> tuple[AgentResult, StubOpenAI]:
        stub = StubOpenAI(self.replies)
        try:
            t0 = time.monotonic()
            out = _result(self.make_agent().run(stub.client, json.loads(json.dumps(dict(self.row)))))
            took = time.monotonic() - t0
        finally:
            stub.close()
        assert took <= self.timeout_s, (
            f"{self.name}: the episode took {took:.1f} s, more than {self.timeout_s} s"
        )
        return out, stub

    def test_plays_an_episode_through_the_client_it_is_given(self) -> None:
        out, stub = self.play()
        posts = [r for r in stub.requests if r[2] is not None]
        assert posts, f"{self.name}: the agent made no call to client.base_url"
        for path, auth, body in posts:
            assert path.startswith("/v1/"), f"{self.name}: called {path}, not under client.base_url"
            assert auth == f"Bearer {KEY}", f"{self.name}: a call without client.api_key ({auth!r})"
            assert body.get("model") == MODEL, (
                f"{self.name}: a call for model {body.get('model')!r}, not client.model"
            )
        assert isinstance(out, AgentResult), (
            f"{self.name}: run returned {type(out).__name__}, not AgentResult"
        )
        if out.reward is not None:
            assert not isinstance(out.reward, bool) and math.isfinite(float(out.reward)), out.reward
        assert out.final_answer is None or isinstance(out.final_answer, str), out.final_answer
        assert isinstance(out.info, Mapping), out.info

    def test_expected_result(self) -> None:
        if self.expected_reward is None and self.expected_final_answer is None:
            pytest.skip("no expected result given (set expected_reward or expected_final_answer)")
        out, _ = self.play()
        if self.expected_reward is not None:
            assert out.reward is not None and math.isclose(
                float(out.reward), self.expected_reward, abs_tol=1e-6
            )
        if self.expected_final_answer is not None:
            assert out.final_answer == self.expected_final_answer
