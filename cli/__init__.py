"""The ``mcpbroker`` command line, the stdio shim and the status client.

Not actors: short-lived programs that talk to the daemon. This package's
``__init__`` imports nothing, so that ``mcpbroker connect`` (``cli.shim``)
loads only the standard library.
"""
