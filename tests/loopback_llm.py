"""A scripted OpenAI-compatible chat server on 127.0.0.1, for testing pgr's LLM client over real HTTP.

Each test queues replies (or handlers that build a reply from the request body); the server answers
``POST /v1/chat/completions`` with them in order, falling back to ``default`` once the queue is
empty, and records every request it receives. Only the standard library is used.

Hostile servers too: a reply can trickle in a byte at a time (``trickle``, headers included with
``trickle_headers``: a slow-loris server) or stream a body of any size made on the fly (``stream``,
with or without a ``Content-Length``), and ``sent`` counts the bytes each answer got out before the
client hung up.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["LoopbackLLM", "Reply", "error", "ok"]

MAX_DELAY = 2.0  # no handler sleeps longer than this, whatever a test asks
MAX_TRICKLE = 60.0  # no trickled answer lasts longer than this (a client that waits for it is the bug)


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # JSON-encoded unless it is bytes
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (bounded by MAX_DELAY, cut short at stop())
    trickle: float = 0.0  # seconds between the body's bytes, sent one at a time (slow loris)
    trickle_headers: bool = False  # trickle the status line and headers as well
    stream: Callable[[], Iterable[bytes]] | None = None  # the body's chunks, made as they are sent
    length: int | None = None  # the Content-Length announced for ``stream`` (None: none, close after)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON body, or the raw text when it is not JSON


Handler = Callable[[Request], Reply]


def ok(
    content: str,
    *,
    prompt_tokens: int | None = 11,
    completion_tokens: int | None = 7,
    finish_reason: str = "stop",
    model: str = "m",
    usage: bool = True,
) -> Reply:
    """A successful chat completion, shaped like OpenAI's."""
    body: dict[str, Any] = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
    }
    if usage:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": (prompt_tokens or 0) + (completion_tokens or 0),
        }
    return Reply(200, body)


def error(status: int, message: str = "error", headers: dict[str, str] | None = None) -> Reply:
    """An error answer in OpenAI's (and llama.cpp's) error envelope."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"code": status, "message": message, "type": kind}}
    return Reply(status, body, dict(headers or {}))


class LoopbackLLM:
    """The server. ``with LoopbackLLM() as srv:`` or ``start()`` / ``stop()``."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.script: deque[Reply | Handler] = deque()
        self.default: Reply | Handler = ok("{}")
        self.sent: list[int] = []  # bytes each answer got out (a client that hangs up early cuts it)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting
    def queue(self, *replies: Reply | Handler) -> Self:
        self.script.extend(replies)
        return self

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests]

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _next_reply(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            step = self.script.popleft() if self.script else self.default
        return step(request) if callable(step) else step

    # -- lifecycle
    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        owner = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like real servers
            disable_nagle_algorithm = True  # headers and body go out in two writes
            timeout = 5  # an idle kept-alive connection does not hold its thread forever

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def handle(self) -> None:
                try:
                    super().handle()
                except (ConnectionError, TimeoutError):
                    pass  # a client that dropped its connection (timeouts, closed event loops)

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Request(self.command, self.path, headers, body)
                if self.command != "POST" or self.path.rstrip("/") != "/v1/chat/completions":
                    with owner._lock:
                        owner.requests.append(request)
                    reply = error(404, f"no route {self.command} {self.path}")
                else:
                    reply = owner._next_reply(request)
                if reply.delay > 0:
                    owner._stopping.wait(min(reply.delay, MAX_DELAY))
                sent = [0]
                try:
                    self._send(reply, sent)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (timeout test)
                finally:
                    with owner._lock:
                        owner.sent.append(sent[0])

            def _send(self, reply: Reply, sent: list[int]) -> None:
                if reply.stream is not None:
                    payload, length = b"", reply.length
                else:
                    payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                    length = len(payload)
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                if length is not None:
                    self.send_header("Content-Length", str(length))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.trickle_headers:
                    buffered: list[bytes] = getattr(self, "_headers_buffer", [])  # what send_header queued
                    head = b"".join(buffered) + b"\r\n"
                    buffered.clear()
                    self._trickle(head, reply.trickle, sent)
                else:
                    self.end_headers()
                if reply.stream is not None:
                    for chunk in reply.stream():
                        if owner._stopping.is_set():
                            return
                        self.wfile.write(chunk)
                        sent[0] += len(chunk)
                elif reply.trickle > 0:
                    self._trickle(payload, reply.trickle, sent)
                else:
                    self.wfile.write(payload)
                    sent[0] += len(payload)
                self.wfile.flush()

            def _trickle(self, data: bytes, every: float, sent: list[int]) -> None:
                """One byte at a time, ``every`` seconds apart (cut short at stop() or MAX_TRICKLE)."""
                self.wfile.flush()
                until = time.monotonic() + MAX_TRICKLE
                for i in range(len(data)):
                    if owner._stopping.wait(every) or time.monotonic() > until:
                        return
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    sent[0] += 1

            do_POST = _answer
            do_GET = _answer

        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="loopback-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes any handler still sleeping
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sane(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
    """A well-behaved model, by the schema it is asked for: a restatement, one step per round (repeated
    later, so rounds end), a summary, an answer. A ScriptedLLM handler."""
    required = (schema or {}).get("required", [])
    if "intent" in required:
        return {"intent": "decide whether to join a soccer league this summer"}
    if "nodes" in required:
        return {"nodes": [{"id": "a", "parent": None, "action": "knee physio running", "dimension": "health"}]}
    if "summary" in required:
        return {"summary": "The knee injury matters most."}
    return "Wait until your knee heals."


def sane_reply(request: Request) -> Reply:
    """:func:`sane` behind the loopback server (a ``LoopbackLLM.default``)."""
    body = request.body or {}
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    reply = sane(body.get("messages", []), schema)
    return ok(reply if isinstance(reply, str) else json.dumps(reply))
