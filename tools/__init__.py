"""Programs shipped beside the daemon that are not part of it: the demo MCP
server (``python -m tools.demo_server``) and the load engine of ``mcpbroker
bench`` (the command itself is cli/bench.py)."""
