"""The requests on one connection, from its bytes (actors/downstream/http_parser.py):
httptools' parse, with the head bound and the order of events this module adds."""

from __future__ import annotations

import pytest

from actors.downstream.http_parser import (
    CLOSED,
    END,
    NEED_DATA,
    BadRequest,
    Event,
    Request,
    RequestParser,
)

TWO = (
    b"POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-Pad:  v \r\n\r\nhello"
    b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
)


def events(parser: RequestParser) -> list[object]:
    """Everything the parser has, as comparable values; a BadRequest last."""
    out: list[object] = []
    while True:
        try:
            event: Event = parser.next_event()
        except BadRequest as exc:
            return [*out, (exc.status, str(exc))]
        if event is NEED_DATA or event is CLOSED:
            return [*out, event]
        if isinstance(event, Request):
            out.append((event.method, event.target, event.headers, event.keep_alive))
        elif isinstance(event, bytes):
            if out and isinstance(out[-1], bytes):
                out[-1] += event  # (how a body is cut into pieces is not its meaning)
            else:
                out.append(event)
        else:
            out.append(event)


def test_trickled_byte_by_byte_or_at_once_the_requests_are_the_same() -> None:
    at_once = RequestParser()
    at_once.receive_data(TWO)
    trickled = RequestParser()
    for byte in TWO:
        trickled.receive_data(bytes([byte]))
    expected = [
        ("POST", b"/a?x=1", [(b"host", b"h"), (b"content-length", b"5"), (b"x-pad", b"v")], True),
        b"hello",
        END,
        ("POST", b"/b", [(b"host", b"h"), (b"transfer-encoding", b"chunked")], True),
        b"abcde",
        END,
        NEED_DATA,
    ]
    assert events(at_once) == expected
    assert events(trickled) == expected
    trickled.receive_data(b"")
    assert trickled.next_event() is CLOSED


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_head_over_the_bound_is_refused_before_it_ends(pipelined: bool) -> None:
    parser = RequestParser(max_head_bytes=1000)
    first = b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n" if pipelined else b""
    parser.receive_data(first + b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: ")
    for _ in range(30):
        parser.receive_data(b"a" * 100)  # never ends
    found = events(parser)
    assert found[-1] == (431, "Request header fields too large (more than 1000 bytes)")
    assert (found[0][1] == b"/first") is pipelined  # type: ignore[index]


def test_a_head_just_under_the_bound_is_taken() -> None:
    parser = RequestParser(max_head_bytes=1000)
    parser.receive_data(b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * 900 + b"\r\n\r\n")
    assert events(parser)[1:] == [END, NEED_DATA]


def test_bad_http_comes_after_the_requests_before_it() -> None:
    parser = RequestParser()
    parser.receive_data(b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\nNOT HTTP\r\n\r\n")
    found = events(parser)
    assert found[0][1] == b"/ok" and found[1] is END  # type: ignore[index]
    assert found[2] == (400, "Bad request: Invalid method encountered")
    parser.receive_data(b"GET / HTTP/1.1\r\n\r\n")  # nothing after it is parsed
    assert parser.next_event() is NEED_DATA


def test_keep_alive_expect_and_upgrade_are_read_from_the_head() -> None:
    parser = RequestParser()
    parser.receive_data(b"GET / HTTP/1.0\r\n\r\n")
    request = parser.next_event()
    assert isinstance(request, Request) and not request.keep_alive
    parser = RequestParser()
    parser.receive_data(
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n"
    )
    request = parser.next_event()
    assert isinstance(request, Request) and request.expect_continue and request.keep_alive
    parser = RequestParser()
    parser.receive_data(
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x00"
    )
    request = parser.next_event()
    assert isinstance(request, Request) and not request.keep_alive  # answered, then closed
    assert parser.next_event() is END and parser.next_event() is CLOSED


@pytest.mark.parametrize("cut", [0, 2, 4])
def test_an_upgrade_is_answered_as_http_with_its_body(cut: int) -> None:
    """(What ``curl --http2`` sends to an http:// URL: llhttp alone would
    take the body for the new protocol's bytes.)"""
    parser = RequestParser()
    head = b"POST / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    head += b"Upgrade: h2c\r\nContent-Length: 4\r\n\r\n"
    parser.receive_data(head + b"body"[:cut])
    parser.receive_data(b"body"[cut:] + b"PRI * HTTP/2.0")
    found = events(parser)
    assert found[0][3] is False  # type: ignore[index]  # the connection's last request
    assert found[1:] == [b"body", END, CLOSED]
