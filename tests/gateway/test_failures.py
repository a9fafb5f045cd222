"""What the gateway refuses, and agents that fail: loud (an OpenAI error body, a failed sample naming
the agent) and counted (refused / late calls on the episode's record, reward/failed downstream)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from rlzoo.kernel.protocols import AgentResult, GenerationRequest, SamplingParams

openai = pytest.importorskip("openai")


def one(n: int = 1) -> list[GenerationRequest]:
    sp = SamplingParams(n=n, temperature=1.0, max_new_tokens=200, seed=3)
    return [GenerationRequest("p0", [0], sp, data={"index": 0, "extra_info": {"a": 1}})]


def post(url: str, body: Any, key: str | None, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_bad_requests_get_openai_errors_and_are_counted(make_gateway: Any) -> None:
    seen: dict[str, tuple[int, dict[str, Any]]] = {}

    def prober(client: Any, row: Any) -> AgentResult:
        url = client.base_url + "/chat/completions"
        ok = {"model": client.model, "messages": [{"role": "user", "content": "hi"}]}
        seen["no_key"] = post(url, ok, None)
        seen["wrong_key"] = post(url, ok, "nope")
        seen["unknown_model"] = post(url, {**ok, "model": "gpt-4o"}, client.api_key)
        bad_tools = {**ok, "tools": [{"type": "function", "function": {"description": "no name"}}]}
        seen["malformed_tools"] = post(url, bad_tools, client.api_key)
        seen["max_tokens"] = post(url, {**ok, "max_tokens": 10**6}, client.api_key)
        seen["not_json"] = post(url, None, client.api_key, raw=b"{nope")
        seen["too_large"] = post(url, None, client.api_key, raw=b"x" * 5000)
        seen["ok"] = post(url, ok, client.api_key)
        return AgentResult(reward=1.0)

    gw, _ = make_gateway(prober, max_request_bytes=4096, max_tokens=100)
    (s,) = gw.generate(one())
    assert seen["no_key"][0] == seen["wrong_key"][0] == 401
    assert seen["no_key"][1]["error"]["code"] == "invalid_api_key"
    assert seen["unknown_model"][0] == 404 and seen["unknown_model"][1]["error"]["code"] == "model_not_found"
    assert "'gpt-4o' does not exist" in seen["unknown_model"][1]["error"]["message"]
    assert seen["malformed_tools"][0] == 400 and seen["malformed_tools"][1]["error"]["param"] == "tools"
    assert seen["max_tokens"][0] == 400 and seen["max_tokens"][1]["error"]["param"] == "max_tokens"
    assert seen["not_json"][0] == 400
    assert (
        seen["too_large"][0] == 413 and "max_request_bytes=4096" in seen["too_large"][1]["error"]["message"]
    )
    assert seen["ok"][0] == 200 and seen["ok"][1]["choices"][0]["message"]["role"] == "assistant"
    # refused: unknown model, malformed tools, max_tokens, not JSON is refused before the episode is read
    assert s.agent["gateway"]["refused_calls"] == 3  # type: ignore[index]
    assert s.agent["error"] is None and s.agent["turns"] == 1  # type: ignore[index]


def test_sdk_raises_its_usual_errors(make_gateway: Any) -> None:
    got: dict[str, Any] = {}

    def agent(client: Any, row: Any) -> AgentResult:
        bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
        got["models"] = [m.id for m in api.models.list()]
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            api.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
        out = api.completions.create(model=client.model, prompt="1 2 3", max_tokens=5, logprobs=1)
        got["completion"] = out.choices[0]
        return AgentResult(reward=0.0)

    gw, _ = make_gateway(agent)
    (s,) = gw.generate(one())
    assert s.agent["error"] is None, s.agent["error"]  # type: ignore[index]
    assert got["models"] == ["policy"]
    c = got["completion"]
    assert len(c.logprobs.token_logprobs) <= 5 and all(lp <= 0 for lp in c.logprobs.token_logprobs)


def test_a_call_after_the_episode_ended_is_refused_and_counted(make_gateway: Any) -> None:
    kept: list[Any] = []

    def agent(client: Any, row: Any) -> AgentResult:
        kept.append(client)
        return AgentResult(reward=0.0)

    gw, _ = make_gateway(agent)
    gw.generate(one())
    status, body = post(
        kept[0].base_url + "/chat/completions",
        {"model": "policy", "messages": [{"role": "user", "content": "late"}]},
        kept[0].api_key,
    )
    assert status == 409 and body["error"]["code"] == "episode_ended"
    (s,) = gw.generate([GenerationRequest("p1", [0], one()[0].sampling, data={})])
    assert s.agent["gateway"]["late_calls"] == 1  # type: ignore[index]


def _raises(client: Any, row: Any) -> AgentResult:
    raise RuntimeError("my agent broke")


def _hangs(client: Any, row: Any) -> AgentResult:
    time.sleep(30)
    return AgentResult(reward=1.0)


def _garbage(client: Any, row: Any) -> Any:
    return "not a result"


def _nan(client: Any, row: Any) -> AgentResult:
    return AgentResult(reward=float("nan"))


@pytest.mark.parametrize(
    ("fn", "kind", "words"),
    [
        (_raises, "exception", "my agent broke"),
        (_hangs, "timeout", "rollout.gateway.agent_timeout_s"),
        (_garbage, "bad_value", "not AgentResult"),
        (_nan, "bad_value", "finite number"),
    ],
)
def test_a_failing_agent_fails_its_episode_loudly(make_gateway: Any, fn: Any, kind: str, words: str) -> None:
    gw, _ = make_gateway(fn, agent_timeout_s=1.0)
    t0 = time.monotonic()
    (s,) = gw.generate(one())
    assert time.monotonic() - t0 < 15
    assert s.agent["failure"]["kind"] == kind and s.agent["failure"]["part"] == "agent test"  # type: ignore[index]
    assert words in s.agent["error"]  # type: ignore[index]


def test_a_failed_episode_is_a_failed_sample_downstream(make_gateway: Any) -> None:
    from rlzoo.train.rewards import score_samples

    gw, _ = make_gateway(_raises)
    samples = gw.generate(one(2))
    results = score_samples(lambda items: [], None, samples)
    assert [r.failed for r in results] == [True, True]
    assert all(r.info["failed_part"] == "agent test" for r in results)


# -- the command agent ------------------------------------------------------------------------------
def command(code: str) -> Any:
    from rlzoo.gateway.command import CommandAgent

    agent = CommandAgent([sys.executable, "-c", code])
    return lambda client, row: agent.run(client, row)


SDK_AGENT = """
import json, os, sys
from openai import OpenAI
row = json.load(sys.stdin)
api = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
messages = [{"role": "user", "content": "row %d" % row["index"]}]
for _ in range(2):
    out = api.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, max_tokens=20)
    messages.append(out.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "more"})
print("a log line first")
print(json.dumps({"reward": 0.25, "info": {"calls": 2}}))
"""


def test_a_command_agent_with_the_sdk_is_one_trajectory(make_gateway: Any) -> None:
    gw, _ = make_gateway(command(SDK_AGENT))
    (s,) = gw.generate(one())
    rec = s.agent
    assert rec["error"] is None, rec["error"]  # type: ignore[index]
    assert rec["reward"] == 0.25 and rec["turns"] == 2 and rec["env_info"] == {"calls": 2.0}  # type: ignore[index]
    assert 0 < sum(s.loss_mask or []) < len(s.response_ids)  # two sampled turns around a user turn


@pytest.mark.parametrize(
    ("code", "kind", "words"),
    [
        ("import sys; print('boom', file=sys.stderr); sys.exit(3)", "exception", "exited with status 3"),
        ("print('no json here')", "exception", "no JSON object line"),
        ("import time; time.sleep(60)", "timeout", "rollout.gateway.agent_timeout_s"),
    ],
)
def test_a_failing_command_fails_its_episode(make_gateway: Any, code: str, kind: str, words: str) -> None:
    gw, _ = make_gateway(command(code), agent_timeout_s=3.0)
    t0 = time.monotonic()
    (s,) = gw.generate(one())
    assert time.monotonic() - t0 < 20
    assert s.agent["failure"]["kind"] == kind, s.agent["failure"]  # type: ignore[index]
    assert words in s.agent["error"]  # type: ignore[index]


class _Silent:
    """An engine that never samples what it is given (a stalled engine, or a process that is not run)."""

    version = 0

    def submit(self, requests: Any) -> None: ...

    def stream(self, timeout: float | None = None) -> Any:
        time.sleep(timeout or 0.05)
        return iter(())

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def shutdown(self) -> None: ...


def test_a_call_the_engine_never_samples_gets_a_503_that_says_so() -> None:
    """The call's own wait ends at rollout.gateway.agent_timeout_s with a 503 naming the limit (it
    said "the run stopped before this call was sampled", which is what a shutdown says)."""
    import threading

    from gateway.conftest import FnAgent
    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.gateway.settings import GatewaySettings
    from rlzoo.tasks._tools import build_tokenizer

    got: dict[str, Any] = {}
    done = threading.Event()
    release = threading.Event()

    def agent(client: Any, row: Any) -> AgentResult:
        body = {"model": client.model, "messages": [{"role": "user", "content": "1 2 3"}]}
        got["reply"] = post(client.base_url + "/chat/completions", body, client.api_key)
        done.set()
        # an agent still at work when its time is up: without this wait, a loaded machine could
        # run the reply's return before the episode's own timeout, and the episode end normally
        release.wait(30)
        return AgentResult(reward=0.0)

    tok = build_tokenizer()
    gw = GatewayRollout(
        _Silent(),  # type: ignore[arg-type]
        lambda: FnAgent(agent),
        tok,
        GatewaySettings(agent_timeout_s=1.0),
        MultiTurnSettings(max_turns=2, per_turn_max_tokens=8, tool_call_format="plain"),
        max_response_length=16,
        max_prompt_length=16,
        stop_ids=(int(tok.eos_token_id),),
        agent_name="test",
    )
    try:
        (s,) = gw.generate(one())
        assert "exceeded 1 s (rollout.gateway.agent_timeout_s)" in (s.agent["error"] or "")  # type: ignore[index]
        assert done.wait(10)  # the abandoned agent thread still gets its reply
    finally:
        release.set()
        gw.shutdown()
    status, body = got["reply"]
    assert status == 503 and body["error"]["code"] == "engine_timeout"
    assert "did not sample this call within 1 s (rollout.gateway.agent_timeout_s)" in body["error"]["message"]


class _ModelsOnly:
    """An App that serves /v1/models only (the server's reads are under test, not the rollout)."""

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "policy", "object": "model"}]}

    def chat(self, episode: str, body: Any) -> dict[str, Any]:
        raise AssertionError("not called")

    completion = chat


def test_idle_and_stalled_connections_are_closed_and_keep_alive_still_works() -> None:
    # before rollout.gateway.idle_timeout_s, each of these held a server thread forever
    import http.client
    import socket
    import threading

    from rlzoo.gateway.server import GatewayServer

    srv = GatewayServer(_ModelsOnly(), "k", max_bytes=1000, idle_timeout_s=0.5)
    try:
        stalled = {
            "idle": b"",
            "headers": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n",
            "body": b"POST /e/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
        }
        for what, sent in stalled.items():
            with socket.create_connection((srv.url_host, srv.port), timeout=10) as s:
                s.sendall(sent)
                t0 = time.monotonic()
                assert s.recv(1) == b"", what  # closed by the server, nothing answered
                assert time.monotonic() - t0 < 5, what
        # a client that reuses its connection within the timeout is served on it each time
        conn = http.client.HTTPConnection(srv.url_host, srv.port, timeout=10)
        socks = []
        for _ in range(2):
            conn.request("GET", "/v1/models", headers={"Authorization": "Bearer k"})
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())["data"][0]["id"] == "policy"
            socks.append(conn.sock)
            time.sleep(0.2)
        assert socks[0] is socks[1] is not None  # the same connection, kept alive
        conn.close()

        def connection_threads() -> list[str]:  # this server's thread per connection (not another test's)
            return [t.name for t in threading.enumerate() if t.name == f"rlzoo-gateway:{srv.port} connection"]

        deadline = time.monotonic() + 5
        while connection_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert connection_threads() == []  # every connection's thread ended
    finally:
        srv.close()


def test_close_ends_the_threads_of_kept_alive_connections() -> None:
    # before close() shut its open connections, a client's kept-alive connection held its server
    # thread until idle_timeout_s ran out, after the server had gone (CI: 72 such threads of earlier
    # tests' servers still alive)
    import http.client
    import threading

    from rlzoo.gateway.server import GatewayServer

    srv = GatewayServer(_ModelsOnly(), "k", max_bytes=1000, idle_timeout_s=60)
    name = f"rlzoo-gateway:{srv.port} connection"
    conn = http.client.HTTPConnection(srv.url_host, srv.port, timeout=10)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer k"})
        assert conn.getresponse().read()
        assert [t.name for t in threading.enumerate()].count(name) == 1  # kept alive, waiting
        t0 = time.monotonic()
        srv.close()
        while name in [t.name for t in threading.enumerate()] and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        assert name not in [t.name for t in threading.enumerate()]
        assert time.monotonic() - t0 < 5
    finally:
        conn.close()
