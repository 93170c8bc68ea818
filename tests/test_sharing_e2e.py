"""End to end: the sharing modes, seen through the process ids that answer."""

from __future__ import annotations

import trio

from tests.conftest import running_daemon, sdk_server, shim_client, text_of


async def test_per_session_servers_give_each_client_its_own_process(socket_path: str) -> None:
    servers = {"mine": {**sdk_server(), "share": "per-session"}}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path) as daemon:
            async with (
                shim_client(socket_path, "mine") as a,
                shim_client(socket_path, "mine") as b,
            ):
                pid_a = text_of(await a.call_tool("pid", {}))
                pid_b = text_of(await b.call_tool("pid", {}))
                assert pid_a != pid_b
                assert text_of(await a.call_tool("pid", {})) == pid_a  # and it stays its own
                group = daemon.upstreams["mine"]
                assert len(group.instances()) == 3  # a's, b's, and the catalog's
                requests = group.statistics().requests
            with trio.fail_after(10):  # both sessions gone: their instances stop
                while len(group.instances()) > 1:
                    await trio.sleep(0.05)
            # (counters only go up: they went from 11 to 1 as the sessions left)
            assert group.statistics().requests >= requests >= 3


async def test_a_pool_spreads_concurrent_calls_over_its_instances(socket_path: str) -> None:
    servers = {"pool": {**sdk_server(), "pool": 2}}
    pids: list[str] = []
    with trio.fail_after(60):
        async with (
            running_daemon(servers, socket_path) as daemon,
            shim_client(socket_path, "pool") as c,
        ):

            async def call() -> None:
                pids.append(text_of(await c.call_tool("slow_pid", {"seconds": 1.0})))

            # Two at once: the second goes to the instance the first left idle.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                nursery.start_soon(call)
            sessions = daemon.upstreams["pool"].statistics().sessions
    assert len(set(pids)) == 2
    assert sessions == 1  # (not one per instance: 2)
