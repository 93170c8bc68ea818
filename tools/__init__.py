"""Programs shipped beside the daemon that are not part of it: the demo MCP
server (``python -m tools.demo_server``) and ``mcpbroker bench``."""
