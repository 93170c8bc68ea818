"""Prototypes of the proposed hot-path changes, as monkeypatches, to measure them first.

Not used by the daemon. ``python -m benchmarks.prototype serve --config ...``
runs ``mcpbroker serve`` with the patches named in ``$MCPBROKER_PATCHES``
(comma-separated, or ``all``) applied to the actors' private methods, and
``python -m benchmarks.prototype compare`` runs the harness's loads against
the daemon with each patch set in turn. Each patch is the smallest form of one
proposal in benchmarks/README.md ("Proposed changes"); the real change belongs
in the actor's own code, written properly. The patches follow the code as it
was when they were written and may stop applying as it moves on.

- ``nowait``: channel sends and socket/pipe I/O try the non-blocking call
  first and wait only when it would block (trio's ``send``, ``send_all`` and
  ``receive_some`` always yield to the scheduler once, even when they did not
  have to wait, so each hop costs a pass of the run loop and an epoll_wait);
  a task still yields every 16 passes that did not wait, for fairness.
- ``framing``: ``LineFramer.feed`` splits a chunk that holds only whole lines
  with one ``bytes.split`` instead of a Python loop per line, and joins a
  long line's pieces once instead of growing a bytearray and copying it out.
- ``pipes``: the server's stdout and stdin pipes are enlarged to 1 MiB
  (``F_SETPIPE_SZ``), so a 1 MiB result is one read instead of sixteen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from typing import Any

import trio

F_SETPIPE_SZ = 1031
PIPE_SIZE = 1024 * 1024
FAIR_EVERY = 16


class NowaitFd:
    """A stream over a non-blocking fd that yields only when it must (or every 16 passes)."""

    def __init__(self, stream: Any, fd: int) -> None:
        self._stream = stream
        self._fd = fd
        self._passes = 0

    async def _fair(self) -> None:
        self._passes += 1
        if self._passes >= FAIR_EVERY:
            self._passes = 0
            await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while True:
            try:
                data = os.read(self._fd, max_bytes or 65536)
            except BlockingIOError:
                self._passes = 0
                await trio.lowlevel.wait_readable(self._fd)
                continue
            except OSError:
                return b""
            await self._fair()
            return data

    async def send_all(self, data: bytes) -> None:
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            await self._stream.send_all(memoryview(data)[sent:])
        else:
            await self._fair()

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def patch_nowait() -> None:
    from actors import daemon, session, upstream

    async def send(self: Any, item: Any) -> None:
        try:
            self._inbox_send.send_nowait(item)
        except trio.WouldBlock:
            await self._inbox_send.send(item)

    async def reply(self: Any, message: Any) -> None:
        try:
            self._outbox_send.send_nowait(message)
        except trio.WouldBlock:
            await self._outbox_send.send(message)

    upstream.Upstream.send = send  # type: ignore[method-assign]
    session.Session._reply = reply  # type: ignore[method-assign]

    serve_client: Any = daemon.Daemon._serve_client

    async def serve_client_nowait(self: Any, stream: Any) -> None:
        await serve_client(self, NowaitFd(stream, stream.socket.fileno()))

    daemon.Daemon._serve_client = serve_client_nowait  # type: ignore[method-assign]

    read: Any = upstream.Upstream._read

    async def read_nowait(self: Any, stdout: Any) -> str:
        reason: str = await read(self, NowaitFd(stdout, stdout.fileno()))
        return reason

    upstream.Upstream._read = read_nowait  # type: ignore[method-assign]

    async def write(self: Any, messages: list[Any]) -> None:
        if not messages:
            return
        from broker import jsonrpc

        data = b"".join(map(jsonrpc.encode, messages))
        stdin = self._stdin
        if stdin is None:
            return
        try:
            self._write_lock.acquire_nowait()
        except trio.WouldBlock:
            sent = 0
        else:
            try:
                sent = os.write(stdin.fileno(), data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return
            finally:
                self._write_lock.release()
        if sent < len(data):
            async with self._write_lock:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stdin.send_all(memoryview(data)[sent:])

    upstream.Upstream._write = write  # type: ignore[method-assign]


def patch_framing() -> None:
    from broker import framing

    feed = framing.LineFramer.feed

    def finish(self: Any, line: bytes) -> list[Any]:
        size = len(line)
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_bytes:
            return [framing.Oversize(size)]
        return [line] if line.strip() else []

    def fast_feed(self: Any, chunk: bytes | bytearray) -> list[Any]:
        pieces: list[bytes] = self.__dict__.setdefault("_pieces", [])
        if self._skipped is not None or self._buffer:
            return feed(self, chunk)
        newline = chunk.find(b"\n")
        if newline < 0:  # part of a long line: keep the piece, copy once at its end
            pieces.append(bytes(chunk))
            if sum(map(len, pieces)) > self.max_bytes + 1:
                self._buffer += b"".join(pieces)
                pieces.clear()
                return feed(self, b"")  # the framer's own oversize handling
            return []
        out: list[Any] = []
        if pieces:
            out += finish(self, b"".join([*pieces, chunk[:newline]]))
            pieces.clear()
            chunk = chunk[newline + 1 :]
            if not chunk:
                return out
        if chunk.endswith(b"\n") and b"\r" not in chunk:
            lines = bytes(chunk).split(b"\n")
            lines.pop()
            if b"" not in lines and max(map(len, lines)) <= self.max_bytes:
                return out + lines
        return out + feed(self, chunk)

    framing.LineFramer.feed = fast_feed  # type: ignore[method-assign]


def patch_pipes() -> None:
    from actors import process

    launch = process.launch_stdio

    async def launch_big_pipes(config: Any) -> Any:
        link = await launch(config)
        streams: tuple[Any, ...] = (link.process.stdin, link.process.stdout)
        for stream in streams:
            with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: as it was
                fcntl.fcntl(stream.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
        return link

    process.launch_stdio = launch_big_pipes
    from actors import upstream

    upstream.launch_stdio = launch_big_pipes  # type: ignore[attr-defined]


PATCHES = {"nowait": patch_nowait, "framing": patch_framing, "pipes": patch_pipes}


def apply(names: str) -> list[str]:
    chosen = list(PATCHES) if names == "all" else [n for n in names.split(",") if n]
    for name in chosen:
        PATCHES[name]()
    return chosen


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        apply(os.environ.get("MCPBROKER_PATCHES", ""))
        from actors.cli import main as cli

        return cli(argv)
    if argv[:1] == ["compare"]:
        from benchmarks.prototype_compare import compare

        return compare(argv[1:])
    print("usage: python -m benchmarks.prototype serve ARGS... | compare", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
