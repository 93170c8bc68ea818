"""Streamable HTTP clients for the load engine (:mod:`tools.bench_engine`).

One :class:`HttpClient` is one MCP session over Streamable HTTP (the
``Mcp-Session-Id`` its ``initialize`` got) on plain keep-alive HTTP/1.1
sockets, multiplexed on the engine's selector like its other clients, with no
HTTP library: a load generator must cost as little as it can. HTTP/1.1
carries one request at a time per connection, so a session with K calls in
flight holds K connections (opened as they are first needed), each POSTing
one request and reading its answer, a JSON body or an SSE stream, before the
next.

The engine decides what to send and counts what comes back; this module
speaks HTTP: :meth:`HttpClient.post` a message on an idle connection,
:meth:`HttpClient.ready` reads what a connection's socket has and returns
the messages that came (each a JSON-RPC message's bytes) and the requests
that ended without one: with an HTTP error status (counted as errors, by
``HTTP <status>``) or lost (the connection closed under them). A
connection the server closed before a byte of the answer came is the
keep-alive race (the server timed out the idle connection as the request
went out): the request is sent again, once, on a new connection.

A client of the 2026-07-28 revision (``modern``) has no session: it opens
with ``server/discover`` (no ``initialize``, no ``Mcp-Session-Id``), and
every POST carries the headers that revision asks for beside its body's
``_meta``: ``MCP-Protocol-Version``, ``Mcp-Method`` and, for a
``tools/call``, ``Mcp-Name`` (the tool's name; :func:`modern_fields`).

Not here: the GET stream for the server's own notifications (the engine
counts answers to calls, which come on their POSTs), DELETE of the session
at the end (the server's idle timeout ends it), legacy HTTP+SSE.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LATEST_MODERN_VERSION,
    PROTOCOL_VERSION_KEY,
)
from broker.wire.http_upstream_modern import encode_header_value

ACCEPT_BOTH = "application/json, text/event-stream"  # what SDK clients send
MODERN_VERSION = LATEST_MODERN_VERSION
CLIENT_INFO = {"name": "mcpbroker-bench", "version": "1"}  # (either era's clients)
# What every request of a modern client carries in params._meta.
MODERN_META = {
    PROTOCOL_VERSION_KEY: MODERN_VERSION,
    CLIENT_CAPABILITIES_KEY: {},
    CLIENT_INFO_KEY: CLIENT_INFO,
}
READ_SIZE = 256 * 1024
CONNECT_TIMEOUT = 10.0
MAX_HEAD = 64 * 1024


class HttpFailure(Exception):
    """A URL this client cannot use, or a server it cannot reach."""


def split_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path with query)`` of an http(s):// URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpFailure(f"not an http(s):// URL: {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise HttpFailure(f"not a valid port in {url!r}") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


def _field(name: str, value: str) -> bytes:
    if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
        raise HttpFailure(f"not a valid HTTP header: {name!r}")
    return f"{name}: {value}\r\n".encode()


def discover_body(id: str) -> bytes:
    """A modern client's first POST: ``server/discover`` (there is no handshake)."""
    request = {
        "jsonrpc": "2.0",
        "id": id,
        "method": "server/discover",
        "params": {"_meta": MODERN_META},
    }
    return orjson.dumps(request)


def modern_fields(method: str, name: str | None = None) -> bytes:
    """The header fields a 2026-07-28 POST of ``method`` carries beside its body:
    ``Mcp-Method``, and ``Mcp-Name`` (``name``: a tool's, a prompt's, a URI),
    encoded as the broker's own link encodes them (the spec's
    ``=?base64?...?=`` form unless the value is safe as it is)."""
    fields = _field("Mcp-Method", method)
    if name is not None:
        fields += _field("Mcp-Name", encode_header_value(name))
    return fields


class Response:
    """An HTTP/1.1 response read incrementally: its head, then its body by
    ``Content-Length``, chunked, or up to the connection's end; an SSE body
    is split into its events' data as it comes, a JSON body taken whole."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.started = False  # a byte of it has come
        self.done = False
        self._raw = bytearray()  # bytes not parsed yet
        self._head_done = False
        self._mode = b""  # b"length", b"chunked", b"close", b"none"
        self._left = 0  # body bytes left (length), or of the current chunk (chunked)
        self._trailer = False  # chunked: past the last chunk
        self._sse = False
        self._body = bytearray()  # JSON: the whole body; SSE: what is not a whole event yet

    def feed(self, data: bytes) -> list[bytes]:
        """Take bytes; the messages they completed (SSE events' data, or a JSON body)."""
        self.started = True
        self._raw += data
        if not self._head_done and not self._read_head():
            return []
        self._read_body()
        return self._messages()

    def eof(self) -> list[bytes]:
        """The connection ended: the end of a body that runs up to it."""
        if self._head_done and self._mode == b"close":
            self._body += self._raw
            self._raw.clear()
            self.done = True
            return self._messages()
        return []

    def _read_head(self) -> bool:
        end = self._raw.find(b"\r\n\r\n")
        if end < 0:
            if len(self._raw) > MAX_HEAD:
                raise HttpFailure("a response head over 64 KiB")
            return False
        lines = bytes(self._raw[:end]).split(b"\r\n")
        del self._raw[: end + 4]
        try:
            self.status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            raise HttpFailure(f"not an HTTP response: {lines[0][:80]!r}") from None
        if 100 <= self.status < 200:  # 100 Continue and friends: the real head follows
            return self._read_head() if self._raw else False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()
        self._head_done = True
        self._sse = self.headers.get(b"content-type", b"").startswith(b"text/event-stream")
        if b"chunked" in self.headers.get(b"transfer-encoding", b"").lower():
            self._mode = b"chunked"
        elif b"content-length" in self.headers:
            self._mode, self._left = b"length", int(self.headers[b"content-length"])
        elif self.status in (204, 304):
            self._mode = b"none"
        else:
            self._mode = b"close"
        return True

    def _read_body(self) -> None:
        raw = self._raw
        if self._mode == b"none":
            self.done = True
        elif self._mode == b"length":
            take = min(self._left, len(raw))
            self._body += raw[:take]
            del raw[:take]
            self._left -= take
            self.done = self._left == 0
        elif self._mode == b"chunked":
            self._read_chunks()
        else:
            self._body += raw
            raw.clear()

    def _read_chunks(self) -> None:
        raw = self._raw
        while raw and not self.done:
            if self._trailer:  # trailer fields, then an empty line
                end = raw.find(b"\r\n")
                if end < 0:
                    return
                del raw[: end + 2]
                self.done = end == 0
            elif self._left > 0:
                take = min(self._left, len(raw))
                self._body += raw[:take]
                del raw[:take]
                self._left -= take
                if self._left == 0:
                    self._left = -2  # the CRLF after the data
            elif self._left < 0:  # the CRLF after a chunk's data
                if len(raw) < 2:
                    return
                del raw[:2]
                self._left = 0
            else:
                end = raw.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(raw[:end]).split(b";", 1)[0], 16)
                del raw[: end + 2]
                self._left, self._trailer = size, size == 0

    def _messages(self) -> list[bytes]:
        if self._sse:
            return self._events()
        if not self.done or not self._body.strip() or not 200 <= self.status < 300:
            return []
        return [bytes(self._body)]

    def _events(self) -> list[bytes]:
        """The data of every whole event the body holds (events end with a blank line)."""
        body, out = self._body, []
        while True:
            lf, crlf = body.find(b"\n\n"), body.find(b"\r\n\r\n")
            if lf < 0 and crlf < 0:
                break
            end, skip = (crlf, 4) if lf < 0 or 0 <= crlf < lf else (lf, 2)
            data = [
                line[5:].removeprefix(b" ")
                for line in bytes(body[:end]).splitlines()
                if line.startswith(b"data:")
            ]
            del body[: end + skip]
            if data and any(data):
                out.append(b"\n".join(data))
        return out


class Connection:
    """One keep-alive HTTP/1.1 connection of a session, one request at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.out = bytearray()  # what is still to write
        self.request = b""  # the request in flight, to send again after the keep-alive race
        self.id: Any = None  # the JSON-RPC id it carries (None: a notification or reply)
        self.busy = False
        self.retried = False
        self.writing = False  # the selector watches it for writing too
        self.response = Response()

    def recv(self) -> bytes:
        """What the socket has (b"" at its end); BlockingIOError if nothing yet."""
        try:
            data = self.sock.recv(READ_SIZE)
        except ssl.SSLWantReadError:
            raise BlockingIOError from None
        if isinstance(self.sock, ssl.SSLSocket):  # decrypted bytes the selector cannot see
            while self.sock.pending():
                data += self.sock.recv(self.sock.pending())
        return data

    def send(self) -> None:
        while self.out:
            try:
                written = self.sock.send(self.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            del self.out[:written]


class HttpClient:
    """One MCP session over Streamable HTTP, as the engine's client.

    It has what the engine reads of every client (``opened``, ``ready_ns``,
    ``pending``, ``closed``, ``init_error``, ``pid``, ``process``); the
    engine marks it ready once the server has taken its
    ``notifications/initialized`` (a call that overtook it on another
    connection could be refused), or, ``modern``, once ``server/discover``
    is answered.
    """

    pid = None
    process = None

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None,
        accept: str,
        selector: selectors.BaseSelector,
        opened: int,
        modern: bool = False,
    ) -> None:
        self.scheme, self.host, self.port, path = split_url(url)
        self.url = url
        host = self.host if ":" not in self.host else f"[{self.host}]"
        default = 443 if self.scheme == "https" else 80
        authority = host if self.port == default else f"{host}:{self.port}"
        head = f"POST {path} HTTP/1.1\r\n".encode() + _field("Host", authority)
        head += _field("Content-Type", "application/json") + _field("Accept", accept)
        if modern:  # (no session: the version goes on every POST from the first)
            head += _field("MCP-Protocol-Version", MODERN_VERSION)
        for name, value in (headers or {}).items():
            head += _field(name, value)
        self._head = head
        self.modern = modern
        self.call_fields = b""  # modern: a tools/call's Mcp-Method and Mcp-Name (the engine's)
        self._selector = selector
        self._tls = ssl.create_default_context() if self.scheme == "https" else None
        self.connections: dict[int, Connection] = {}
        self._idle: list[Connection] = []
        self.opened = opened
        self.ready_ns: int | None = None
        self.pending: dict[int, int] = {}  # request id -> when it was written (ns)
        self.next_id = 1
        self.closed = False
        self.init_error: Any = None
        self.session = b""
        self.initialized_id: Any = object()  # marks the notifications/initialized POST
        self.suffix = b""  # the end of each tools/call it sends (set by Engine.run)

    # -- what the engine calls ---------------------------------------------------

    def post(self, body: bytes, id: Any = None, fields: bytes = b"") -> None:
        """Send one message on an idle connection (a new one if none is), with
        header ``fields`` of its own beside the session's."""
        conn = self._idle.pop() if self._idle else self._connect()
        length = b"Content-Length: %d\r\n\r\n" % len(body)
        conn.request = self._head + fields + length + body
        conn.id, conn.busy, conn.retried, conn.response = id, True, False, Response()
        conn.out += conn.request
        self._write(conn)

    def agreed(self, version: str | None) -> None:
        """The initialize's answer came: the session id it gave (and the version
        agreed) go on every later POST."""
        if self.session:
            self._head += b"Mcp-Session-Id: " + self.session + b"\r\n"
        if isinstance(version, str):
            self._head += _field("MCP-Protocol-Version", version)

    def ready(self, fd: int, mask: int) -> tuple[list[bytes], list[tuple[Any, str | None]]]:
        """The socket ``fd`` can be read or written: the messages that came, and the
        requests that ended without an answer, ``(id, "HTTP <status>")`` or
        ``(id, None)``, lost."""
        conn = self.connections.get(fd)
        if conn is None:
            return [], []
        if mask & selectors.EVENT_WRITE:
            self._write(conn)
        if not mask & selectors.EVENT_READ:
            return [], []
        try:
            data = conn.recv()
        except BlockingIOError:
            return [], []
        except OSError:
            data = b""
        if not data:
            return self._ended(conn)
        if not conn.busy:  # bytes nobody asked for: the connection is no use
            self._close(conn)
            return [], []
        response = conn.response
        try:
            messages = response.feed(data)
        except (HttpFailure, ValueError):
            self._close(conn)
            return [], [(conn.id, "bad HTTP")]
        if response.status == 200 and not self.session and b"mcp-session-id" in response.headers:
            self.session = response.headers[b"mcp-session-id"]
        if not response.done:
            return messages, []
        reuse = response.headers.get(b"connection", b"").lower() != b"close"
        return messages, self._finished(conn, reuse)

    def close(self) -> None:
        for conn in list(self.connections.values()):
            self._close(conn)
        self.closed = True

    # -- connections ---------------------------------------------------------------

    def _connect(self) -> Connection:
        try:
            sock = socket.create_connection((self.host, self.port), CONNECT_TIMEOUT)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:
            raise HttpFailure(f"could not connect to {self.url}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = Connection(sock)
        self.connections[conn.fd] = conn
        self._selector.register(conn.fd, selectors.EVENT_READ, self)
        return conn

    def _write(self, conn: Connection) -> None:
        try:
            conn.send()
        except OSError:
            return  # the read side sees the end and says what became of the request
        if bool(conn.out) != conn.writing:
            conn.writing = bool(conn.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self._selector.modify(conn.fd, events, self)

    def _finished(self, conn: Connection, reuse: bool) -> list[tuple[Any, str | None]]:
        """A whole response came: the connection is idle again (or closed); a
        request answered with an error status failed."""
        status, id = conn.response.status, conn.id
        conn.busy, conn.id = False, None
        if reuse:
            self._idle.append(conn)
        else:
            self._close(conn)
        ok = 200 <= status < 300
        if id is self.initialized_id and ok:
            self.ready_ns = time.perf_counter_ns()
        return [] if ok or id is None else [(id, f"HTTP {status}")]

    def _ended(self, conn: Connection) -> tuple[list[bytes], list[tuple[Any, str | None]]]:
        """The server closed the connection (or it broke)."""
        response, id = conn.response, conn.id
        if not conn.busy:
            self._close(conn)
            return [], []
        if response.started:
            messages = response.eof()
            if response.done:
                return messages, self._finished(conn, reuse=False)
            self._close(conn)
            return messages, [(id, None)]
        self._close(conn)
        if conn.retried:
            return [], [(id, None)]
        try:  # the keep-alive race: once more, on a new connection
            again = self._connect()
        except HttpFailure:
            return [], [(id, None)]
        again.request, again.id, again.busy, again.retried = conn.request, id, True, True
        again.out += again.request
        self._write(again)
        return [], []

    def _close(self, conn: Connection) -> None:
        if self.connections.pop(conn.fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.fd)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)
        conn.sock.close()
