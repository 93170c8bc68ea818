"""A prototype shim: one thread, ``poll``, no ``socket``/``threading`` import.

Not what hosts run (that is ``mcpbroker connect``, cli/shim.py, which took
this shape in commit 01c988c); the harness runs it instead of the real shim
when ``MCPBROKER_BENCH_SHIM=prototype`` (or ``prototype-S``: without
``site``, to measure the launcher proposed in benchmarks/README.md):
``python benchmarks/prototype_shim.py SOCKET SERVER``. It connects to the
daemon's socket with ``_socket`` (the C module: importing ``socket`` pulls in
``enum``, ``selectors`` and more), sends the hello, and copies stdin to the
socket and the socket to stdout from one thread woken by ``poll``: no second
thread, no GIL hand-offs between threads, one wake-up per batch of data.
"""

import _socket
import os
import select
import sys

CHUNK = 256 * 1024


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(socket_path: str, server: str) -> int:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.connect(socket_path)
    sock.sendall(('{"mcpbroker":{"servers":["' + server + '"]}}\n').encode())
    sock_fd, stdin, stdout = sock.fileno(), 0, 1
    poller = select.poll()
    poller.register(stdin, select.POLLIN)
    poller.register(sock_fd, select.POLLIN)
    stdin_open = True
    while True:
        for fd, _ in poller.poll():
            if fd == stdin:
                data = os.read(stdin, CHUNK)
                if data:
                    sock.sendall(data)  # blocking: the daemon always reads
                else:
                    stdin_open = False
                    poller.unregister(stdin)
                    sock.shutdown(_socket.SHUT_WR)
            else:
                data = sock.recv(CHUNK)
                if not data:
                    return 0 if not stdin_open else 1
                _write_all(stdout, data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
