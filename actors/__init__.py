"""Trio actors: every task, channel, socket and process of the daemon lives here.

This package's ``__init__`` imports nothing, so that the thin ``mcpbroker
connect`` shim (``cli.shim``) can import ``actors.paths`` and still load only
the standard library.
"""
