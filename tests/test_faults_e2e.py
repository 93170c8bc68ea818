"""Fault injection, the client's side (issue #10): nothing a client sends can take
down, wedge, bloat or hijack the daemon.

Each test runs the real daemon process, a bystander session calling a healthy
server throughout, and a client that misbehaves on a raw socket; it asserts
that every request of a live client gets exactly one answer, that the daemon
lives, that its RSS and descriptors come back near where they were, and that
the bystander saw no error and no call slower than 1 s. docs/faults.md lists
the cases; tests/test_faults_servers_e2e.py has the servers' side.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio

from tests.conftest import demo_server
from tests.faultkit import (
    MB,
    PeakRss,
    bystander,
    connect,
    id_key,
    misbehaving,
    nested,
    running_daemon,
)

INVALID_REQUEST, PARSE_ERROR = -32600, -32700


def deep_call(id: int, depth: int) -> str:
    """A tools/call of ``depth`` whose arguments nest ``depth`` levels."""
    params = f'{{"name":"depth","arguments":{nested(depth)}}}'
    return f'{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}'


async def test_deeply_nested_requests_are_refused_and_the_session_goes_on() -> None:
    with trio.fail_after(30):
        servers = {"m": misbehaving(), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            async with connect(daemon, ["m"]) as client:
                shallow = orjson.loads(nested(100))  # within the limit (128 levels)
                assert await client.call("depth", shallow) == "100"
                for id, depth in ((300, 300), (600, 600), (1000, 1000)):
                    await client.send(deep_call(id, depth))
                    response = await client.response(id)
                    assert response.get("error", {}).get("code") == INVALID_REQUEST, response
                roots = '{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":'
                await client.send(roots + nested(600) + "}")
                await client.send(deep_call(1100, 1100))  # past what orjson parses: not JSON
                await client.wait_until(lambda: bool(_codes(client, PARSE_ERROR)), 5, "no -32700")
                assert await client.call("echo", {"text": "still here"}) == "still here"
                assert await client.call("depth", shallow) == "100"
                for id in (300, 600, 1000):
                    assert len(client.responses[id_key(id)]) == 1, client.responses[id_key(id)]
                # The deep notification: no answer, or at most a -32600 without id.
                assert len(_codes(client, PARSE_ERROR)) == 1, client.errors_without_id()
                assert len(client.errors_without_id()) <= 2, client.errors_without_id()
            await daemon.recovers(before)
        watcher.check()


def _codes(client: Any, code: int) -> list[dict[str, Any]]:
    """The errors without id that ``client`` got with ``code``."""
    return [e for e in client.errors_without_id() if e["error"]["code"] == code]


async def test_a_client_that_never_reads_is_disconnected_before_it_bloats_the_daemon() -> None:
    """1,100 answers of 1 MiB for a client that reads none: cut off at maxQueuedBytes."""
    with trio.fail_after(60):
        servers = {"m": misbehaving(), "demo": demo_server()}
        broker = {"maxQueuedBytes": 64 * MB}
        async with running_daemon(servers, broker) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            sessions = len((await daemon.status())["sessions"])
            peak = PeakRss(daemon)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(peak.run)
                async with connect(daemon, ["m"], reads=False) as hog:
                    call = {"name": "payload", "arguments": {"size": MB}}
                    await hog.send(
                        *[
                            {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call}
                            for i in range(1100)
                        ]
                    )
                    await _session_count_falls_to(daemon, sessions, within=40)
                    await _reaches_eof(hog, within=10)
                nursery.cancel_scope.cancel()
            await daemon.recovers(before, within=10)
            grown = (peak.peak - before.rss) / MB
            assert grown < 400, f"the daemon's RSS grew by {grown:.0f} MB for one client"
        watcher.check()


async def _session_count_falls_to(daemon: Any, count: int, *, within: float) -> None:
    with trio.move_on_after(within):
        while len((await daemon.status())["sessions"]) > count:
            await trio.sleep(0.1)
        return
    raise AssertionError(f"the client that never reads was not disconnected in {within} s")


async def _reaches_eof(client: Any, *, within: float) -> None:
    """Read what the kernel still holds for it: the daemon's side must be closed."""
    with trio.move_on_after(within):
        while not client.eof:
            await client.read_some()
        return
    raise AssertionError("the daemon disconnected the session but its socket never reached EOF")


@pytest.mark.parametrize("second", ["b__echo", "a__echo"], ids=["two-servers", "one-server"])
async def test_an_id_in_flight_is_not_reused(second: str) -> None:
    """Id 7 to a slow tool of server a, then id 7 again (to b, or to a) while it runs."""
    with trio.fail_after(30):
        servers = {"a": demo_server(), "b": demo_server(), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            async with connect(daemon) as client:  # aggregated: a and b both
                await _duplicate(client, 7, second)
                assert await client.call("a__echo", {"text": "after"}) == "after"
                assert len(client.responses[id_key(7)]) == 1, client.responses[id_key(7)]
            await daemon.recovers(before)
        watcher.check()


async def _duplicate(client: Any, id: int, second: str) -> None:
    """Id ``id`` to a__slow (1 s), then again to ``second`` while the first is in flight."""
    slow = {"name": "a__slow", "arguments": {"seconds": 1, "steps": 1}}
    again = {"name": second, "arguments": {"text": "again"}}
    refused = len(client.errors_without_id()) + 1
    await client.send(
        {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": slow},
        {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": again},
    )
    await client.wait_until(
        lambda: len(client.errors_without_id()) >= refused,
        0.9,  # before the slow call ends: the refusal comes at once
        lambda: (
            f"no -32600 with id null for the second id {id}; to id {id}: "
            f"{client.responses[id_key(id)]}"
        ),
    )
    error = client.errors_without_id()[-1]["error"]
    assert error["code"] == INVALID_REQUEST and error.get("data") == {"id": id}, error
    answer = await client.response(id, within=5)
    assert answer["result"]["content"][0]["text"] == "done after 1 steps", answer


async def test_garbage_invalid_utf8_and_a_20_mb_line_get_their_errors() -> None:
    with trio.fail_after(30):
        async with running_daemon({"demo": demo_server()}) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            async with connect(daemon, ["demo"]) as client:
                huge = b'{"jsonrpc":"2.0","id":"bad-2","method":"ping","params":{"x":"'
                cases = [
                    (b"this is not json {", PARSE_ERROR),
                    (
                        b'{"jsonrpc":"2.0","id":"bad-1","method":"ping","params":{"x":"\xff\xfe"}}',
                        PARSE_ERROR,
                    ),
                    (b"42", INVALID_REQUEST),
                    (huge + b"x" * (20 * MB) + b'"}}', INVALID_REQUEST),
                ]
                for count, (line, code) in enumerate(cases, 1):
                    await client.send(line)
                    await client.wait_until(
                        lambda count=count: len(client.errors_without_id()) >= count,
                        10,
                        f"no error for {line[:40]!r}",
                    )
                    assert client.errors_without_id()[-1]["error"]["code"] == code, line[:40]
                assert await client.call("echo", {"text": "fine"}) == "fine"
                assert (
                    not client.responses[id_key("bad-1")] and not client.responses[id_key("bad-2")]
                )
            await daemon.recovers(before)
        watcher.check()
