"""The configuration file: the ``mcpServers`` shape hosts already use.

::

    {
      "mcpServers": {
        "NAME": {"command": "...", "args": ["..."], "env": {"K": "V"}, "cwd": "..."},
        "REMOTE": {"url": "https://...", "headers": {"Authorization": "..."}}
      },
      "broker": {"maxMessageBytes": 16777216}
    }

The file is structured with cattrs into frozen attrs classes. Whatever is
wrong is reported as :class:`ConfigError` naming the key and what was wrong
with it. Keys that hosts add for their own use (``type``, ``disabled``,
``autoApprove``, ...) are accepted; keys nobody knows are returned as
warnings, not errors, so one host's config file works unchanged here.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import cattrs
import orjson

from broker.naming import DEFAULT_SEPARATOR
from broker.wire.frames import DEFAULT_MAX_MESSAGE_BYTES

# The limits that keep one peer from growing the daemon (docs/configuration.md).
DEFAULT_MAX_QUEUED_BYTES = 64 * 1024 * 1024  # per client's outbox, per server's write backlog
DEFAULT_MAX_IN_FLIGHT = 4096  # requests per session
DEFAULT_MAX_SERVER_IN_FLIGHT = 16384  # requests per server instance
DEFAULT_MAX_WAITING = 1024  # requests waiting for their turn, per server instance
SERVER_REQUEST_MODES = ("auto", "exclusive", "concurrent")
# Which protocol era a server is opened in (docs/eras.md, "Upstream");
# "per-client": each client in its own (docs/eras.md, "Each client in its era").
ERAS = ("auto", "legacy", "modern", "per-client")

# Keys of a server entry that hosts use and the broker reads or tolerates.
HOST_SERVER_KEYS = frozenset(
    {"type", "disabled", "autoApprove", "alwaysAllow", "transport", "description"}
)
TRANSPORTS = frozenset({"stdio", "http", "sse", "streamable-http", "streamableHttp", "ws"})


class ConfigError(Exception):
    """A configuration that cannot be used; the message says where and why."""


@attrs.frozen
class ServerConfig:
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict)
    type: str | None = None
    disabled: bool = False
    startup: str = "eager"
    share: str = "shared"
    pool: int = 1
    # A per-session server's instances at most (sessions past it are refused,
    # -32005): one process per session must not be one per whatever connects.
    max_instances: int = 32
    timeout: float | None = None  # seconds; None: the broker's requestTimeout
    # Requests to clients: "auto", "exclusive" or "concurrent" (broker/turns.py).
    server_requests: str = "auto"
    # The protocol era: "auto" probes server/discover (a server that speaks
    # both eras is used in the modern one), "legacy" opens with initialize,
    # "modern" requires 2026-07-28 (docs/eras.md, "Upstream"); "per-client"
    # opens it twice, legacy for legacy clients and auto for modern ones
    # (actors/sharing.py's EraServer).
    era: str = "auto"
    # OAuth for a url server (``mcpbroker auth NAME``): a client registered by
    # hand ("clientId", "clientSecret"), the "scope" to ask, the "redirectPort".
    oauth: dict[str, str] = attrs.field(factory=dict)
    # Restarts and pings (broker/recovery.py); None: the broker section's.
    restart_delay: float | None = None
    restart_max_delay: float | None = None
    restart_attempts: int | None = None
    ping_interval: float | None = None  # 0: no pings
    ping_misses: int | None = None


@attrs.frozen
class BrokerSettings:
    """The config's ``broker`` section."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    separator: str = DEFAULT_SEPARATOR
    page_size: int = 0  # 0: list results are not paginated
    request_timeout: float = 300.0  # seconds without an answer or progress
    max_request_timeout: float = 3600.0  # seconds, however much progress
    # Seconds a call a legacy server asked a question in waits for its modern
    # client's retry (the input_required round, docs/eras.md).
    input_timeout: float = 120.0
    # Bytes that may wait to be written to one client, or to one server.
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT  # requests one session may have in flight
    max_server_in_flight: int = DEFAULT_MAX_SERVER_IN_FLIGHT  # ... and one server instance
    # Requests that may wait for their turn on a server that takes one client at a time.
    max_waiting_requests: int = DEFAULT_MAX_WAITING
    # The WebSocket listener ("HOST:PORT"; None: none), and who may use it
    # (docs/security.md): browser Origins allowed (none by default), Host
    # names allowed besides loopback ones, a file holding a bearer token.
    websocket: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    token_file: str | None = None
    # The Streamable HTTP listener ("HOST:PORT"; None: none), with the same
    # checks as the WebSocket one (docs/security.md).
    http: str | None = None
    # The metrics listener ("HOST:PORT": Prometheus reads /metrics; None: none),
    # and the audit log of tool calls (a file; None: none), with each call's
    # arguments or not (docs/observability.md).
    metrics: str | None = None
    audit_log: str | None = None
    audit_arguments: bool = False
    # Restarts and pings, for every server without its own (broker/recovery.py).
    restart_delay: float = 0.5  # seconds before the first restart, doubling
    restart_max_delay: float = 30.0  # up to this
    restart_attempts: int = 8  # restarts in a row that end too soon before "failed"; 0: never
    retry_failed_after: float = 600.0  # a failed server is tried again after this; 0: never
    ping_interval: float | None = 30.0  # seconds between pings to a ready server; 0 or None: off
    ping_misses: int = 3  # silent intervals in a row before a server is declared dead
    # Seconds a stopping daemon (SIGTERM, SIGINT) waits for requests in flight,
    # and a reload for those of a server it removes or restarts (docs/configuration.md).
    shutdown_timeout: float = 5.0


@attrs.frozen
class Config:
    servers: dict[str, ServerConfig]
    broker: BrokerSettings = BrokerSettings()
    warnings: tuple[str, ...] = ()

    @property
    def enabled_servers(self) -> dict[str, ServerConfig]:
        return {name: server for name, server in self.servers.items() if not server.disabled}


def _strict_converter() -> cattrs.Converter:
    """A converter that checks JSON types instead of coercing them (no 1 -> "1")."""
    converter = cattrs.Converter(forbid_extra_keys=False)

    def exact(kind: type, label: str) -> Any:
        def check(value: Any, _: Any) -> Any:
            if type(value) is not kind:
                raise TypeError(f"expected {label}, got {_json_type(value)}")
            return value

        return check

    converter.register_structure_hook(str, exact(str, "a string"))
    converter.register_structure_hook(bool, exact(bool, "true or false"))
    converter.register_structure_hook(int, exact(int, "an integer"))

    def number(value: Any, _: Any) -> float:
        if type(value) not in (int, float):
            raise TypeError(f"expected a number, got {_json_type(value)}")
        return float(value)

    converter.register_structure_hook(float, number)

    def string_list(value: Any, _: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list of strings, got {_json_type(value)}")
        for index, item in enumerate(value):
            if type(item) is not str:
                raise TypeError(f"item {index}: expected a string, got {_json_type(item)}")
        return tuple(value)

    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], string_list)

    def string_map(value: Any, _: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object of strings, got {_json_type(value)}")
        for key, item in value.items():
            if type(item) is not str:
                raise TypeError(f"key {key!r}: expected a string, got {_json_type(item)}")
        return dict(value)

    converter.register_structure_hook_func(lambda t: t == dict[str, str], string_map)
    return converter


def _json_type(value: Any) -> str:
    names = {
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


_converter = _strict_converter()


def _check_regular(path: str | os.PathLike[str]) -> None:
    """Refuse, saying what it is, a config path that is not a regular file."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return
    if stat.S_ISFIFO(mode):
        raise ConfigError(
            f"config file {str(path)!r} is not a regular file: a named pipe (as `sops "
            "exec-file` gives) is read once, at start; restart the daemon to read it again"
        )
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "a device")
    raise ConfigError(f"config file {str(path)!r} is not a regular file: it is {kind}")


def load_config(path: str | os.PathLike[str], *, regular_only: bool = False) -> Config:
    """Read and check a configuration file; ``regular_only``: refuse at once
    one that is not a regular file (a reload: a named pipe, as ``sops
    exec-file`` gives, is written once, and a second open() waits for ever)."""
    try:
        if regular_only:
            _check_regular(path)
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid JSON: {exc}") from None
    try:
        config = parse_config(data)
    except ConfigError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc}") from None
    twice = duplicate_keys(raw)
    if not twice:
        return config
    said = [f"key {key!r} is given more than once in an object: the last one is used"
            for key in twice[:MAX_WARNINGS]]  # fmt: skip
    return attrs.evolve(config, warnings=(*said, *config.warnings))


def duplicate_keys(raw: bytes) -> list[str]:
    """The keys that appear twice in one object of ``raw`` (valid JSON):
    a decoder keeps the last, so a second server of the same name silently
    replaced the first."""
    twice: dict[str, None] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                twice[key] = None
            seen.add(key)
        return dict(items)

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # (what orjson took and json does not: say nothing)
        return []
    return list(twice)


def parse_config(data: Any) -> Config:
    """Check an already decoded configuration."""
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a JSON object")
    warnings: list[str] = []
    shapes = _check_shape(data, warnings)
    warnings[:0] = [
        f"unknown top-level key {key!r} ignored"
        for key in data
        if key not in ("mcpServers", "broker", "$schema") and key not in shapes
    ]
    servers_raw = data.get("mcpServers", {})
    if not isinstance(servers_raw, dict):
        raise ConfigError('"mcpServers" must be an object mapping server names to entries')
    servers = {}
    for name, entry in servers_raw.items():
        servers[name] = _server(name, entry, warnings)
    broker_raw = data.get("broker", {})
    if isinstance(broker_raw, dict):
        warnings += [
            f'unknown key "broker.{key}" ignored' for key in broker_raw if key not in _BROKER_KEYS
        ]
    broker = _structure(broker_raw, BrokerSettings, "broker", _BROKER_KEYS)
    if broker.max_message_bytes < 1024:
        raise ConfigError('"broker.maxMessageBytes" must be at least 1024')
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,8}", broker.separator):
        raise ConfigError('"broker.separator" must be 1 to 8 of the characters A-Z a-z 0-9 _ . -')
    if broker.request_timeout <= 0 or broker.max_request_timeout < broker.request_timeout:
        raise ConfigError(
            '"broker.requestTimeout" must be above 0 and at most "broker.maxRequestTimeout"'
        )
    if broker.input_timeout <= 0:
        raise ConfigError('"broker.inputTimeout" must be a number of seconds above 0')
    if broker.max_queued_bytes < broker.max_message_bytes:
        raise ConfigError('"broker.maxQueuedBytes" must be at least "broker.maxMessageBytes"')
    if broker.max_in_flight < 1 or broker.max_server_in_flight < 1:
        raise ConfigError('"broker.maxInFlight" and "broker.maxServerInFlight" must be at least 1')
    if broker.max_waiting_requests < 1:
        raise ConfigError('"broker.maxWaitingRequests" must be at least 1')
    if broker.shutdown_timeout < 0:
        raise ConfigError('"broker.shutdownTimeout" must be a number of seconds, 0 or more')
    if broker.page_size < 0:
        raise ConfigError('"broker.pageSize" must be 0 (no pagination) or more')
    _check_recovery(
        "broker",
        broker.restart_delay,
        broker.restart_max_delay,
        broker.restart_attempts,
        broker.ping_interval,
        broker.ping_misses,
    )
    if broker.retry_failed_after < 0:
        raise ConfigError('"broker.retryFailedAfter" must be 0 (never) or a number of seconds')
    if broker.websocket is not None:
        try:
            parse_address(broker.websocket)
        except ValueError as exc:
            raise ConfigError(f'"broker.websocket": {exc}') from None
    if broker.http is not None:
        try:
            parse_address(broker.http)
        except ValueError as exc:
            raise ConfigError(f'"broker.http": {exc}') from None
    if broker.metrics is not None:
        try:
            parse_address(broker.metrics)
        except ValueError as exc:
            raise ConfigError(f'"broker.metrics": {exc}') from None
    if broker.audit_log is not None and not broker.audit_log.strip():
        raise ConfigError('"broker.auditLog" must be a file\'s path')
    if (
        len(warnings) > MAX_WARNINGS
    ):  # (100,000 unknown keys were 100,000 lines, and a 4.7 MB answer)
        more = len(warnings) - MAX_WARNINGS
        warnings[MAX_WARNINGS:] = [f"{more} more warnings like these not shown"]
    return Config(servers=servers, broker=broker, warnings=tuple(warnings))


MAX_WARNINGS = 20  # the warnings a file gets at most (serve's stderr, the log, reload's answer)


_BROKER_KEYS = {
    "maxMessageBytes": "max_message_bytes",
    "separator": "separator",
    "pageSize": "page_size",
    "requestTimeout": "request_timeout",
    "maxRequestTimeout": "max_request_timeout",
    "inputTimeout": "input_timeout",
    "maxQueuedBytes": "max_queued_bytes",
    "maxInFlight": "max_in_flight",
    "maxServerInFlight": "max_server_in_flight",
    "maxWaitingRequests": "max_waiting_requests",
    "websocket": "websocket",
    "allowedOrigins": "allowed_origins",
    "allowedHosts": "allowed_hosts",
    "tokenFile": "token_file",
    "http": "http",
    "metrics": "metrics",
    "auditLog": "audit_log",
    "auditArguments": "audit_arguments",
    "restartDelay": "restart_delay",
    "restartMaxDelay": "restart_max_delay",
    "restartAttempts": "restart_attempts",
    "retryFailedAfter": "retry_failed_after",
    "pingInterval": "ping_interval",
    "pingMisses": "ping_misses",
    "shutdownTimeout": "shutdown_timeout",
}
_SERVER_KEYS = {
    "command": "command",
    "args": "args",
    "env": "env",
    "cwd": "cwd",
    "url": "url",
    "headers": "headers",
    "type": "type",
    "disabled": "disabled",
    "startup": "startup",
    "share": "share",
    "pool": "pool",
    "maxInstances": "max_instances",
    "timeout": "timeout",
    "serverRequests": "server_requests",
    "era": "era",
    "oauth": "oauth",
    "restartDelay": "restart_delay",
    "restartMaxDelay": "restart_max_delay",
    "restartAttempts": "restart_attempts",
    "pingInterval": "ping_interval",
    "pingMisses": "ping_misses",
}
OAUTH_KEYS = ("clientId", "clientSecret", "scope", "redirectPort")
# Each field's key in the file, for messages that name a setting (broker/configdiff.py).
SERVER_KEY_OF = {field: key for key, field in _SERVER_KEYS.items()}
BROKER_KEY_OF = {field: key for key, field in _BROKER_KEYS.items()}


# Where other hosts keep their servers: VS Code's mcp.json ("servers") and its
# settings.json ("mcp": {"servers": ...}).
_OTHER_SHAPES = (("servers",), ("mcp", "servers"))


def _check_shape(data: dict[str, Any], warnings: list[str]) -> set[str]:
    """A file in another host's shape is refused when it has no ``mcpServers``
    (a daemon serving no server would fail silently), and warned about beside
    it. Returns the top-level keys it warned about."""
    seen = set()
    for path in _OTHER_SHAPES:
        found: Any = data
        for key in path:
            found = found.get(key) if isinstance(found, dict) else None
        if not isinstance(found, dict):
            continue
        where = ".".join(path)
        if "mcpServers" not in data:
            raise ConfigError(
                f'the servers are under "{where}" (the shape of VS Code\'s MCP config); '
                'mcpbroker reads them from a top-level "mcpServers": rename the key'
            )
        warnings.append(f'"{where}" ignored: mcpbroker reads only "mcpServers"')
        seen.add(path[0])
    return seen


def with_listeners(
    config: Config, websocket: str | None, token_file: str | None, http: str | None = None
) -> Config:
    """The config with the command line's listener options on top of its own."""
    broker = config.broker
    if http is not None:
        try:
            parse_address(http)
        except ValueError as exc:
            raise ConfigError(f"--http: {exc}") from None
        broker = attrs.evolve(broker, http=http)
    if websocket is not None:
        try:
            parse_address(websocket)
        except ValueError as exc:
            raise ConfigError(f"--ws: {exc}") from None
        broker = attrs.evolve(broker, websocket=websocket)
    if token_file is not None:
        broker = attrs.evolve(broker, token_file=token_file)
    return attrs.evolve(config, broker=broker)


def with_metrics(config: Config, metrics: str | None) -> Config:
    """The config with ``serve --metrics HOST:PORT`` on top of its own."""
    if metrics is None:
        return config
    try:
        parse_address(metrics)
    except ValueError as exc:
        raise ConfigError(f"--metrics: {exc}") from None
    return attrs.evolve(config, broker=attrs.evolve(config.broker, metrics=metrics))


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; ``PORT`` alone: 127.0.0.1)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _server(name: Any, entry: Any, warnings: list[str]) -> ServerConfig:
    where = f"mcpServers.{name}"
    if not name:
        raise ConfigError("a server name must not be empty")
    if not isinstance(entry, dict):
        raise ConfigError(f'"{where}" must be an object')
    for key in entry:
        if key not in _SERVER_KEYS and key not in HOST_SERVER_KEYS:
            warnings.append(f'unknown key "{where}.{key}" ignored')
    server: ServerConfig = _structure(entry, ServerConfig, where, _SERVER_KEYS)
    if (server.command is None) == (server.url is None):
        raise ConfigError(f'"{where}" needs exactly one of "command" (stdio) or "url" (remote)')
    if server.command is not None and not server.command.strip():
        raise ConfigError(f'"{where}.command" must not be empty')
    if server.timeout is not None and server.timeout <= 0:
        raise ConfigError(f'"{where}.timeout" must be a number of seconds above 0')
    if server.share not in ("shared", "per-session"):
        raise ConfigError(
            f'"{where}.share" must be "shared" or "per-session", not {server.share!r}'
        )
    if not 1 <= server.pool <= 64 or (server.pool > 1 and server.share != "shared"):
        raise ConfigError(f'"{where}.pool" must be 1 to 64, and only with "share": "shared"')
    if not 1 <= server.max_instances <= 1024:
        raise ConfigError(f'"{where}.maxInstances" must be 1 to 1024')
    if "maxInstances" in entry and server.share != "per-session":
        warnings.append(
            f'"{where}.maxInstances" ignored: it caps the instances of "share": "per-session"'
        )
    if server.server_requests not in SERVER_REQUEST_MODES:
        raise ConfigError(
            f'"{where}.serverRequests" must be "auto", "exclusive" or "concurrent", '
            f"not {server.server_requests!r}"
        )
    if server.era not in ERAS:
        raise ConfigError(
            f'"{where}.era" must be "auto", "legacy", "modern" or "per-client", not {server.era!r}'
        )
    if server.era == "per-client" and (
        server.share != "shared" or server.pool > 1 or server.type == "sse"
    ):
        raise ConfigError(
            f'"{where}.era": "per-client" opens the server once for each client era: not '
            'with "share": "per-session", a "pool", or "type": "sse" (no modern revision)'
        )
    _check_recovery(
        where,
        server.restart_delay,
        server.restart_max_delay,
        server.restart_attempts,
        server.ping_interval,
        server.ping_misses,
    )
    if server.startup not in ("eager", "lazy"):
        raise ConfigError(f'"{where}.startup" must be "eager" or "lazy", not {server.startup!r}')
    for key in server.oauth:
        if key not in OAUTH_KEYS:
            raise ConfigError(
                f'"{where}.oauth.{key}" is not a key of oauth ({", ".join(OAUTH_KEYS)})'
            )
    if not server.oauth.get("redirectPort", "0").isdigit():
        raise ConfigError(f'"{where}.oauth.redirectPort" must be a port number, as a string')
    if server.oauth and server.url is None:
        raise ConfigError(f'"{where}.oauth" is for servers reached by "url"')
    if server.type is not None and server.type not in TRANSPORTS:
        raise ConfigError(
            f'"{where}.type" must be one of {", ".join(sorted(TRANSPORTS))}, not {server.type!r}'
        )
    _check_launchable(where, server)
    return server


# A header's name is an HTTP token; its value visible ASCII, spaces and tabs
# (RFC 9110 5.5; what httpx and the WebSocket handshake can send).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def _check_launchable(where: str, server: ServerConfig) -> None:
    """Values the launch of the server would choke on, refused here with the
    key named: a reload that accepted them only failed when the server started."""
    texts = [("command", server.command or ""), ("cwd", server.cwd or "")]
    texts += [(f"args[{i}]", arg) for i, arg in enumerate(server.args)]
    texts += [(f"env.{key}", value) for key, value in server.env.items()]
    for key, text in texts:
        if "\0" in text:
            raise ConfigError(f'"{where}.{key}" must not contain a NUL character')
    for key in server.env:
        if not key or "=" in key or "\0" in key:
            raise ConfigError(
                f'"{where}.env" has the name {key!r}: an environment variable\'s name '
                'must not be empty, nor contain "=" or a NUL character'
            )
    for key, value in server.headers.items():
        if not _HEADER_NAME.fullmatch(key):
            raise ConfigError(f'"{where}.headers" has {key!r}, which is not a header name')
        if not _HEADER_VALUE.fullmatch(value):
            raise ConfigError(
                f'"{where}.headers.{key}" must be plain ASCII text, without line breaks '
                "or control characters (a curly quote pasted from a web page is not)"
            )
    if server.url is not None:
        try:
            urlsplit(server.url).port  # noqa: B018 (it raises on a bad port)
        except ValueError as exc:
            raise ConfigError(f'"{where}.url" is not a valid URL ({exc})') from None


MIN_RESTART_DELAY = 0.01
MIN_PING_INTERVAL = 0.1


def _check_recovery(
    where: str,
    delay: float | None,
    max_delay: float | None,
    attempts: int | None,
    ping_interval: float | None,
    ping_misses: int | None,
) -> None:
    """The restart and ping keys of a server entry or the broker section."""
    # (floors: a restart or a ping every nanosecond spins the daemon)
    if delay is not None and delay < MIN_RESTART_DELAY:
        raise ConfigError(
            f'"{where}.restartDelay" must be a number of seconds, at least {MIN_RESTART_DELAY}'
        )
    if max_delay is not None and (max_delay <= 0 or (delay is not None and max_delay < delay)):
        raise ConfigError(
            f'"{where}.restartMaxDelay" must be a number of seconds, at least "restartDelay"'
        )
    if attempts is not None and attempts < 0:
        raise ConfigError(f'"{where}.restartAttempts" must be 0 (never give up) or more')
    if ping_interval is not None and ping_interval != 0 and not ping_interval >= MIN_PING_INTERVAL:
        raise ConfigError(
            f'"{where}.pingInterval" must be 0 (no pings) or a number of seconds,'
            f" at least {MIN_PING_INTERVAL}"
        )
    if ping_misses is not None and ping_misses < 1:
        raise ConfigError(f'"{where}.pingMisses" must be at least 1')


def _structure(raw: Any, cls: type[Any], where: str, keys: dict[str, str]) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f'"{where}" must be an object')
    fields = {keys[key]: value for key, value in raw.items() if key in keys}
    try:
        return _converter.structure(fields, cls)
    except cattrs.ClassValidationError as exc:
        reasons = cattrs.transform_error(exc, path=where, format_exception=_reason)
        raise ConfigError("; ".join(_camel_paths(reasons, keys))) from None


def _reason(exc: BaseException, _type: Any) -> str:
    return str(exc) if isinstance(exc, TypeError) else cattrs.v.format_exception(exc, _type)


def _camel_paths(reasons: list[str], keys: dict[str, str]) -> list[str]:
    """cattrs names attrs fields; say the config's own (camelCase) keys instead."""
    fixed = []
    for reason in reasons:
        for config_key, field in keys.items():
            reason = reason.replace(f".{field}", f".{config_key}")
        fixed.append(reason)
    return fixed
