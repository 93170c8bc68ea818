"""The rules of the broker, with no I/O: framing, JSON-RPC, lifecycle, id maps.

Everything in this package is synchronous and deterministic. It never awaits,
never opens a socket and never sleeps; the actors in ``actors/`` feed it
messages and carry out what it returns.
"""
