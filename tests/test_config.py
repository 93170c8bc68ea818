"""The configuration file: the mcpServers shape, strict types, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.config import (
    BrokerSettings,
    Config,
    ConfigError,
    ServerConfig,
    load_config,
    parse_config,
)
from broker.wire.frames import DEFAULT_MAX_MESSAGE_BYTES


def servers(**entries: Any) -> dict[str, Any]:
    return {"mcpServers": entries}


def stdio(**extra: Any) -> dict[str, Any]:
    return {"command": "npx", **extra}


def config_error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_good_config() -> None:
    data = {
        "$schema": "https://example.com/schema.json",
        "mcpServers": {
            "files": {
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                "env": {"DEBUG": "1"},
                "cwd": "/tmp",
            },
            "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "x"}},
        },
        "broker": {"maxMessageBytes": 4096},
    }
    assert parse_config(data) == Config(
        servers={
            "files": ServerConfig(
                command="npx",
                args=("-y", "@modelcontextprotocol/server-filesystem", "/tmp"),
                env={"DEBUG": "1"},
                cwd="/tmp",
            ),
            "remote": ServerConfig(url="https://example.com/mcp", headers={"Authorization": "x"}),
        },
        broker=BrokerSettings(max_message_bytes=4096),
        warnings=(),
    )


def test_empty_config() -> None:
    config = parse_config({})
    assert config.servers == {}
    assert config.broker.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES


def test_transport_kinds() -> None:
    config = parse_config(servers(local=stdio(), remote={"url": "http://h/mcp"}))
    local, remote = config.servers["local"], config.servers["remote"]
    assert local.command is not None and local.url is None
    assert remote.command is None and remote.url == "http://h/mcp"


def test_host_keys_accepted_without_warnings() -> None:
    entry = stdio(
        type="stdio",
        disabled=True,
        autoApprove=["x"],
        alwaysAllow=[],
        timeout=60,
        transport="stdio",
        description="d",
    )
    config = parse_config(servers(a=entry, b=stdio()))
    assert config.warnings == ()
    assert config.servers["a"].type == "stdio"
    assert config.servers["a"].disabled
    assert list(config.enabled_servers) == ["b"]


@pytest.mark.parametrize(
    ("data", "warning"),
    [
        ({"mcpServrs": {}}, "'mcpServrs'"),
        (servers(a=stdio(argz=["x"])), '"mcpServers.a.argz"'),
        ({"broker": {"maxMesageBytes": 9}}, '"broker.maxMesageBytes"'),
        # (a key that does nothing where it is: only per-session servers have a cap)
        (servers(a=stdio(maxInstances=4)), '"mcpServers.a.maxInstances"'),
        (servers(a=stdio(maxInstances=4, pool=2)), '"mcpServers.a.maxInstances"'),
    ],
)
def test_unknown_keys_are_warnings(data: dict[str, Any], warning: str) -> None:
    [message] = parse_config(data).warnings
    assert warning in message
    assert "ignored" in message


@pytest.mark.parametrize(
    ("entry", "path", "reason"),
    [
        (stdio(args="x"), "mcpServers.a.args", "list of strings"),
        (stdio(args=["x", 1]), "mcpServers.a.args", "item 1"),
        (stdio(env=[]), "mcpServers.a.env", "object of strings"),
        (stdio(env={"K": 1}), "mcpServers.a.env", "'K'"),
        (stdio(cwd=5), "mcpServers.a.cwd", "a string"),
        (stdio(disabled="yes"), "mcpServers.a.disabled", "true or false"),
        (stdio(type=5), "mcpServers.a.type", "a string"),
        (stdio(type="pigeon"), "mcpServers.a.type", "'pigeon'"),
        ({"command": 5}, "mcpServers.a.command", "a string"),
        ({"command": "  "}, "mcpServers.a.command", "empty"),
        ({"url": "u", "headers": {"A": None}}, "mcpServers.a.headers", "null"),
        ({"url": 1}, "mcpServers.a.url", "a string"),
    ],
)
def test_bad_server_entry_names_the_key(entry: dict[str, Any], path: str, reason: str) -> None:
    message = config_error(servers(a=entry))
    assert path in message
    assert reason in message


def test_several_problems_reported_together() -> None:
    message = config_error(servers(a=stdio(args="x", env=3)))
    assert "mcpServers.a.args" in message and "mcpServers.a.env" in message


@pytest.mark.parametrize(
    "entry", [{}, {"args": ["x"]}, {"command": None}, stdio(url="https://h/mcp")]
)
def test_needs_exactly_one_of_command_and_url(entry: dict[str, Any]) -> None:
    message = config_error(servers(a=entry))
    assert '"mcpServers.a"' in message
    assert "exactly one" in message


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([], "top level"),
        ("x", "top level"),
        ({"mcpServers": []}, '"mcpServers"'),
        (servers(a=3), '"mcpServers.a" must be an object'),
        (servers(a=["npx"]), '"mcpServers.a" must be an object'),
        ({"mcpServers": {"": stdio()}}, "name"),
        ({"broker": []}, '"broker" must be an object'),
        ({"broker": {"maxMessageBytes": "x"}}, "broker.maxMessageBytes"),
        ({"broker": {"maxMessageBytes": 1.5}}, "broker.maxMessageBytes"),
        ({"broker": {"maxMessageBytes": True}}, "broker.maxMessageBytes"),
        ({"broker": {"maxMessageBytes": 10}}, "at least 1024"),
    ],
)
def test_bad_shapes(data: Any, fragment: str) -> None:
    assert fragment in config_error(data)


# -- load_config -------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mcpbroker.json"
    path.write_text(text)
    return path


def test_load_config(tmp_path: Path) -> None:
    path = write(tmp_path, '{"mcpServers": {"a": {"command": "x"}}}')
    assert load_config(path).servers == {"a": ServerConfig(command="x")}
    assert load_config(str(path)).servers == {"a": ServerConfig(command="x")}


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_config_invalid_json(tmp_path: Path) -> None:
    path = write(tmp_path, '{"mcpServers": {')
    with pytest.raises(ConfigError, match="not valid JSON") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_config_bad_entry_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, '{"mcpServers": {"a": {"command": "x", "args": "y"}}}')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "mcpServers.a.args" in str(info.value)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"servers": {"files": {"type": "stdio", "command": "x"}}, "inputs": []}, '"servers"'),
        ({"mcp": {"servers": {"files": {"command": "x"}}}}, '"mcp.servers"'),
    ],
)
def test_a_vs_code_shaped_file_is_refused_with_what_to_change(
    data: dict[str, Any], where: str
) -> None:
    """Read as mcpServers it would serve nothing, silently: refused instead."""
    with pytest.raises(ConfigError, match="VS Code") as error:
        parse_config(data)
    assert where in str(error.value) and '"mcpServers"' in str(error.value)


def test_a_vs_code_section_beside_mcp_servers_is_a_warning() -> None:
    config = parse_config({"mcpServers": {"a": {"command": "x"}}, "servers": {"b": {}}})
    assert list(config.servers) == ["a"]
    assert config.warnings == ('"servers" ignored: mcpbroker reads only "mcpServers"',)


def test_the_shutdown_timeout_is_checked() -> None:
    assert parse_config({"broker": {"shutdownTimeout": 0}}).broker.shutdown_timeout == 0
    assert parse_config({}).broker.shutdown_timeout == 5.0
    with pytest.raises(ConfigError, match="shutdownTimeout"):
        parse_config({"broker": {"shutdownTimeout": -1}})


def test_the_input_timeout_is_checked() -> None:
    assert parse_config({}).broker.input_timeout == 120.0
    assert parse_config({"broker": {"inputTimeout": 30}}).broker.input_timeout == 30.0
    for bad in (0, -1):
        with pytest.raises(ConfigError, match="inputTimeout"):
            parse_config({"broker": {"inputTimeout": bad}})


def test_the_era_is_checked() -> None:
    for era in ("auto", "legacy", "modern", "per-client"):
        assert parse_config(servers(a=stdio(era=era))).servers["a"].era == era
    url = {"url": "https://h/mcp", "era": "per-client"}
    assert parse_config(servers(a=url)).servers["a"].era == "per-client"
    with pytest.raises(ConfigError, match='"per-client"'):
        parse_config(servers(a=stdio(era="both")))


def test_max_instances_is_a_bound_from_1_to_1024() -> None:
    assert parse_config(servers(a=stdio())).servers["a"].max_instances == 32
    entry = stdio(share="per-session", maxInstances=4)
    assert parse_config(servers(a=entry)).servers["a"].max_instances == 4
    for bad in (0, 1025):
        assert '"mcpServers.a.maxInstances" must be 1 to 1024' in config_error(
            servers(a=stdio(maxInstances=bad))
        )


@pytest.mark.parametrize(
    "entry",
    [
        stdio(era="per-client", share="per-session"),
        stdio(era="per-client", pool=2),
        {"url": "https://h/sse", "type": "sse", "era": "per-client"},
    ],
)
def test_per_client_eras_need_one_shared_instance_an_era(entry: dict[str, Any]) -> None:
    """ "era": "per-client" opens the server once for each era of client:
    it does not combine with the modes that open it otherwise, nor with
    HTTP+SSE, which has no modern revision."""
    assert '"mcpServers.a.era": "per-client"' in config_error(servers(a=entry))


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        (stdio(args=["a\0b"]), '"mcpServers.s.args[0]" must not contain a NUL'),
        (stdio(command="np\0x"), '"mcpServers.s.command" must not contain a NUL'),
        (stdio(cwd="/tmp\0"), '"mcpServers.s.cwd" must not contain a NUL'),
        (stdio(env={"A": "\0"}), '"mcpServers.s.env.A" must not contain a NUL'),
        (stdio(env={"NODE_OPTIONS=": "x"}), "'NODE_OPTIONS=': an environment variable's"),
        (stdio(env={"": "x"}), "has the name '': an environment variable's"),
        ({"url": "http://[::1/mcp"}, '"mcpServers.s.url" is not a valid URL'),
        ({"url": "http://h:99999/mcp"}, '"mcpServers.s.url" is not a valid URL'),
        (
            {"url": "http://h/mcp", "headers": {"Authorization": "Bearer \u2019tok\u2019"}},
            '"mcpServers.s.headers.Authorization" must be plain ASCII text',
        ),
        ({"url": "ws://h/mcp", "headers": {"X": "a\r\nB: c"}}, '"mcpServers.s.headers.X" must'),
        ({"url": "http://h/mcp", "headers": {"X Y": "a"}}, "has 'X Y', which is not a header"),
    ],
)
def test_values_a_launch_would_choke_on_are_refused(entry: dict[str, Any], fragment: str) -> None:
    # (they passed, and the daemon died when the server started: at serve or a reload)
    assert fragment in config_error(servers(s=entry))


def test_a_header_secret_is_not_shown_in_the_error() -> None:
    message = config_error(servers(s={"url": "http://h/mcp", "headers": {"X": "s3cret\u00e9"}}))
    assert "s3cret" not in message


def test_a_file_full_of_unknown_keys_gets_a_bounded_number_of_warnings() -> None:
    # (100,000 unknown keys: 100,000 warning lines, and a 4.7 MB reload answer)
    from broker.config import MAX_WARNINGS

    config = parse_config(servers(s=stdio(**{f"k{i}": 1 for i in range(1000)})))
    assert len(config.warnings) == MAX_WARNINGS + 1
    assert config.warnings[-1] == f"{1000 - MAX_WARNINGS} more warnings like these not shown"


def test_a_key_given_twice_in_an_object_is_a_warning(tmp_path: Path) -> None:
    """(The second server of a name replaced the first, and nothing said so.)"""
    path = write(
        tmp_path, '{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}, "b": '
        '{"command": "z", "env": {"K": "1", "K": "2"}}}}',
    )  # fmt: skip
    config = load_config(path)
    assert config.servers["a"] == ServerConfig(command="y")
    assert {w for w in config.warnings if "more than once" in w} == {
        "key 'a' is given more than once in an object: the last one is used",
        "key 'K' is given more than once in an object: the last one is used",
    }
    assert not [w for w in load_config(write(tmp_path, '{"mcpServers": {}}')).warnings
                if "more than once" in w]  # fmt: skip


def test_a_reload_refuses_a_named_pipe_at_once(tmp_path: Path) -> None:
    """(Read again, a named pipe nobody writes any more blocked its reader
    for good: sops exec-file writes the config once.)"""
    import os

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"is not a regular file.*restart the daemon"):
        load_config(fifo, regular_only=True)
    path = write(tmp_path, '{"mcpServers": {}}')
    assert load_config(path, regular_only=True).servers == {}


def test_a_reload_of_a_config_path_that_became_a_directory_says_so(tmp_path: Path) -> None:
    """(It was called a named pipe, with advice to restart the daemon, which
    would fail too. Found by probing.)"""
    folder = tmp_path / "config.json"
    folder.mkdir()
    with pytest.raises(ConfigError) as caught:
        load_config(folder, regular_only=True)
    assert str(caught.value) == (
        f"config file {str(folder)!r} is not a regular file: it is a directory"
    )
