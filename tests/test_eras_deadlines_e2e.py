"""End to end: a parked call whose modern client never comes back.

The SDK test server (a legacy server) elicits in the middle of ``ask_user``;
a 2026-07-28 client over Streamable HTTP (raw ``httpx2`` POSTs, so that
nothing retries for it) gets ``input_required`` and does not come back.
Past ``broker.inputTimeout`` the broker answers the server's question with
an error and cancels the call, so the server, which then serves one client
at a time, serves the next; the retry that comes too late is told why.
"""

from __future__ import annotations

import httpx2
import orjson
import trio

from tests.conftest import running_daemon, sdk_server
from tests.test_http_modern_e2e import META, post_headers, request

ASKS = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}


async def test_a_parked_call_is_given_up_after_the_input_timeout(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon(
                {"s": sdk_server()}, socket_path, broker={"http": "127.0.0.1:0", "inputTimeout": 1}
            ) as d,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            assert d.http_url is not None
            headers = post_headers("tools/call", "s__ask_user")
            call = request("tools/call", meta=ASKS, name="s__ask_user",
                           arguments={"question": "Colour?"})  # fmt: skip
            parked = await http.post(d.http_url, content=orjson.dumps(call), headers=headers)
            result = parked.json()["result"]
            assert result["resultType"] == "input_required"
            started = trio.current_time()
            # The server serves one client at a time now (it asked one): a
            # call of another waits until the parked call ends, at inputTimeout.
            echo = request("tools/call", id=2, name="s__echo", arguments={"text": "next"})
            after = await http.post(d.http_url, content=orjson.dumps(echo),
                                    headers=post_headers("tools/call", "s__echo"))  # fmt: skip
            assert after.status_code == 200, after.text
            assert after.json()["result"]["content"][0]["text"] == "next"
            assert 0.9 < trio.current_time() - started < 10  # not the 300 s request timeout
            retry = request("tools/call", id=3, meta=ASKS, name="s__ask_user",
                            arguments={"question": "Colour?"},
                            requestState=result["requestState"],
                            inputResponses={"elicitation-1": {
                                "action": "accept", "content": {"answer": "blue"}}})  # fmt: skip
            late = await http.post(d.http_url, content=orjson.dumps(retry), headers=headers)
            assert late.status_code == 400
            error = late.json()["error"]
            assert error["code"] == -32602
            assert error["message"].startswith("requestState expired: no retry came within 1 s")
