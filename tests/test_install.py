"""``mcpbroker install`` / ``uninstall`` / ``import`` (#15.4) on real host files.

Each host's fixture (tests/fixtures/hosts/CLIENT/) is a realistic config
file: several servers, env, a disabled entry, entries the broker cannot take
(a ``${...}`` variable, an http server), comments where the host allows
them. The commands run as subprocesses in a temporary HOME, on a copy, with
a broker config that already has servers (``broker-config.json``: one the
host has too, one of the same name that runs another way). What they write
is compared with the expected files beside the fixture (``@MCPBROKER@``
stands for the absolute path of the ``mcpbroker`` under test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from cli import hosts
from cli.jsonedit import Delete, EditError, Set, apply_edits
from tests.conftest import MCPBROKER, REPO, demo_server, running_daemon

FIXTURES = REPO / "tests" / "fixtures" / "hosts"
FILES = {
    "claude-desktop": "claude_desktop_config.json",
    "claude-code": ".claude.json",
    "cursor": "mcp.json",
    "vscode": "mcp.json",
    "windsurf": "mcp_config.json",
}
CLIENTS = sorted(FILES)
PLACEHOLDER = "@MCPBROKER@"


class Home:
    """A temporary HOME with one host's file and a broker config."""

    def __init__(self, root: Path, client: str) -> None:
        self.root = root
        self.client = client
        env = {"XDG_CONFIG_HOME": str(root / ".config")}
        self.host_file = Path(hosts.host_path(client, str(root), env, "Linux"))
        self.config = root / ".config" / "mcpbroker" / "config.json"
        self.original = (FIXTURES / client / FILES[client]).read_bytes()
        self.host_file.parent.mkdir(parents=True, exist_ok=True)
        self.host_file.write_bytes(self.original)
        self.config.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / "broker-config.json", self.config)

    def run(
        self, *args: str, check: bool = True, socket: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("MCPBROKER_CONFIG", "CLAUDE_CONFIG_DIR", "MCPBROKER_SOCKET")
        }
        env.update(HOME=str(self.root), XDG_CONFIG_HOME=str(self.root / ".config"))
        if socket is not None:
            env["MCPBROKER_SOCKET"] = socket
        result = subprocess.run(
            [MCPBROKER, *args], env=env, capture_output=True, text=True, timeout=60
        )
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def snapshot(self) -> dict[str, bytes]:
        return {
            str(path.relative_to(self.root)): path.read_bytes()
            for path in sorted(self.root.rglob("*"))
            if path.is_file()
        }


def expected(client: str, name: str) -> str:
    command = json.dumps(MCPBROKER)[1:-1]
    return (FIXTURES / client / name).read_text().replace(PLACEHOLDER, command)


@pytest.fixture(params=CLIENTS)
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Home:
    return Home(tmp_path, request.param)


def test_install_moves_the_servers_and_points_the_host_at_the_broker(home: Home) -> None:
    result = home.run("install", "--client", home.client)
    assert home.host_file.read_text() == expected(home.client, "expected-host.json")
    assert home.config.read_text() == expected(home.client, "expected-config.json")
    backups = list(home.host_file.parent.glob(home.host_file.name + ".mcpbroker-backup-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == home.original
    assert f"backup of {home.host_file}: {backups[0]}" in result.stdout
    # The daemon takes the merged config as it is.
    from broker.config import load_config

    assert not load_config(home.config).warnings


def test_uninstall_restores_the_host_file_byte_for_byte(home: Home) -> None:
    home.run("install", "--client", home.client)
    config_after_install = home.config.read_bytes()
    home.run("uninstall", "--client", home.client)
    assert home.host_file.read_bytes() == home.original
    # The servers stay in the broker's config: nothing is lost.
    assert home.config.read_bytes() == config_after_install
    again = home.run("uninstall", "--client", home.client, check=False)
    assert again.returncode == 1 and "no install into" in again.stderr


def test_dry_run_shows_the_diffs_and_writes_nothing(home: Home) -> None:
    before = home.snapshot()
    result = home.run("install", "--client", home.client, "--dry-run")
    assert home.snapshot() == before
    host_before = home.original.decode()
    host_after = expected(home.client, "expected-host.json")
    assert _diff(str(home.host_file), host_before, host_after) in result.stdout
    config_before = (FIXTURES / "broker-config.json").read_text()
    config_after = expected(home.client, "expected-config.json")
    assert _diff(str(home.config), config_before, config_after) in result.stdout
    home.run("install", "--client", home.client)
    before = home.snapshot()
    result = home.run("uninstall", "--client", home.client, "--dry-run")
    assert home.snapshot() == before
    assert _diff(str(home.host_file), host_after, host_before) in result.stdout


def _diff(path: str, before: str, after: str) -> str:
    from cli.install import diff

    text = diff(path, before, after)
    assert text
    return text


def test_installing_again_changes_nothing(home: Home) -> None:
    home.run("install", "--client", home.client)
    before = home.snapshot()
    result = home.run("install", "--client", home.client)
    assert "already installed" in result.stdout
    assert home.snapshot() == before


@pytest.mark.parametrize("client", ["cursor"])
def test_uninstall_refuses_a_changed_file_unless_forced(tmp_path: Path, client: str) -> None:
    home = Home(tmp_path, client)
    home.run("install", "--client", client)
    edited = home.host_file.read_text().replace('"playwright"', '"playwright-2"')
    home.host_file.write_text(edited)
    refused = home.run("uninstall", "--client", client, check=False)
    assert refused.returncode == 1
    assert "changed since `mcpbroker install`" in refused.stderr and "--force" in refused.stderr
    assert home.host_file.read_text() == edited
    home.run("uninstall", "--client", client, "--force")
    assert home.host_file.read_bytes() == home.original
    # The edited file was kept too.
    saved = [
        path.read_text()
        for path in home.host_file.parent.glob("mcp.json.mcpbroker-backup-*")
        if path.read_bytes() != home.original
    ]
    assert saved == [edited]


def test_aggregate_writes_one_entry_for_every_server(tmp_path: Path) -> None:
    home = Home(tmp_path, "vscode")
    home.run("install", "--client", "vscode", "--aggregate")
    assert home.host_file.read_text() == expected("vscode", "expected-aggregate.json")
    home.run("uninstall", "--client", "vscode")
    assert home.host_file.read_bytes() == home.original


def test_url_points_the_host_at_the_http_listener(tmp_path: Path) -> None:
    home = Home(tmp_path, "windsurf")
    home.run("install", "--client", "windsurf", "--url", "http://127.0.0.1:8765")
    servers = json.loads(home.host_file.read_text())["mcpServers"]
    assert servers["filesystem"] == {
        "serverUrl": "http://127.0.0.1:8765/mcp/filesystem",
        "disabledTools": ["move_file"],
    }
    assert servers["git"] == {"serverUrl": "http://127.0.0.1:8765/mcp/git", "disabled": True}
    refused = Home(tmp_path / "desktop", "claude-desktop")
    result = refused.run("install", "--client", "claude-desktop", "--url", "http://x", check=False)
    assert result.returncode == 1 and "Claude Desktop has no entries by URL" in result.stderr
    assert refused.host_file.read_bytes() == refused.original


def test_a_config_elsewhere_is_passed_to_the_shims(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor")
    other = tmp_path / "elsewhere" / "broker.json"
    home.run("install", "--client", "cursor", "--config", str(other))
    entry = json.loads(home.host_file.read_text())["mcpServers"]["playwright"]
    assert entry["args"] == ["connect", "playwright", "--config", str(other)]
    assert "playwright" in json.loads(other.read_text())["mcpServers"]


def test_a_missing_host_file_is_a_clear_error(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor")
    home.host_file.unlink()
    result = home.run("install", "--client", "cursor", check=False)
    assert result.returncode == 1
    assert f"no Cursor config at {home.host_file}: nothing to install" in result.stderr


def test_import_merges_a_servers_file_into_the_broker_config(tmp_path: Path) -> None:
    home = Home(tmp_path, "vscode")
    before = home.snapshot()
    dry = home.run("import", str(home.host_file), "--dry-run")
    assert home.snapshot() == before and '+    "git": {' in dry.stdout
    result = home.run("import", str(home.host_file))
    servers = json.loads(home.config.read_text())["mcpServers"]
    assert list(servers) == ["github", "memory", "git", "fetch", "memory-imported", "time"]
    assert servers["time"]["disabled"] is True
    assert "'memory' (servers) as 'memory-imported' (the name was taken)" in result.stdout
    assert "not imported: 'perplexity' (servers) uses ${...} variables" in result.stdout
    assert home.host_file.read_bytes() == home.original  # import leaves the file alone
    again = home.run("import", str(home.host_file))
    assert json.loads(home.config.read_text())["mcpServers"] == servers
    assert "already there: 'git' (servers) (as 'git')" in again.stdout


# -- the rules, without files --------------------------------------------------------------


def test_host_paths_on_linux_and_macos() -> None:
    linux = {"XDG_CONFIG_HOME": "/home/me/.config"}
    assert hosts.host_path("claude-desktop", "/home/me", linux, "Linux") == (
        "/home/me/.config/Claude/claude_desktop_config.json"
    )
    assert hosts.host_path("claude-desktop", "/Users/me", {}, "Darwin") == (
        "/Users/me/Library/Application Support/Claude/claude_desktop_config.json"
    )
    assert (
        hosts.host_path("vscode", "/home/me", {}, "Linux") == "/home/me/.config/Code/User/mcp.json"
    )
    assert hosts.host_path("vscode", "/Users/me", {}, "Darwin") == (
        "/Users/me/Library/Application Support/Code/User/mcp.json"
    )
    assert hosts.host_path("claude-code", "/home/me", {}, "Linux") == "/home/me/.claude.json"
    assert hosts.host_path("claude-code", "/h", {"CLAUDE_CONFIG_DIR": "/c"}, "Linux") == (
        "/c/.claude.json"
    )
    assert hosts.host_path("cursor", "/Users/me", {}, "Darwin") == "/Users/me/.cursor/mcp.json"
    assert hosts.host_path("windsurf", "/home/me", {}, "Linux") == (
        "/home/me/.codeium/windsurf/mcp_config.json"
    )


def test_merge_renames_a_clash_deterministically_and_reuses_the_same_server() -> None:
    existing = {
        "db": {"command": "pg", "args": ["a"]},
        "db-cursor": {"command": "pg", "args": ["c"]},
    }
    incoming = [
        ((("mcpServers",)), "db", {"command": "pg", "args": ["a"], "type": "stdio"}),
        (("projects", "/b", "mcpServers"), "db", {"command": "pg", "args": ["b"]}),
        (("projects", "/c", "mcpServers"), "db", {"command": "pg", "args": ["c"]}),
        (("projects", "/d", "mcpServers"), "db", {"command": "pg", "args": ["d"]}),
        (
            ("projects", "/e", "mcpServers"),
            "db",
            {"command": "pg", "args": ["a"], "disabled": True},
        ),
    ]
    merged = hosts.merge(existing, incoming, "cursor")
    assert [merged.names[(block, name)] for block, name, _ in incoming] == [
        "db",  # the same server: reused
        "db-cursor-2",  # db and db-cursor are other servers
        "db-cursor",  # the same as db-cursor
        "db-cursor-3",
        "db-cursor-4",  # disabled is not the same as enabled
    ]
    assert list(merged.added) == ["db-cursor-2", "db-cursor-3", "db-cursor-4"]
    assert merged.added["db-cursor-4"]["disabled"] is True


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"command": "x", "env": {"K": "${input:k}"}}, "uses ${...} variables"),
        ({"command": "x", "envFile": "/a/.env"}, "does not read (envFile)"),
        ({"type": "http", "url": "https://a/mcp"}, "cannot reach yet (https://a/mcp)"),
        ({"serverUrl": "https://a/sse"}, "cannot reach yet"),
        ({"args": ["x"]}, 'needs exactly one of "command" (stdio) or "url"'),
        ({"command": "/opt/venv/bin/mcpbroker", "args": ["connect", "x"]}, "already goes through"),
        ("npx", "is not an object"),
    ],
)
def test_entries_the_broker_cannot_take_stay_in_the_host(entry: object, why: str) -> None:
    reason = hosts.why_kept("name", entry)
    assert reason is not None and why in reason


def test_entries_the_broker_takes() -> None:
    for entry in (
        {"command": "npx", "args": ["-y", "x"], "env": {"K": "v"}, "disabled": True},
        {"type": "stdio", "command": "uvx", "args": ["x"], "autoApprove": ["read"]},
        {"serverUrl": "wss://example.com/mcp"},
    ):
        assert hosts.why_kept("name", entry) is None


def test_edits_keep_comments_and_layout() -> None:
    head = '// top\n{\n  "servers": {\n    // one\n    "a": {"command": "x"}, // a\n'
    text = head + '    "b": 1\n  }\n}\n'
    assert apply_edits(text, [Set(("servers", "a"), {"command": "y"})]) == text.replace(
        '{"command": "x"}', '{"command": "y"}'
    )
    assert apply_edits(text, [Delete(("servers", "b")), Set(("servers", "c"), 2)]) == (
        head + '    "c": 2\n  }\n}\n'
    )
    assert apply_edits('{\n\t"x": 1\n}', [Set(("mcpServers", "s"), {"command": "c"})]) == (
        '{\n\t"x": 1,\n\t"mcpServers": {\n\t\t"s": {\n\t\t\t"command": "c"\n\t\t}\n\t}\n}'
    )


def test_servers_only_puts_the_entries_back_into_a_file_the_host_rewrote(tmp_path: Path) -> None:
    home = Home(tmp_path, "claude-code")
    home.run("install", "--client", "claude-code")
    # Claude Code rewrites ~/.claude.json as it runs; here it counted a start
    # and the user added a server by hand.
    data = json.loads(home.host_file.read_text())
    data["numStartups"] = 43
    data["mcpServers"]["added-later"] = {"type": "stdio", "command": "uvx", "args": ["x"]}
    home.host_file.write_text(json.dumps(data, indent=2))
    refused = home.run("uninstall", "--client", "claude-code", check=False)
    assert refused.returncode == 1 and "--servers-only" in refused.stderr
    home.run("uninstall", "--client", "claude-code", "--servers-only")
    want = json.loads(home.original)
    want["numStartups"] = 43
    want["mcpServers"]["added-later"] = {"type": "stdio", "command": "uvx", "args": ["x"]}
    assert json.loads(home.host_file.read_text()) == want


def test_aggregate_then_servers_only_removes_the_aggregate_entry(tmp_path: Path) -> None:
    home = Home(tmp_path, "vscode")
    home.run("install", "--client", "vscode", "--aggregate")
    home.host_file.write_text(home.host_file.read_text().replace("// MCP", "// My MCP"))
    home.run("uninstall", "--client", "vscode", "--servers-only")
    text = home.host_file.read_text()
    assert text.startswith("// My MCP servers") and '"mcpbroker"' not in text
    import json5

    assert json5.loads(text) == json5.loads(home.original.decode())


def test_a_symlinked_host_file_stays_a_symlink(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor")
    dotfiles = tmp_path / "dotfiles" / "cursor-mcp.json"
    dotfiles.parent.mkdir()
    home.host_file.rename(dotfiles)
    home.host_file.symlink_to(dotfiles)
    home.run("install", "--client", "cursor")
    assert home.host_file.is_symlink() and '"connect"' in dotfiles.read_text()
    home.run("uninstall", "--client", "cursor")
    assert home.host_file.is_symlink() and dotfiles.read_bytes() == home.original


@pytest.mark.parametrize("servers_only", [False, True])
def test_uninstall_after_a_second_install_gives_back_what_was_there_before_the_first(
    tmp_path: Path, servers_only: bool
) -> None:
    """An install over an earlier one (a server added since) recorded only its
    own backup, which already pointed at the broker: uninstall left the
    broker's entries in, and the first backup was forgotten. Each backup is
    kept; uninstall gives back the original's entries and the one added
    since, and none of the broker's."""
    home = Home(tmp_path, "cursor")
    home.run("install", "--client", "cursor")
    fresh = json.loads(home.host_file.read_text())
    fresh["mcpServers"]["new"] = {"command": "uvx", "args": ["new-server"]}  # added since
    home.host_file.write_text(json.dumps(fresh, indent=2))
    home.run("install", "--client", "cursor")
    result = home.run(
        "uninstall", "--client", "cursor", *(["--servers-only"] if servers_only else [])
    )
    want = json.loads(home.original)
    want["mcpServers"]["new"] = {"command": "uvx", "args": ["new-server"]}
    assert json.loads(home.host_file.read_text()) == want
    assert "mcpbroker-backup" in result.stdout


def test_a_second_aggregate_install_adds_no_second_aggregate_entry(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor")
    home.run("install", "--client", "cursor", "--aggregate")
    fresh = json.loads(home.host_file.read_text())
    fresh["mcpServers"]["new"] = {"command": "uvx", "args": ["new-server"]}  # added since
    home.host_file.write_text(json.dumps(fresh, indent=2))
    home.run("install", "--client", "cursor", "--aggregate")
    servers = json.loads(home.host_file.read_text())["mcpServers"]
    assert sorted(servers) == ["mcpbroker", "notion", "stripe"]
    assert servers["mcpbroker"]["args"] == ["connect"]
    assert "new" in json.loads(home.config.read_text())["mcpServers"]


def test_a_second_aggregate_install_with_a_config_elsewhere_adds_no_second_entry(
    tmp_path: Path,
) -> None:
    """(The aggregate entry ends with --config FILE then: it was not found,
    and a second one, mcpbroker-2, added: every tool twice.)"""
    home = Home(tmp_path, "cursor")
    other = str(tmp_path / "elsewhere" / "broker.json")
    home.run("install", "--client", "cursor", "--aggregate", "--config", other)
    fresh = json.loads(home.host_file.read_text())
    fresh["mcpServers"]["new"] = {"command": "uvx", "args": ["new-server"]}
    home.host_file.write_text(json.dumps(fresh, indent=2))
    home.run("install", "--client", "cursor", "--aggregate", "--config", other)
    servers = json.loads(home.host_file.read_text())["mcpServers"]
    assert sorted(servers) == ["mcpbroker", "notion", "stripe"]
    assert servers["mcpbroker"]["args"] == ["connect", "--config", other]


@pytest.mark.parametrize("base", ["127.0.0.1:8765", "not a url", "ftp://x/"])
def test_a_url_that_is_not_http_is_refused_before_anything_is_written(
    tmp_path: Path, base: str
) -> None:
    """(It was written into the host's file, its servers moved out of it.)"""
    home = Home(tmp_path, "windsurf")
    before = home.snapshot()
    result = home.run("install", "--client", "windsurf", "--url", base, check=False)
    assert result.returncode == 1 and "--url needs the base URL" in result.stderr
    assert home.snapshot() == before


def test_a_crlf_host_file_keeps_its_line_ends(tmp_path: Path) -> None:
    """(Every CRLF was turned into LF, lines install had no reason to touch too.)"""
    home = Home(tmp_path, "cursor")
    home.host_file.write_bytes(home.original.replace(b"\n", b"\r\n"))
    original = home.host_file.read_bytes()
    home.run("install", "--client", "cursor")
    installed = home.host_file.read_bytes()
    assert installed.count(b"\n") == installed.count(b"\r\n") > 0  # (the new entries too)
    home.run("uninstall", "--client", "cursor")
    assert home.host_file.read_bytes() == original


@pytest.mark.parametrize("record", ['"not an object"', '{"installed": "x"}'])
def test_a_record_install_did_not_write_is_a_message_not_a_traceback(
    tmp_path: Path, record: str
) -> None:
    home = Home(tmp_path, "cursor")
    records = home.config.parent / "installs.json"
    records.write_text(f'{{"hosts": {{"{home.host_file}": {record}}}}}')
    result = home.run("uninstall", "--client", "cursor", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "is not one mcpbroker wrote" in result.stderr


async def test_install_says_a_running_daemon_needs_a_restart(
    tmp_path: Path, socket_path: str
) -> None:
    home = Home(tmp_path, "cursor")
    async with running_daemon({"demo": demo_server()}, socket_path):
        result = await trio.to_thread.run_sync(
            lambda: home.run("install", "--client", "cursor", socket=socket_path)
        )
    assert f"a daemon (pid {os.getpid()}) is running with the config it started with" in (
        result.stdout
    )
    # With no daemon, nothing is said.
    again = Home(tmp_path / "again", "cursor")
    quiet = again.run("install", "--client", "cursor", socket=socket_path)
    assert "a daemon" not in quiet.stdout


def test_a_host_file_with_comments_is_read_and_they_are_kept(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor")
    text = "// mine\n" + home.original.decode()
    home.host_file.write_text(text)
    home.run("install", "--client", "cursor")
    assert home.host_file.read_text() == "// mine\n" + expected("cursor", "expected-host.json")
    home.host_file.write_text('{"mcpServers": {"a": ')
    home.run("uninstall", "--client", "cursor", "--force")
    assert home.host_file.read_text() == text
    home.host_file.write_text('{"mcpServers": {"a": ')
    broken = home.run("install", "--client", "cursor", check=False)
    assert broken.returncode == 1
    assert f"{home.host_file} is not valid JSON (even with comments)" in broken.stderr


def test_a_host_file_giving_mcpservers_twice_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """(Install moved the last block's servers, which the host reads, but
    pointed the first block's at the broker: the host went on running them
    itself. Found by probing.)"""
    home = Home(tmp_path, "cursor")
    home.host_file.write_text(
        '{"mcpServers": {"x": {"command": "python3"}}, "mcpServers": {"y": {"command": "ls"}}}'
    )
    before = home.snapshot()
    result = home.run("install", "--client", "cursor", check=False)
    assert result.returncode == 1
    assert (
        f'{home.host_file}: "mcpServers" is given 2 times in the top level (a host reads only '
        "the last): remove the others, then run this again"
    ) in result.stderr
    assert home.snapshot() == before
    with pytest.raises(EditError, match=r'"a" is given 2 times in servers'):
        apply_edits('{"servers": {"a": 1, "a": 2}}', [Delete(("servers", "a"))])
