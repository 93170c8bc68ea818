"""End to end: the broker as the client the MCP conformance suite tests.

``@modelcontextprotocol/conformance`` (npm; tests/nodejs.py installs it) runs
each client scenario's mock server and checks what its client sends: here
the broker, driven by the official SDK client through the shim
(tests/conformance_client.py). The 2026-07-28 scenarios cover the broker's
side of a modern server's wire (the ``MCP-Protocol-Version``, ``Mcp-Method``,
``Mcp-Name`` and ``Mcp-Param-*`` headers, ``_meta`` on every request, the
retry of an ``input_required`` call with ``requestState`` echoed), with a
modern client and, bridged, with a legacy one; the 2025-11-25 ones, the
legacy wire (SSE retries, elicitation defaults). The authorization scenarios
run ``mcpbroker auth`` first, the driver its browser (the suite's
authorization server grants at once): discovery, registration, the token
request's client authentication, RFC 9207's ``iss`` and RFC 8414's issuer
checks. Results, those not run (step-up, CIMD, the extensions), and the
server scenarios run by hand: docs/conformance.md.
"""

from __future__ import annotations

import os
import sys

import pytest
import trio

from tests.conftest import REPO
from tests.nodejs import node_tools

MODERN = [
    "tools_call",
    "request-metadata",
    "sep-2322-client-request-state",
    "http-standard-headers",
    "http-custom-headers",
    "http-invalid-tool-headers",
    "json-schema-ref-no-deref",
    "json-schema-2020-12-preservation",
]
BRIDGED = ["tools_call", "sep-2322-client-request-state", "http-custom-headers"]
LEGACY = [
    "initialize",
    "tools_call",
    "elicitation-sep1034-client-defaults",
    "sse-retry",
    "json-schema-2020-12-preservation",
]
AUTH_LEGACY = [
    "auth/metadata-default",
    "auth/pre-registration",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/scope-from-www-authenticate",
]
AUTH_MODERN = [
    "auth/resource-mismatch",
    "auth/metadata-issuer-mismatch",
    "auth/iss-supported",
    "auth/iss-supported-missing",
    "auth/iss-wrong-issuer",
    "auth/iss-normalized",
    "auth/offline-access-scope",
]
RUNS = (
    [("2026-07-28", s, False) for s in MODERN + AUTH_MODERN]
    + [("2026-07-28", s, True) for s in BRIDGED]
    + [("2025-11-25", s, False) for s in LEGACY + AUTH_LEGACY]
)


@pytest.mark.parametrize(("revision", "scenario", "bridged"), RUNS)
async def test_the_broker_passes_the_suites_client_scenario(
    revision: str, scenario: str, bridged: bool, tmp_path: object
) -> None:
    tools = node_tools()
    command = f"{sys.executable} -m tests.conformance_client"
    argv = [tools.node, tools.conformance, "client", "--command", command]
    argv += ["--scenario", scenario, "--spec-version", revision, "-o", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if bridged:
        env["MCP_CONFORMANCE_BRIDGE"] = "1"
    with trio.fail_after(90):
        done = await trio.run_process(
            argv, cwd=str(REPO), env=env, capture_stdout=True, capture_stderr=True, check=False
        )
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0 and "OVERALL: PASSED" in out, out[-3000:]
    assert "FAILURE" not in out, out[-3000:]
