"""diff(old, new): what a reload adds, removes, restarts, updates; every key classified."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from broker.config import (
    BROKER_KEY_OF,
    SERVER_KEY_OF,
    BrokerSettings,
    Config,
    ServerConfig,
    parse_config,
    with_listeners,
)
from broker.configdiff import (
    BROKER_EFFECTS,
    SERVER_EFFECTS,
    ConfigDiff,
    Effect,
    diff,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SERVER_FIELDS = [field.name for field in attrs.fields(ServerConfig)]
BROKER_FIELDS = [field.name for field in attrs.fields(BrokerSettings)]

# A few values per field, so that two draws are often equal and often not.
# (A field without values here fails every property test below: add some.)
SERVER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "command": st.sampled_from([None, "npx", "uvx"]),
    "args": st.sampled_from([(), ("-y",), ("-y", "pkg"), ("pkg", "-y")]),
    "env": st.sampled_from([{}, {"A": "1"}, {"A": "2"}, {"A": "1", "B": "2"}]),
    "cwd": st.sampled_from([None, "/tmp", "/home"]),
    "url": st.sampled_from([None, "ws://localhost:1/mcp", "wss://example.com/mcp"]),
    "headers": st.sampled_from([{}, {"Authorization": "Bearer a"}]),
    "type": st.sampled_from([None, "stdio", "ws"]),
    "disabled": st.booleans(),
    "startup": st.sampled_from(["eager", "lazy"]),
    "share": st.sampled_from(["shared", "per-session"]),
    "pool": st.sampled_from([1, 2, 4]),
    "max_instances": st.sampled_from([32, 2]),
    "timeout": st.sampled_from([None, 1.0, 60.0]),
    "server_requests": st.sampled_from(["auto", "exclusive", "concurrent"]),
    "era": st.sampled_from(["auto", "legacy", "modern", "per-client"]),
    "oauth": st.sampled_from([{}, {"clientId": "c", "redirectPort": "8765"}]),
    "restart_delay": st.sampled_from([None, 0.1, 1.0]),
    "restart_max_delay": st.sampled_from([None, 5.0, 60.0]),
    "restart_attempts": st.sampled_from([None, 0, 3]),
    "ping_interval": st.sampled_from([None, 0.0, 10.0]),
    "ping_misses": st.sampled_from([None, 1, 3]),
}
BROKER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "max_message_bytes": st.sampled_from([1024, 1 << 24]),
    "separator": st.sampled_from(["__", "."]),
    "page_size": st.sampled_from([0, 10]),
    "request_timeout": st.sampled_from([1.0, 300.0]),
    "max_request_timeout": st.sampled_from([300.0, 3600.0]),
    "input_timeout": st.sampled_from([30.0, 120.0]),
    "max_queued_bytes": st.sampled_from([1 << 24, 1 << 26]),
    "max_in_flight": st.sampled_from([1, 4096]),
    "max_server_in_flight": st.sampled_from([1, 16384]),
    "max_waiting_requests": st.sampled_from([1, 1024]),
    "websocket": st.sampled_from([None, "8765", "0.0.0.0:8765"]),
    "allowed_origins": st.sampled_from([(), ("http://localhost:6274",)]),
    "allowed_hosts": st.sampled_from([(), ("box.lan",)]),
    "token_file": st.sampled_from([None, "/run/token"]),
    "http": st.sampled_from([None, "8766", "0.0.0.0:8766"]),
    "metrics": st.sampled_from([None, "9464"]),
    "audit_log": st.sampled_from([None, "/var/log/audit.jsonl"]),
    "audit_arguments": st.booleans(),
    "restart_delay": st.sampled_from([0.5, 2.0]),
    "restart_max_delay": st.sampled_from([30.0, 120.0]),
    "restart_attempts": st.sampled_from([0, 8]),
    "retry_failed_after": st.sampled_from([0.0, 600.0]),
    "ping_interval": st.sampled_from([None, 0.0, 30.0]),
    "ping_misses": st.sampled_from([1, 3]),
    "shutdown_timeout": st.sampled_from([0.0, 5.0]),
}
NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def server_configs(draw: st.DrawFn) -> ServerConfig:
    return ServerConfig(**{field: draw(SERVER_VALUES[field]) for field in SERVER_FIELDS})


@st.composite
def broker_settings(draw: st.DrawFn) -> BrokerSettings:
    return BrokerSettings(**{field: draw(BROKER_VALUES[field]) for field in BROKER_FIELDS})


@st.composite
def configs(draw: st.DrawFn) -> Config:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True))
    return Config({name: draw(server_configs()) for name in names}, draw(broker_settings()))


@st.composite
def evolved(draw: st.DrawFn, config: Config) -> Config:
    """A config near ``config``: servers kept, dropped, added, or a few keys changed."""
    servers: dict[str, ServerConfig] = {}
    for name in NAMES:
        server = config.servers.get(name)
        fate = draw(st.sampled_from(["keep", "drop", "new", "tweak", "tweak"]))
        if fate == "new" or (server is None and fate == "tweak"):
            servers[name] = draw(server_configs())
        elif server is not None and fate == "keep":
            servers[name] = server
        elif server is not None and fate == "tweak":
            fields = draw(st.lists(st.sampled_from(SERVER_FIELDS), max_size=3))
            servers[name] = attrs.evolve(
                server, **{field: draw(SERVER_VALUES[field]) for field in fields}
            )
    fields = draw(st.lists(st.sampled_from(BROKER_FIELDS), max_size=3))
    broker = attrs.evolve(config.broker, **{f: draw(BROKER_VALUES[f]) for f in fields})
    return Config(servers, broker, warnings=draw(st.sampled_from([(), ("a warning",)])))


@st.composite
def config_pairs(draw: st.DrawFn) -> tuple[Config, Config]:
    old = draw(configs())
    return old, draw(st.one_of(configs(), evolved(old)))


def differing(old: Any, new: Any) -> list[str]:
    """The fields whose values differ, computed without broker.configdiff."""
    before, after = attrs.asdict(old, recurse=False), attrs.asdict(new, recurse=False)
    return [field for field in before if before[field] != after[field]]


# -- every field is classified ------------------------------------------------


def test_every_server_field_is_classified() -> None:
    assert set(SERVER_EFFECTS) == set(SERVER_FIELDS), (
        "classify each ServerConfig field in broker/configdiff.py SERVER_EFFECTS "
        "and docs/configuration.md ('What a reload changes')"
    )
    assert SERVER_EFFECTS["disabled"] is Effect.ADD_REMOVE
    others = {effect for field, effect in SERVER_EFFECTS.items() if field != "disabled"}
    assert others <= {Effect.RESTART_SERVER, Effect.LIVE}


def test_every_broker_setting_is_classified() -> None:
    assert set(BROKER_EFFECTS) == set(BROKER_FIELDS), (
        "classify each BrokerSettings field in broker/configdiff.py BROKER_EFFECTS "
        "and docs/configuration.md ('What a reload changes')"
    )
    assert set(BROKER_EFFECTS.values()) <= {Effect.LIVE, Effect.RESTART_DAEMON}


def test_every_config_field_is_handled() -> None:
    # servers: per server; broker: per setting; warnings: not a setting (what the
    # file had that nobody reads), never a change. A new part of Config needs a
    # decision in broker/configdiff.py.
    assert [field.name for field in attrs.fields(Config)] == ["servers", "broker", "warnings"]


def test_every_field_has_its_key_in_the_file() -> None:
    assert set(SERVER_KEY_OF) == set(SERVER_FIELDS)
    assert set(BROKER_KEY_OF) == set(BROKER_FIELDS)


def documented(heading: str) -> dict[str, str]:
    """The effect column of one table of docs/configuration.md's reload section."""
    text = DOCS.read_text()
    section = text.split("## What a reload changes", 1)[1].split("\n## ", 1)[0]
    table = section.split(heading, 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z]+)` \| ([a-z /]+?) \|", table, re.MULTILINE)
    assert len(rows) == len({key for key, _ in rows}), f"a key twice under {heading}"
    return dict(rows)


def test_the_docs_say_what_the_code_does() -> None:
    servers = {SERVER_KEY_OF[f]: effect.value for f, effect in SERVER_EFFECTS.items()}
    assert documented("### `mcpServers.NAME`") == servers
    broker = {BROKER_KEY_OF[f]: effect.value for f, effect in BROKER_EFFECTS.items()}
    assert documented("### `broker`") == broker


# -- properties ------------------------------------------------------------------


@given(configs())
def test_nothing_changes_nothing(config: Config) -> None:
    assert diff(config, config).empty
    assert diff(config, attrs.evolve(config, warnings=("unknown key",))) == ConfigDiff(
        {}, (), {}, {}, ()
    )
    copy = Config(
        {name: attrs.evolve(server) for name, server in config.servers.items()},
        attrs.evolve(config.broker),
    )
    assert diff(config, copy).empty


@given(config_pairs())
def test_adds_and_removes_turn_old_names_into_new(pair: tuple[Config, Config]) -> None:
    old, new = pair
    change = diff(old, new)
    before, after = old.enabled_servers, new.enabled_servers
    assert set(change.removed) <= set(before)
    assert len(change.removed) == len(set(change.removed))
    assert not set(change.added) & set(before)
    assert (set(before) - set(change.removed)) | set(change.added) == set(after)
    assert change.added == {name: after[name] for name in change.added}
    # Both kinds of change are about servers that stay, and never the same one.
    stay = set(before) & set(after)
    assert set(change.restarted) | set(change.updated) <= stay
    assert not set(change.restarted) & set(change.updated)


@given(config_pairs())
def test_each_changed_server_key_is_reported_once(pair: tuple[Config, Config]) -> None:
    old, new = pair
    change = diff(old, new)
    before, after = old.enabled_servers, new.enabled_servers
    for name in set(before) & set(after):
        fields = differing(before[name], after[name])
        reports = [c for c in (change.restarted.get(name), change.updated.get(name)) if c]
        if not fields:
            assert not reports
            continue
        [report] = reports
        assert list(report.fields) == fields  # each once, in declaration order
        assert (report.old, report.new) == (before[name], after[name])
        assert report.keys == tuple(SERVER_KEY_OF[field] for field in fields)
        restart = any(SERVER_EFFECTS[field] is Effect.RESTART_SERVER for field in fields)
        assert (name in change.restarted) == restart


@given(config_pairs())
def test_each_changed_setting_is_reported_once(pair: tuple[Config, Config]) -> None:
    old, new = pair
    change = diff(old, new)
    fields = differing(old.broker, new.broker)
    assert [setting.field for setting in change.settings] == fields
    for setting in change.settings:
        assert setting.old == getattr(old.broker, setting.field)
        assert setting.new == getattr(new.broker, setting.field)
        assert setting.effect is BROKER_EFFECTS[setting.field]
        assert setting.key == "broker." + BROKER_KEY_OF[setting.field]
    assert change.restarts_daemon == any(
        BROKER_EFFECTS[field] is Effect.RESTART_DAEMON for field in fields
    )


@given(config_pairs())
def test_backwards_is_the_mirror_image(pair: tuple[Config, Config]) -> None:
    old, new = pair
    forth, back = diff(old, new), diff(new, old)
    assert set(back.added) == set(forth.removed)
    assert set(back.removed) == set(forth.added)
    assert set(back.restarted) == set(forth.restarted)
    assert set(back.updated) == set(forth.updated)
    assert [(s.field, s.old, s.new) for s in back.settings] == [
        (s.field, s.new, s.old) for s in forth.settings
    ]


# -- examples ----------------------------------------------------------------------


def config(servers: dict[str, Any], broker: dict[str, Any] | None = None) -> Config:
    return parse_config({"mcpServers": servers, "broker": broker or {}})


def test_examples() -> None:
    old = config(
        {
            "files": {"command": "npx", "args": ["fs"], "env": {"A": "1", "B": "2"}},
            "git": {"command": "git-mcp", "timeout": 10},
            "web": {"url": "ws://localhost:9/mcp"},
            "old": {"command": "old", "disabled": True},
            "gone": {"command": "gone"},
        }
    )
    new = config(
        {
            "files": {"command": "npx", "args": ["fs"], "env": {"B": "2", "A": "1"}},
            "git": {"command": "git-mcp", "timeout": 20, "startup": "lazy"},
            "web": {"url": "ws://localhost:9/mcp", "headers": {"Authorization": "x"}},
            "old": {"command": "old"},
            "new": {"command": "new", "disabled": True},
        },
        {"requestTimeout": 60, "websocket": "8765"},
    )
    change = diff(old, new)
    assert change.added == {"old": new.servers["old"]}  # enabled again
    assert change.removed == ("gone",)  # "new" is disabled: never there
    assert list(change.restarted) == ["web"]
    assert change.restarted["web"].keys == ("headers",)
    assert list(change.updated) == ["git"]  # files: env in another order is the same env
    assert change.updated["git"].keys == ("startup", "timeout")
    assert [(s.key, s.old, s.new, s.effect) for s in change.settings] == [
        ("broker.requestTimeout", 300.0, 60.0, Effect.LIVE),
        ("broker.websocket", None, "8765", Effect.RESTART_DAEMON),
    ]
    assert change.restarts_daemon
    assert not change.empty


def test_a_live_key_beside_a_restart_key_is_one_restart() -> None:
    old = config({"s": {"command": "a", "timeout": 1}})
    new = config({"s": {"command": "b", "timeout": 2}})
    change = diff(old, new)
    assert change.updated == {}
    assert change.restarted["s"].fields == ("command", "timeout")


def test_disabling_removes_and_changes_while_disabled_are_nothing() -> None:
    running = config({"s": {"command": "a"}})
    off = config({"s": {"command": "a", "disabled": True}})
    off_changed = config({"s": {"command": "b", "disabled": True}})
    assert diff(running, off).removed == ("s",)
    assert diff(off, running).added == {"s": running.servers["s"]}
    assert diff(off, off_changed).empty


def test_the_command_line_listener_is_no_change() -> None:
    # The reload compares configs with the same command line options applied.
    old = with_listeners(config({}), "8765", "/run/token")
    assert diff(old, with_listeners(config({}), "8765", "/run/token")).empty
    assert diff(old, config({})).restarts_daemon
