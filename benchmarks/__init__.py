"""mcpbroker's benchmark harness: run it with ``python -m benchmarks`` (see README.md)."""
