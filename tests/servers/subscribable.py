"""A small stdio MCP server with a subscribable resource and log messages.

Tools: ``touch`` sends ``notifications/resources/updated`` for every
subscribed URI; ``log`` sends one ``notifications/message`` at ``info`` and
one at ``error``; ``slow`` answers after ``seconds``; ``pid`` gives its pid.
Resource: ``test://sub/thing``. Each message is handled in its own thread
so that a slow call does not hold the others up.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

URI = "test://sub/thing"
_lock = threading.Lock()
_subscribed: set[str] = set()


def _write(message: dict[str, Any]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def _text(id: Any, text: str) -> None:
    _write({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})


def _tool(name: str) -> dict[str, Any]:
    props = {"seconds": {"type": "number"}} if name == "slow" else {}
    return {"name": name, "inputSchema": {"type": "object", "properties": props}}


def _call(id: Any, name: str, arguments: dict[str, Any]) -> None:
    if name == "touch":
        for uri in sorted(_subscribed):
            p = {"uri": uri}
            _write({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": p})
        _text(id, "touched")
    elif name == "log":
        for level in ("info", "error"):
            params = {"level": level, "logger": "sub", "data": f"at {level}"}
            _write({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
        _text(id, "logged")
    elif name == "slow":
        time.sleep(float(arguments.get("seconds", 1)))
        _text(id, "slept")
    else:
        _text(id, str(os.getpid()))


def _handle(message: dict[str, Any]) -> None:
    method, id, params = message.get("method"), message.get("id"), message.get("params") or {}
    if id is None:
        return
    result: Any = {}
    if method == "initialize":
        result = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}, "resources": {"subscribe": True}, "logging": {}},
            "serverInfo": {"name": "subscribable", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [_tool(n) for n in ("touch", "log", "slow", "pid")]}
    elif method == "resources/list":
        result = {"resources": [{"uri": URI, "name": "thing"}]}
    elif method == "resources/subscribe":
        _subscribed.add(params["uri"])
    elif method == "resources/unsubscribe":
        _subscribed.discard(params["uri"])
    elif method == "tools/call":
        _call(id, params.get("name"), params.get("arguments") or {})
        return
    _write({"jsonrpc": "2.0", "id": id, "result": result})


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            threading.Thread(target=_handle, args=(json.loads(line),), daemon=True).start()


if __name__ == "__main__":
    main()
