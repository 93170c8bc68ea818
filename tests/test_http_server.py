"""The HTTP/1.1 server under serve --http (actors/downstream/http_server.py), on
real loopback sockets, with a small ASGI-shaped app: keep-alive, streaming,
the bounds and the refusals of bad HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from actors.downstream.http_server import MAX_HEAD_BYTES, HttpServer

LIMIT = 1000  # the app's body limit


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echoes a POST's body, streams three pieces for GET /stream, and refuses
    a declared body over LIMIT without reading it (as the listener does)."""
    headers = dict(scope["headers"])
    if int(headers.get(b"content-length", b"0")) > LIMIT:
        await send(
            {"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]}
        )
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/forever":  # until a write finds the client gone
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while True:
            await send({"type": "http.response.body", "body": b"x" * 1000, "more_body": True})
            await trio.sleep(0.01)
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"a", b"b", b"c"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        message = await receive()
        assert message["type"] == "http.request"
        body += message["body"]
        if not message.get("more_body"):
            break
    answer = f"{scope['method']} {scope['path']} ".encode() + body
    length = str(len(answer)).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
    )
    await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def serving(server: HttpServer | None = None, **kwargs: Any) -> AsyncIterator[int]:
    server = server or HttpServer(app, **kwargs)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        yield port
        nursery.cancel_scope.cancel()


async def read_all(stream: trio.SocketStream) -> bytes:
    """Everything until the server closes the connection."""
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def read_until(stream: trio.SocketStream, marker: bytes, count: int = 1) -> bytes:
    data = b""
    while data.count(marker) < count:
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    return data


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
    return head + extra + b"\r\n" + body


async def test_requests_follow_one_another_on_one_connection() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            for n in range(3):
                await stream.send_all(post("/mcp/a%20b", b"hello %d" % n))
                data = await read_until(stream, b"hello %d" % n)
                assert data.startswith(b"HTTP/1.1 200 ")
                assert data.endswith(b"POST /mcp/a b hello %d" % n)
            # two sent at once are answered in order
            await stream.send_all(post("/x", b"one") + post("/y", b"two"))
            data = await read_until(stream, b"HTTP/1.1 200", 2)
            data += await read_until(stream, b"two") if not data.endswith(b"two") else b""
            assert data.index(b"POST /x one") < data.index(b"POST /y two")
            await stream.aclose()


async def test_a_stream_is_written_chunked_and_the_connection_kept() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            data = await read_until(stream, b"0\r\n\r\n")
            assert b"transfer-encoding: chunked" in data.lower()
            assert data.endswith(b"1\r\na\r\n1\r\nb\r\n1\r\nc\r\n0\r\n\r\n")
            await stream.send_all(post("/again", b"!"))
            assert (await read_until(stream, b"/again !")).startswith(b"HTTP/1.1 200")
            await stream.aclose()


async def test_bad_http_is_refused_with_400_and_closed() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"this is not http\r\n\r\n")
            data = await read_all(stream)
            assert data.startswith(b"HTTP/1.1 400 ") and b"connection: close" in data.lower()


async def test_a_head_too_large_is_refused_before_it_ends() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            big = b"X-Big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n"
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n" + big)
            data = await read_all(stream)
            assert data.split(b" ")[1] in (b"400", b"431")


async def test_a_body_over_the_limit_is_refused_unread_and_the_connection_closed() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(post("/", b"x" * 100).replace(b"100", b"999999", 1))
            data = await read_all(stream)
            assert data.startswith(b"HTTP/1.1 413 ") and b"connection: close" in data.lower()


async def test_an_idle_connection_is_closed() -> None:
    with trio.fail_after(10):
        async with serving(idle_seconds=0.3) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(post("/", b"once"))
            await read_until(stream, b"once")
            start = trio.current_time()
            assert await read_all(stream) == b""  # closed by the server
            assert 0.2 < trio.current_time() - start < 5
            slow = await trio.open_tcp_stream("127.0.0.1", port)
            await slow.send_all(b"GET / HTTP/1.1\r\n")  # and never the rest
            assert await read_all(slow) == b""


async def test_connections_past_the_bound_get_503() -> None:
    with trio.fail_after(10):
        async with serving(max_connections=2) as port:
            held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
            for stream in held:  # both are being served
                await stream.send_all(post("/", b"hi"))
                await read_until(stream, b"hi")
            extra = await trio.open_tcp_stream("127.0.0.1", port)
            assert (await read_all(extra)).startswith(b"HTTP/1.1 503 ")
            await held[0].aclose()
            await trio.sleep(0.2)
            again = await trio.open_tcp_stream("127.0.0.1", port)
            await again.send_all(post("/", b"room"))
            assert (await read_until(again, b"room")).startswith(b"HTTP/1.1 200")


async def test_a_client_leaving_a_stream_ends_its_response_and_connection() -> None:
    server = HttpServer(app)
    with trio.fail_after(10):
        async with serving(server) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
            await read_until(stream, b"xxxx")
            assert server.connections == 1
            await stream.aclose()
            while server.connections:  # the next write finds it gone
                await trio.sleep(0.01)
            other = await trio.open_tcp_stream("127.0.0.1", port)  # and serving goes on
            await other.send_all(post("/", b"still"))
            assert (await read_until(other, b"still")).startswith(b"HTTP/1.1 200")


# -- the request parse (httptools) and the framing written here ------------------


async def test_a_chunked_body_is_read_whole() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            await stream.send_all(head + b"5\r\nhello\r\n")
            await trio.sleep(0.05)  # the rest later: the body is read in pieces
            await stream.send_all(b"6\r\n world\r\n0\r\n\r\n")
            data = await read_until(stream, b"hello world")
            assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"POST /c hello world")


async def test_a_request_trickled_byte_by_byte_is_read() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            for byte in post("/t", b"slowly", b"X-Extra:  spaced  \r\n"):
                await stream.send_all(bytes([byte]))
            assert (await read_until(stream, b"slowly")).endswith(b"POST /t slowly")


async def test_expect_100_continue_is_answered_before_the_body_is_read() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(
                post("/e", b"", b"Expect: 100-continue\r\n").replace(
                    b"Content-Length: 0", b"Content-Length: 4"
                )
            )
            interim = await read_until(stream, b"\r\n\r\n")
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            await stream.send_all(b"body")
            assert (await read_until(stream, b"body")).startswith(b"HTTP/1.1 200 ")


async def test_framing_conflicts_are_refused_with_a_reason() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            for extra in (b"Transfer-Encoding: chunked\r\n", b"Content-Length: 3\r\n"):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(post("/", b"abc", extra))
                data = await read_all(stream)
                assert data.startswith(b"HTTP/1.1 400 "), data
                assert b"connection: close" in data and b"Content-Length" in data


async def test_bad_http_after_a_good_request_is_answered_in_order() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(post("/ok", b"first") + b"GARBAGE\r\n\r\n")
            data = await read_all(stream)
            assert data.index(b"POST /ok first") < data.index(b"HTTP/1.1 400 ")


async def test_a_pipelined_head_too_large_is_refused() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            big = b"X-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
            await stream.send_all(post("/ok", b"first") + b"GET / HTTP/1.1\r\n" + big)
            data = await read_all(stream)
            assert b"POST /ok first" in data and b"HTTP/1.1 431 " in data


async def test_http_1_0_gets_its_answer_then_the_connection_closes() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /stream HTTP/1.0\r\n\r\n")
            data = await read_all(stream)  # not chunked: the body ends with the connection
            assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"\r\n\r\nabc")
            assert b"connection: close" in data and b"chunked" not in data


async def test_a_head_request_gets_no_body_and_keeps_the_connection() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n" + post("/y", b"next"))
            data = await read_until(stream, b"next")
            first, _, second = data.partition(b"HTTP/1.1 200 ")[2].partition(b"HTTP/1.1 200 ")
            assert first.endswith(b"\r\n\r\n") and b"content-length: 8" in first.lower()
            assert second.endswith(b"POST /y next")


async def test_an_upgrade_request_is_answered_as_http_1_1_then_closed() -> None:
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            extra = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            await stream.send_all(post("/u", b"body", extra))
            data = await read_all(stream)
            assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"POST /u body")
