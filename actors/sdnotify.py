"""Telling a service manager how the daemon is: systemd's ``sd_notify``
protocol, without libsystemd (docs/service.md, "Readiness").

systemd starts a ``Type=notify`` service with ``NOTIFY_SOCKET`` naming a
unix datagram socket (a path, or ``@name`` for the abstract namespace) and
waits for ``READY=1`` on it before it counts the service as started. Each
datagram is newline-separated ``KEY=VALUE`` lines: ``READY=1`` once serving,
``RELOADING=1`` with ``MONOTONIC_USEC`` when a reload begins and ``READY=1``
when it is done, ``STOPPING=1`` when shutting down, ``STATUS=`` a line for
``systemctl status``. Where no service manager asked, nothing is sent.

The variable is taken out of the environment at start, as sd_notify's
``unset_environment`` does, so the servers the daemon starts do not inherit
it (systemd would take their messages for the daemon's if it accepted them).
A message that cannot be sent is logged, never raised: the daemon serves
whether or not its manager hears.
"""

from __future__ import annotations

import socket
import time
from collections.abc import MutableMapping

from actors.logs import get_logger

NOTIFY_SOCKET = "NOTIFY_SOCKET"


class Notifier:
    """Where to tell the service manager (None: nobody asked)."""

    def __init__(self, address: str | None) -> None:
        if address is not None and address.startswith("@"):
            address = "\0" + address[1:]  # (the abstract namespace)
        self.address = address if address and address[0] in "/\0" else None
        self._complained = False

    @classmethod
    def take_from(cls, environ: MutableMapping[str, str]) -> Notifier:
        """The notifier ``environ`` asks for, its variable taken out of it."""
        return cls(environ.pop(NOTIFY_SOCKET, None))

    def ready(self, status: str) -> None:
        self.send(READY="1", STATUS=status)

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send(RELOADING="1", MONOTONIC_USEC=str(usec), STATUS="reloading the configuration")

    def stopping(self) -> None:
        self.send(STOPPING="1", STATUS="stopping")

    def send(self, **fields: str) -> None:
        if self.address is None:
            return
        message = "".join(f"{key}={value}\n" for key, value in fields.items())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)  # (a datagram or nothing: never wait on the manager)
                sock.sendto(message.encode(), self.address)
        except OSError as exc:
            if not self._complained:
                self._complained = True
                get_logger().warning(
                    "daemon.notify_failed", socket=self.address.lstrip("\0"), error=str(exc)
                )
