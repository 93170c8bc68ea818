"""Prototypes of proposed hot-path changes, as monkeypatches, to measure them first.

Not used by the daemon. ``python -m benchmarks.prototype serve ARGS...`` runs
``mcpbroker serve ARGS...`` with the patches named in ``$MCPBROKER_PATCHES``
(comma-separated, or ``all``) applied, and ``python -m benchmarks.prototype
compare`` runs the harness's loads against the daemon with and without them.
Each patch is the smallest form of one proposal in benchmarks/README.md; the
real change belongs in the broker's own code, written properly. Patches
follow the code as it was when they were written and may stop applying.

The first round of prototypes (no checkpoint when an fd or channel is ready,
framing with ``bytes.split``, 1 MiB server pipes) landed in the code itself
in commit 2f507a0 and was removed from here.

The second round's ``envelope`` prototype (a large answer's result left
unparsed) landed as broker/wire/envelope.py in dbeff60 and was removed too.

- ``writethrough``: when a session's writer is idle and its outbox empty, the
  upstream's reader encodes and writes a delivery to the client's socket
  itself (non-blocking; what the socket does not take goes to the writer as
  raw bytes, in order). One task wake-up less per delivery, at the price of
  an upstream task running the session's outgoing rule and touching its
  socket: the line DESIGN.md draws between actors. Measured here so the
  decision can be made on figures (benchmarks/README.md, "What is left").
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

import trio


def patch_writethrough() -> None:
    from actors import mailbox, session
    from broker.session import SessionProtocol

    original_init = session.Session.__init__
    owners: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._writer_idle = False
        owners[self._handle] = self

    def deliver_all(handle: Any, messages: list[Any]) -> None:
        owner = owners.get(handle)
        if owner is not None and owner._writer_idle and owner._io._fileno is not None:
            statistics = owner._outbox.statistics()
            if statistics.current_buffer_used == 0 and statistics.open_send_channels != 0:
                chunks: list[bytes] = []
                owner._protocol.encode_delivery(messages, chunks)
                data = b"".join(chunks)
                try:
                    owner._io._check()
                    written = os.write(owner._io._fd, data)
                except (BlockingIOError, InterruptedError):
                    written = 0
                except (OSError, trio.ClosedResourceError):
                    written = len(data)  # gone: the reader and writer will see it
                if written < len(data):
                    messages = [data[written:]]  # the rest, in order, via the writer
                else:
                    if owner._client_closed and not owner._protocol.inflight:
                        owner._drained.set()
                    return
        original_deliver_all(handle, messages)

    original_deliver_all = mailbox.SessionHandle.deliver_all

    async def write_loop(self: Any) -> None:
        while True:
            self._writer_idle = True
            try:
                delivery = await self._outbox.receive()
            except trio.EndOfChannel:
                return
            finally:
                self._writer_idle = False
            if not await self._write_out(delivery):
                return

    original_encode = SessionProtocol.encode_delivery

    def encode_delivery(self: Any, delivery: list[Any], chunks: list[Any]) -> int:
        """What the session would write, with raw bytes (the rest of a write-through) as is."""
        size = 0
        for message in delivery:
            if isinstance(message, bytes):
                chunks.append(message)
                size += len(message)
            else:
                size += original_encode(self, [message], chunks)
        return size

    session.Session.__init__ = init  # type: ignore[method-assign]
    session.Session._write_loop = write_loop  # type: ignore[method-assign]
    SessionProtocol.encode_delivery = encode_delivery  # type: ignore[method-assign]
    mailbox.SessionHandle.deliver_all = deliver_all  # type: ignore[method-assign]


PATCHES = {"writethrough": patch_writethrough}


def apply(names: str) -> list[str]:
    chosen = list(PATCHES) if names == "all" else [n for n in names.split(",") if n]
    for name in chosen:
        PATCHES[name]()
    return chosen


def main(argv: list[str]) -> int:
    import os

    if argv[:1] == ["serve"]:
        apply(os.environ.get("MCPBROKER_PATCHES", ""))
        from cli.main import main as cli

        return cli(argv)
    if argv[:1] == ["compare"]:
        from benchmarks.prototype_compare import compare

        return compare(argv[1:])
    print("usage: python -m benchmarks.prototype serve ARGS... | compare", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
