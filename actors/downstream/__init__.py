"""Downstream transports: how clients reach the daemon, one module per kind.

- :mod:`connection`: the interface a Session reads and writes through
  (:class:`connection.Connection`);
- :mod:`stream`: newline-delimited JSON over a byte stream (a unix socket
  connection; memory streams in tests);
- :mod:`unix`: the unix socket listener, its lock and its checks;
- :mod:`websocket`: the WebSocket listener (``serve --ws``) and its
  connections, one message per text frame.

A new transport is a module here that turns what it accepts into
:class:`~actors.session.Session` objects over a ``Connection``.
"""
