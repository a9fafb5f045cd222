"""The gateway's HTTP side: a stdlib threading server on loopback, a free port, a per-run key.

Routes (each episode has its own base URL, so calls are recorded to the right episode):

- ``GET  /v1/models`` and ``GET /e/<episode>/v1/models``
- ``POST /e/<episode>/v1/chat/completions``
- ``POST /e/<episode>/v1/completions``

Every request needs ``Authorization: Bearer <key>`` (401 without it); a body over
``max_request_bytes`` is refused (413) before it is read. What a route answers comes from the
:class:`App` (the rollout): a JSON object, or a streamed reply (server-sent events); errors are
OpenAI's error bodies.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from rlzoo.gateway.openai_api import ApiError, EventStream

__all__ = ["App", "GatewayServer"]

logger = logging.getLogger("rlzoo")


class App(Protocol):
    """What the server asks of the gateway (the rollout)."""

    def models(self) -> dict[str, Any]: ...
    def chat(self, episode: str, body: Any) -> dict[str, Any] | EventStream: ...
    def completion(self, episode: str, body: Any) -> dict[str, Any] | EventStream: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    #: connections waiting to be accepted: every episode of a batch may connect at once (the default 5
    #: overflows, and a client then sees its connection reset)
    request_queue_size = 4096
    app: App
    key: str
    max_bytes: int
    idle_timeout_s: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the connections being served; :meth:`GatewayServer.close` shuts them so their threads end
        self.open_connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: an agent's client reuses its connection
    #: TCP_NODELAY: a reply is never held back waiting for the client's (delayed, ~40 ms) ACK
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        # every read of the connection is bounded: an idle keep-alive connection, or a request whose
        # headers stop arriving, is closed (http.server's handle_one_request) and its thread ends
        super().setup()
        self.connection.settimeout(self.server.idle_timeout_s)
        threading.current_thread().name = f"rlzoo-gateway:{self.server.server_address[1]} connection"
        with self.server.connections_lock:
            self.server.open_connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.open_connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("gateway: " + format, *args)

    def _send(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply(self, out: dict[str, Any] | EventStream) -> None:
        """A route's answer: a JSON object, or a streamed reply as server-sent events. Every event
        of a stream is ready when the route answers (the engine gives a call's tokens at its end),
        so the stream goes out as one body with its length: the connection stays open for the next call."""
        if not isinstance(out, EventStream):
            self._send(200, out)
            return
        data = out.body()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        got = self.headers.get("Authorization", "")
        want = f"Bearer {self.server.key}"
        if hmac.compare_digest(got.encode("utf-8", "replace"), want.encode("utf-8")):
            return True
        self._send(
            401,
            ApiError(
                401,
                "missing or wrong API key: send Authorization: Bearer <key> (the run gives the agent its "
                "key as api_key / OPENAI_API_KEY)",
                type="invalid_request_error",
                code="invalid_api_key",
            ).body(),
        )
        return False

    def _route(self) -> tuple[str | None, str]:
        """(episode or None, the path after /v1)."""
        path = self.path.split("?", 1)[0]
        if path.startswith("/v1/"):
            return None, path[3:]
        parts = path.split("/", 3)  # "", "e", id, "v1/..."
        if len(parts) == 4 and parts[1] == "e" and parts[3].startswith("v1/"):
            return parts[2], parts[3][2:]
        return None, ""

    def do_GET(self) -> None:
        if not self._authorized():
            return
        _, route = self._route()
        if route == "/models":
            self._send(200, self.server.app.models())
        else:
            self._send(404, ApiError(404, f"no route GET {self.path}", code="not_found").body())

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            self._send(411, ApiError(411, "a request body needs a Content-Length header").body())
            return
        n = int(length)
        if n > self.server.max_bytes:
            self.close_connection = True  # the body is not read
            self._send(
                413,
                ApiError(
                    413,
                    f"the request body is {n} bytes, more than rollout.gateway.max_request_bytes="
                    f"{self.server.max_bytes}",
                    code="request_too_large",
                ).body(),
            )
            return
        try:
            raw = self.rfile.read(n)
        except TimeoutError:
            logger.warning(
                "gateway: a request's body stopped arriving (%d bytes announced) for more than "
                "rollout.gateway.idle_timeout_s=%g s: connection closed",
                n,
                self.server.idle_timeout_s,
            )
            self.close_connection = True
            return
        if not self._authorized():
            return
        episode, route = self._route()
        try:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise ApiError(400, f"the request body is not JSON: {exc}") from None
            if episode is None or route not in ("/chat/completions", "/completions"):
                raise ApiError(
                    404,
                    f"no route POST {self.path}: use the base URL the run gave the agent "
                    "(.../e/<episode>/v1)",
                    code="not_found",
                )
            app = self.server.app
            out = app.chat(episode, body) if route == "/chat/completions" else app.completion(episode, body)
            self._reply(out)
        except ApiError as exc:
            self._send(exc.status, exc.body())
        except Exception as exc:  # a gateway bug: loud, and the agent sees a 500
            logger.exception("gateway: %s failed", self.path)
            self._send(
                500, ApiError(500, f"gateway error: {type(exc).__name__}: {exc}", type="server_error").body()
            )


class GatewayServer:
    """The HTTP server on its own thread; :attr:`port` is the free port it bound."""

    def __init__(
        self,
        app: App,
        key: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_bytes: int,
        idle_timeout_s: float,
    ) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.app, self._server.key, self._server.max_bytes = app, key, max_bytes
        self._server.idle_timeout_s = idle_timeout_s
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="rlzoo-gateway", daemon=True)
        self._thread.start()

    @property
    def url_host(self) -> str:
        return "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host

    def close(self) -> None:
        """Stop accepting, and end every open connection (a kept-alive client's thread would
        otherwise wait out ``idle_timeout_s`` on a server that is gone)."""
        self._server.shutdown()
        self._server.server_close()
        with self._server.connections_lock:
            open_now = list(self._server.open_connections)
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
