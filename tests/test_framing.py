"""LineFramer: whole lines out of any chunking, with a size limit."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from broker.wire.frames import Oversize
from broker.wire.ndjson import LineFramer


def feed_chunks(chunks: list[bytes], max_bytes: int = 1024) -> list[bytes | Oversize]:
    framer = LineFramer(max_bytes)
    out: list[bytes | Oversize] = []
    for chunk in chunks:
        out += framer.feed(chunk)
    return out


def trickle(data: bytes, max_bytes: int = 1024) -> list[bytes | Oversize]:
    """Feed one byte at a time."""
    return feed_chunks([data[i : i + 1] for i in range(len(data))], max_bytes)


def split_at(data: bytes, cut: int) -> list[bytes]:
    return [data[:cut], data[cut:]]


STREAM = b'{"a":1}\n{"b":[1,2]}\r\n\n   \n{"c":"x\\ny"}\n'
LINES = [b'{"a":1}', b'{"b":[1,2]}', b'{"c":"x\\ny"}']


def test_one_chunk() -> None:
    assert feed_chunks([STREAM]) == LINES


def test_one_byte_at_a_time() -> None:
    assert trickle(STREAM) == LINES


def test_every_split_point() -> None:
    for cut in range(len(STREAM) + 1):
        assert feed_chunks(split_at(STREAM, cut)) == LINES, cut


def test_crlf_is_stripped() -> None:
    assert feed_chunks([b"one\r\ntwo\r\n"]) == [b"one", b"two"]


def test_crlf_split_between_cr_and_lf() -> None:
    assert feed_chunks([b"one\r", b"\ntwo\r", b"\n"]) == [b"one", b"two"]


def test_blank_lines_skipped() -> None:
    assert feed_chunks([b"\n\r\n  \t\nx\n\n"]) == [b"x"]


def test_unfinished_line_is_held() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a"') == []
    assert framer.pending == 4
    assert framer.feed(b":1}\n") == [b'{"a":1}']
    assert framer.pending == 0


def test_line_at_the_limit_passes() -> None:
    assert feed_chunks([b"abcd\n"], max_bytes=4) == [b"abcd"]
    assert trickle(b"abcd\n", max_bytes=4) == [b"abcd"]


def test_crlf_line_at_the_limit_passes_however_chunked() -> None:
    data = b"abcd\r\nok\r\n"
    assert feed_chunks([data], max_bytes=4) == [b"abcd", b"ok"]
    assert trickle(data, max_bytes=4) == [b"abcd", b"ok"]


def test_oversize_in_one_chunk() -> None:
    data = b"x" * 100 + b"\nnext\n"
    assert feed_chunks([data], max_bytes=10) == [Oversize(100), b"next"]


def test_oversize_trickled() -> None:
    framer = LineFramer(10)
    out: list[bytes | Oversize] = []
    for byte in b"x" * 100:
        out += framer.feed(bytes([byte]))
    assert out == []
    assert framer.pending == 100
    assert framer.feed(b"\nnext\n") == [Oversize(100), b"next"]


def test_oversize_every_split_point() -> None:
    data = b"y" * 30 + b"\r\nnext\n"
    for cut in range(len(data) + 1):
        assert feed_chunks(split_at(data, cut), max_bytes=10) == [Oversize(31), b"next"], cut
    assert trickle(data, max_bytes=10) == [Oversize(31), b"next"]


def test_oversize_reported_once_between_good_lines() -> None:
    data = b"a\n" + b"z" * 50 + b"\nb\n" + b"z" * 20 + b"\nc\n"
    expected = [b"a", Oversize(50), b"b", Oversize(20), b"c"]
    assert feed_chunks([data], max_bytes=10) == expected
    assert trickle(data, max_bytes=10) == expected


def test_oversize_arriving_in_large_chunks() -> None:
    assert feed_chunks([b"q" * 7, b"q" * 7, b"q" * 7 + b"\nok\n"], max_bytes=10) == [
        Oversize(21),
        b"ok",
    ]


def test_bytearray_chunks() -> None:
    assert LineFramer().feed(bytearray(b"x\ny\n")) == [b"x", b"y"]


# -- property: any chunking yields the lines ---------------------------------

json_ish = st.text(
    alphabet=st.sampled_from([*'{}[]":,0123456789abcxyz \\', "é", "\u2028"]),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip() != "")


@st.composite
def lines_and_chunks(draw: st.DrawFn) -> tuple[list[bytes], list[bytes], bool]:
    lines = [line.encode() for line in draw(st.lists(json_ish, max_size=8))]
    crlf = draw(st.booleans())
    ending = b"\r\n" if crlf else b"\n"
    data = b"".join(line + ending for line in lines)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=10)))
    bounds = [0, *cuts, len(data)]
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    return lines, chunks, crlf


@given(lines_and_chunks())
def test_any_chunking_yields_the_lines(case: tuple[list[bytes], list[bytes], bool]) -> None:
    lines, chunks, _ = case
    assert feed_chunks(chunks) == lines


@given(lines_and_chunks(), st.integers(1, 30))
def test_any_chunking_same_result_with_a_limit(
    case: tuple[list[bytes], list[bytes], bool], max_bytes: int
) -> None:
    lines, chunks, crlf = case
    whole = feed_chunks([b"".join(chunks)], max_bytes)
    assert feed_chunks(chunks, max_bytes) == whole
    extra = 1 if crlf else 0
    assert whole == [
        line if len(line) <= max_bytes else Oversize(len(line) + extra) for line in lines
    ]


def test_an_oversize_line_is_answered_with_its_size_and_the_limit() -> None:
    (line,) = feed_chunks([b"x" * 40 + b"\n"], max_bytes=30)
    assert isinstance(line, Oversize)
    assert line.error_response(30) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Message too large: 40 bytes (the limit is 30)"},
    }
