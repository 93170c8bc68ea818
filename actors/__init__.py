"""Trio actors: every task, channel, socket and process of mcpbroker lives here.

This package's ``__init__`` imports nothing, so that the thin ``mcpbroker
connect`` shim (``actors.shim``) loads only the standard library.
"""
