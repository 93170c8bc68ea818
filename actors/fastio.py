"""Reads and writes that wait only when they must.

Trio's stream methods take a scheduling checkpoint on every call, waiting or
not; on the broker's hot path that is two or three extra passes of the run
loop per message (benchmarks/README.md measured it). :class:`FastIO` wraps
a socket or pipe stream and calls ``os.read``/``os.write`` on its
non-blocking descriptor directly, awaiting ``wait_readable``/``wait_writable``
only when the descriptor would block, and taking a checkpoint every
:data:`CHECKPOINT_EVERY` calls that did not wait, so a busy connection still
lets others run and still notices cancellation. A read also takes one once
:data:`CHECKPOINT_BYTES` have come in since the last: a peer flooding small
messages fills every read (256 KiB, thousands of messages, each handled
before the next read), and sixteen such reads kept every other session
waiting for a second. Small reads, the hot path, count bytes and nothing
more.

Before each system call it checks that the stream still owns the same
descriptor, so a stream closed meanwhile raises ``ClosedResourceError``
instead of touching a descriptor number the kernel may have reused. Other
streams (memory streams in tests) are used through their own methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

CHECKPOINT_EVERY = 16
CHECKPOINT_BYTES = 64 * 1024


class FastIO:
    def __init__(self, stream: trio.abc.Stream | trio.abc.SendStream | trio.abc.ReceiveStream):
        self.stream = stream
        self._fileno = _fileno_of(stream)
        self._fd = self._fileno() if self._fileno is not None else -1
        self._calls = 0
        self._unyielded = 0  # bytes read since the last checkpoint

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        if self._fileno is None:
            return await self.stream.receive_some(max_bytes)  # type: ignore[union-attr]
        while True:
            self._check()
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._fd)
                continue
            self._calls += 1  # (inline, not a call to a coroutine: this is per read)
            self._unyielded += len(data)
            if self._calls % CHECKPOINT_EVERY == 0 or self._unyielded >= CHECKPOINT_BYTES:
                self._unyielded = 0
                await trio.lowlevel.checkpoint()
            return data

    async def send_all(self, data: bytes) -> None:
        if self._fileno is None:
            await self.stream.send_all(data)  # type: ignore[union-attr]
            return
        view = memoryview(data)
        while view:
            self._check()
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self._fd)
        self._calls += 1
        if self._calls % CHECKPOINT_EVERY == 0:
            await trio.lowlevel.checkpoint()

    def send_nowait(self, data: bytes) -> int:
        """Write what the descriptor takes now, without waiting; how many bytes
        that was (0 for a stream that is not a descriptor: use :meth:`send_all`).
        Raises ``ClosedResourceError`` or ``OSError`` (a broken pipe) as a write would."""
        if self._fileno is None:
            return 0
        self._check()
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0

    def _check(self) -> None:
        assert self._fileno is not None
        if self._fileno() != self._fd:
            raise trio.ClosedResourceError("the stream was closed")


def _fileno_of(stream: object) -> Callable[[], int] | None:
    """How to ask a socket or pipe stream for its descriptor (None: not one)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno
    if isinstance(stream, trio.lowlevel.FdStream):
        return stream.fileno
    return None
