"""A local fake of Anthropic's Messages API that speaks the real wire format.

The adapter is tested through the real ``anthropic`` SDK pointed (``base_url``) at this
server, so the SDK's own SSE decoding, error classes and retry policy are exercised.
The server is scripted with a queue of responses, one per ``POST /v1/messages``:

- :func:`message` builds a streamed message from blocks (:func:`text`, :func:`thinking`,
  :func:`redacted_thinking`, :func:`tool_use`), each split into several deltas, framed
  exactly as the API frames them (``event: <type>\\ndata: <json>\\n\\n``, with a ``ping``
  after the first content block start like the real stream);
- :func:`http_error` / :func:`overloaded` build an HTTP error with the API's JSON body;
- :func:`mid_stream_error` cuts a streamed message after some events and sends an SSE
  ``error`` frame, as the API does when it overloads mid-response;
- :func:`authentication_error` is the API's 401 for a bad key, and a server built with
  ``api_key=...`` answers it to any request whose ``x-api-key`` differs, before touching
  the queue.

Prompt caching is simulated honestly (:class:`PromptCache`): the server renders every
request as the API does (``tools``, then ``system``, then ``messages``, block by block),
rejects more than four ``cache_control`` breakpoints or one on a thinking block with the
API's 400, writes the prefix up to each breakpoint, and on later requests reads the
longest cached prefix that ends at a block boundary at most 20 blocks before a breakpoint.
With ``simulate_usage=True`` the usage of every streamed message reports what that
request really cost here (``input_tokens`` excluding the cache, plus
``cache_creation_input_tokens``/``cache_read_input_tokens``), counting about one token per
four characters of the block's JSON; otherwise the scripted counts are sent as given.
``RecordedRequest.usage`` holds the usage a request was answered with.

Nothing here touches the network beyond 127.0.0.1.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}_fake{next(_ids):06d}"


def _split(s: str, pieces: int) -> list[str]:
    """Split ``s`` into up to ``pieces`` non-empty chunks (more deltas than one)."""
    if not s:
        return []
    pieces = max(1, min(pieces, len(s)))
    size = -(-len(s) // pieces)
    return [s[i : i + size] for i in range(0, len(s), size)]


# -- blocks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One content block: its ``content_block_start`` payload and its deltas."""

    start: dict[str, Any]
    deltas: list[dict[str, Any]]


def text(s: str, *, chunks: int = 3) -> Block:
    return Block(
        start={"type": "text", "text": ""},
        deltas=[{"type": "text_delta", "text": part} for part in _split(s, chunks)],
    )


def thinking(s: str, *, signature: str = "EqQBCgIYAhIMfakeSignature==", chunks: int = 3) -> Block:
    deltas = [{"type": "thinking_delta", "thinking": part} for part in _split(s, chunks)]
    # The API sends the signature as one delta right before the block stops.
    deltas.append({"type": "signature_delta", "signature": signature})
    return Block(start={"type": "thinking", "thinking": "", "signature": ""}, deltas=deltas)


def redacted_thinking(data: str) -> Block:
    return Block(start={"type": "redacted_thinking", "data": data}, deltas=[])


def tool_use(tool_id: str, name: str, input: dict[str, Any], *, chunks: int = 4) -> Block:
    raw = json.dumps(input)
    # The API's first input_json_delta is often empty; keep that quirk.
    deltas = [{"type": "input_json_delta", "partial_json": ""}]
    deltas += [{"type": "input_json_delta", "partial_json": p} for p in _split(raw, chunks)]
    return Block(
        start={"type": "tool_use", "id": tool_id, "name": name, "input": {}}, deltas=deltas
    )


# -- responses --------------------------------------------------------------------------


@dataclass(frozen=True)
class SSEResponse:
    """A 200 ``text/event-stream`` response: ``(event name, data)`` frames in order.

    ``delay`` sleeps between frames. ``hang`` keeps the connection open after the last
    frame, sending pings, until the client goes away (for cancellation tests).
    """

    events: list[tuple[str, dict[str, Any]]]
    delay: float = 0.0
    hang: bool = False
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HTTPErrorResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


Response = SSEResponse | HTTPErrorResponse


def message(
    *blocks: Block,
    stop_reason: str | None = "end_turn",
    stop_sequence: str | None = None,
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read_input_tokens: int = 0,
    cache_creation_input_tokens: int = 0,
    delta_repeats_input_usage: bool = False,
    model: str = "claude-sonnet-4-5-20250929",
    message_id: str | None = None,
    delay: float = 0.0,
    hang: bool = False,
) -> SSEResponse:
    """A complete streamed message, framed as the API frames it.

    ``message_start`` carries the input and cache counts and an initial output count of
    1; ``message_delta`` carries the final (cumulative) ``output_tokens``. With
    ``delta_repeats_input_usage`` it also repeats the input/cache counts, as newer API
    versions do — a client must take the latest value, not add them.
    """
    message_id = message_id or _next_id("msg")
    start_usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "cache_read_input_tokens": cache_read_input_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": cache_creation_input_tokens,
            "ephemeral_1h_input_tokens": 0,
        },
        "output_tokens": 1,
        "service_tier": "standard",
    }
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
    ]
    for index, block in enumerate(blocks):
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block.start},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        for delta in block.deltas:
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta_usage: dict[str, Any] = {"output_tokens": output_tokens}
    if delta_repeats_input_usage:
        delta_usage.update(
            input_tokens=input_tokens,
            cache_creation_input_tokens=cache_creation_input_tokens,
            cache_read_input_tokens=cache_read_input_tokens,
        )
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": delta_usage,
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return SSEResponse(events=events, delay=delay, hang=hang)


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": _next_id("req"),
    }


def mid_stream_error(
    response: SSEResponse,
    after: int,
    error_type: str = "overloaded_error",
    message: str = "Overloaded",
) -> SSEResponse:
    """Keep the first ``after`` frames of ``response``, then an SSE ``error`` frame."""
    events = list(response.events[:after])
    events.append(("error", error_body(error_type, message)))
    return replace(response, events=events, hang=False)


def http_error(
    status: int,
    error_type: str,
    message: str,
    *,
    retry_after: float | None = None,
    retry_after_ms: int | None = None,
    headers: dict[str, str] | None = None,
) -> HTTPErrorResponse:
    h = dict(headers or {})
    if retry_after is not None:
        h["retry-after"] = str(retry_after)
    if retry_after_ms is not None:
        h["retry-after-ms"] = str(retry_after_ms)
    return HTTPErrorResponse(status=status, body=error_body(error_type, message), headers=h)


def overloaded(**kwargs: Any) -> HTTPErrorResponse:
    return http_error(529, "overloaded_error", "Overloaded", **kwargs)


def rate_limited(retry_after: float = 1, **kwargs: Any) -> HTTPErrorResponse:
    return http_error(
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit",
        retry_after=retry_after,
        **kwargs,
    )


def invalid_request(message: str) -> HTTPErrorResponse:
    return http_error(400, "invalid_request_error", message)


def authentication_error() -> HTTPErrorResponse:
    """The API's answer to a missing or wrong ``x-api-key``: 401, exactly this body."""
    return http_error(401, "authentication_error", "invalid x-api-key")


# -- prompt caching ---------------------------------------------------------------------

CACHE_LOOKBACK_BLOCKS = 20  # block boundaries checked before a breakpoint, as the API does
MAX_CACHE_BREAKPOINTS = 4
_TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


def estimate_tokens(value: Any) -> int:
    """About one token per four characters of the value's compact JSON (at least 1)."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return max(1, len(raw) // 4)


@dataclass(frozen=True)
class _Rendered:
    """One block of a request in the order the API caches it."""

    where: str  # e.g. "tools.2", "system.0", "messages.3.content.1"
    block: dict[str, Any]  # without cache_control
    cache_control: dict[str, Any] | None
    tokens: int


def _render(body: dict[str, Any]) -> list[_Rendered]:
    """``tools`` → ``system`` → ``messages``, one entry per block (a role change is part
    of the block, so the same text in another message is another prefix)."""
    out: list[_Rendered] = []

    def add(where: str, block: Any, extra: dict[str, Any] | None = None) -> None:
        if not isinstance(block, dict):
            block = {"type": "text", "text": str(block)}
        cc = block.get("cache_control")
        bare = {k: v for k, v in block.items() if k != "cache_control"}
        if extra:
            bare = {**extra, **bare}
        out.append(_Rendered(where, bare, cc, estimate_tokens(bare)))

    for i, t in enumerate(body.get("tools") or []):
        add(f"tools.{i}", t)
    system = body.get("system")
    if isinstance(system, str) and system:
        add("system", {"type": "text", "text": system})
    elif isinstance(system, list):
        for i, b in enumerate(system):
            add(f"system.{i}", b)
    for m, msg in enumerate(body.get("messages") or []):
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for i, b in enumerate(content or []):
            add(f"messages.{m}.content.{i}", b, {"_role": msg.get("role"), "_message": m})
    return out


class PromptCache:
    """The server side of prompt caching, per model, with the API's TTLs and lookback.

    ``min_tokens`` is the smallest prefix that is cached (the API's is 1,024-4,096
    depending on the model; 0 here unless a test sets it).
    """

    def __init__(self, min_tokens: int = 0) -> None:
        self.min_tokens = min_tokens
        self._entries: dict[str, float] = {}  # prefix hash -> expiry (monotonic)
        self._lock = threading.Lock()

    def validate(self, body: Any) -> str | None:
        """The API's 400 message for misplaced breakpoints, or ``None``."""
        if not isinstance(body, dict):
            return None
        blocks = _render(body)
        marked = [b for b in blocks if b.cache_control is not None]
        count = len(marked) + (1 if body.get("cache_control") is not None else 0)
        if count > MAX_CACHE_BREAKPOINTS:
            return (
                f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
                f"provided. Found {count}."
            )
        for b in marked:
            if b.block.get("type") in ("thinking", "redacted_thinking"):
                return f"{b.where}.cache_control: Extra inputs are not permitted"
            if b.block.get("type") == "text" and not b.block.get("text"):
                return f"{b.where}: cache_control cannot be set for empty text blocks"
        return None

    def use(self, body: Any) -> dict[str, int]:
        """Serve ``body``: read the longest cached prefix, write the ones up to each
        breakpoint, and return the input usage (``input_tokens`` excludes the cache)."""
        if not isinstance(body, dict):
            return {
                "input_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            }
        blocks = _render(body)
        breakpoints = [i for i, b in enumerate(blocks) if b.cache_control is not None]
        ttls = {i: blocks[i].cache_control or {} for i in breakpoints}
        if body.get("cache_control") is not None and blocks:
            # Automatic caching: one breakpoint on the last block.
            breakpoints.append(len(blocks) - 1)
            ttls[len(blocks) - 1] = body["cache_control"]
        cumulative: list[int] = []
        hashes: list[str] = []
        h = hashlib.sha256(str(body.get("model")).encode())
        total = 0
        for b in blocks:
            h.update(json.dumps(b.block, sort_keys=True).encode())
            hashes.append(h.copy().hexdigest())
            total += b.tokens
            cumulative.append(total)
        now = time.monotonic()
        with self._lock:
            self._entries = {k: v for k, v in self._entries.items() if v > now}
            read_upto = 0  # number of blocks served from the cache
            for bp in sorted(set(breakpoints)):
                for i in range(bp, max(-1, bp - CACHE_LOOKBACK_BLOCKS - 1), -1):
                    if hashes[i] in self._entries:
                        read_upto = max(read_upto, i + 1)
                        break
            cache_read = cumulative[read_upto - 1] if read_upto else 0
            written_upto = read_upto
            for bp in sorted(set(breakpoints)):
                ttl = _TTL_SECONDS.get(str(ttls[bp].get("ttl") or "5m"), 300.0)
                if cumulative[bp] < self.min_tokens:
                    continue
                # A hit refreshes the entry; a miss writes it.
                self._entries[hashes[bp]] = max(self._entries.get(hashes[bp], 0.0), now + ttl)
                written_upto = max(written_upto, bp + 1)
        cache_write = (cumulative[written_upto - 1] if written_upto else 0) - cache_read
        return {
            "input_tokens": total - cache_read - cache_write,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        }

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# -- the server -----------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    # The usage the streamed answer reported (message_start, then message_delta's).
    usage: dict[str, Any] | None = None
    # The client's (host, port): requests over one kept-alive connection share it.
    peer: tuple[str, int] | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Small writes (one per SSE frame) would otherwise wait on delayed ACKs (~40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in self.headers.items()}
        recorded = RecordedRequest("POST", self.path, headers, body)
        recorded.peer = tuple(self.client_address[:2])  # type: ignore[assignment]
        fake._record(recorded)
        if self.path.split("?")[0] != "/v1/messages":
            self._send_json(404, error_body("not_found_error", f"Not found: {self.path}"), {})
            return
        if fake.api_key is not None and headers.get("x-api-key") != fake.api_key:
            denied = authentication_error()
            self._send_json(denied.status, denied.body, denied.headers)
            return
        problem = fake.prompt_cache.validate(body)
        if problem is not None:
            bad = invalid_request(problem)
            self._send_json(bad.status, bad.body, bad.headers)
            return
        response = fake._next_response()
        if isinstance(response, HTTPErrorResponse):
            self._send_json(response.status, response.body, response.headers)
        else:
            response = fake._with_usage(response, body)
            recorded.usage = _reported_usage(response)
            self._send_stream(response)

    def _send_json(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        retryable = status in (408, 409, 429) or status >= 500
        all_headers = {
            "request-id": body.get("request_id") or _next_id("req"),
            # The real API tells its SDKs whether to retry; 529/429/5xx say yes.
            "x-should-retry": "true" if retryable else "false",
            **headers,
        }
        for k, v in all_headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _send_stream(self, response: SSEResponse) -> None:
        fake = self.server.fake
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", _next_id("req"))
        for k, v in response.headers.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            for i, (event, data) in enumerate(response.events):
                if i and response.delay:
                    time.sleep(response.delay)
                self._chunk(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
            if response.hang:
                # Keep the stream open (pinging, as the API does on slow turns) until
                # the client closes it; a write then fails.
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline and not fake._stopping.is_set():
                    time.sleep(0.02)
                    self._chunk(b'event: ping\ndata: {"type": "ping"}\n\n')
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            if response.events and response.events[-1][0] == "error":
                # The API ends the connection after an error frame.
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
            fake.client_disconnected.set()


def _reported_usage(response: SSEResponse) -> dict[str, Any] | None:
    usage: dict[str, Any] | None = None
    for event, data in response.events:
        if event == "message_start":
            usage = dict(data["message"].get("usage") or {})
        elif event == "message_delta" and usage is not None:
            usage.update(data.get("usage") or {})
    return usage


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeAnthropicServer


class FakeAnthropicServer:
    """The fake API on 127.0.0.1 with an ephemeral port, scripted by :meth:`enqueue`.

    Use as a context manager, or through the :func:`fake_anthropic` fixture (import it
    into a test module or a conftest). ``requests``
    holds every request received (parsed JSON body, lowercased headers);
    ``client_disconnected`` is set when a client drops a stream while it is written.
    With an empty queue a request gets a 400 naming the problem, so a test that
    under-scripts fails loudly instead of hanging.

    ``api_key``: when set, a request with another ``x-api-key`` gets the API's 401.
    ``simulate_usage``: report each streamed message's input and cache counts from the
    request itself and :attr:`prompt_cache` (see the module docstring), not the script's.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        simulate_usage: bool = False,
        min_cache_tokens: int = 0,
    ) -> None:
        self.api_key = api_key
        self.simulate_usage = simulate_usage
        self.prompt_cache = PromptCache(min_tokens=min_cache_tokens)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._queue: list[Response] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests: list[RecordedRequest] = []
        self.client_disconnected = threading.Event()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def enqueue(self, *responses: Response) -> FakeAnthropicServer:
        with self._lock:
            self._queue.extend(responses)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests if r.path.startswith("/v1/messages")]

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_response(self) -> Response:
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
        return invalid_request("fake server: no scripted response left")

    def _with_usage(self, response: SSEResponse, body: Any) -> SSEResponse:
        """Serve the request from the prompt cache; with ``simulate_usage`` report it."""
        counts = self.prompt_cache.use(body)
        if not self.simulate_usage:
            return response
        events = copy.deepcopy(response.events)
        for event, data in events:
            if event == "message_start":
                usage = data["message"].setdefault("usage", {})
                usage.update(counts)
                usage["cache_creation"] = {
                    "ephemeral_5m_input_tokens": counts["cache_creation_input_tokens"],
                    "ephemeral_1h_input_tokens": 0,
                }
            elif event == "message_delta":
                usage = data.setdefault("usage", {})
                for key in counts:
                    if key in usage:  # newer API versions repeat them: keep them equal
                        usage[key] = counts[key]
        return replace(response, events=events)

    def start(self) -> FakeAnthropicServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()  # blocks until serve_forever returns: only if started
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeAnthropicServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server
