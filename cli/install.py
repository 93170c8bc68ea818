"""``mcpbroker install``, ``uninstall`` and ``import``: a host's servers into the
broker's config, and the host pointed at the broker.

``install --client HOST`` reads the host's config file, adds its servers to
the broker's config (``~/.config/mcpbroker/config.json`` by default, the file
the daemon reads), backs the host's file up beside it
(``FILE.mcpbroker-backup-YYYYMMDDTHHMMSSZ``), and rewrites the host's entries
to launch ``mcpbroker connect NAME``; it remembers the backup and what it
wrote in ``installs.json`` beside the broker's config. ``uninstall`` puts the
backup back, byte for byte, unless the host's file changed since (``--force``
to restore all the same, after backing up the changed file too). ``import
FILE`` only adds a file's servers to the broker's config. ``--dry-run`` shows
each change as a unified diff and writes nothing.

The rules (which entries move, merging, the new entries) are in
:mod:`cli.hosts`, without I/O; this module reads and writes the files.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import hashlib
import json
import os
import platform
import sys
import tempfile
from typing import Any
from urllib.parse import urlsplit

from actors.paths import default_config_path
from cli import hosts
from cli.jsonedit import EditError, Set, apply_edits

RECORDS = "installs.json"
EMPTY_CONFIG = '{\n  "mcpServers": {\n  }\n}\n'


class InstallError(Exception):
    """The command cannot do what was asked; the message says why and what to do."""


# -- files ------------------------------------------------------------------------------------


def read_text(path: str) -> str | None:
    try:
        # (newline="": a file's CRLF line ends stay as they are when it is
        # written back; they were all turned into LF)
        with open(path, encoding="utf-8", newline="") as file:
            return file.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}") from None


def same_line_ends(original: str, edited: str) -> str:
    """``edited`` with the line ends of ``original``, a file of CRLF ones
    (the edits write LF): a Windows user's file stays CRLF throughout."""
    if "\r\n" not in original or original.count("\n") != original.count("\r\n"):
        return edited
    return edited.replace("\r\n", "\n").replace("\n", "\r\n")


def decode(text: str, path: str, comments: bool) -> Any:
    """A config file's value: JSON, or (``comments``) JSON with comments.
    Host files are read with comments allowed, whatever the host documents:
    a file its host reads is one install can read (plain JSON takes the
    fast path)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        if not comments:
            raise InstallError(f"{path} is not valid JSON: {exc}") from None
    import json5

    try:
        return json5.loads(text)
    except Exception as exc:  # json-five raises its own kinds of errors
        raise InstallError(f"{path} is not valid JSON (even with comments): {exc}") from None


def write_atomically(path: str, text: str | bytes, mode: int | None = None) -> None:
    """Replace ``path`` by ``text`` in one step (a reader sees the old file or
    the new one), keeping its permissions (else ``mode``, else 0600)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600 if mode is None else mode
    data = text.encode("utf-8") if isinstance(text, str) else text
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".mcpbroker-")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def back_up(path: str, now: datetime.datetime) -> str:
    """Copy ``path`` to ``PATH.mcpbroker-backup-TIMESTAMP`` (never over
    another file), keeping its permissions; the copy's path."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    with open(path, "rb") as source:
        data = source.read()
    mode = os.stat(path).st_mode & 0o777
    number = 1
    while True:
        backup = f"{path}.mcpbroker-backup-{stamp}" + (f"-{number}" if number > 1 else "")
        try:
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            number += 1
            continue
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return backup


def digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=path,
            tofile=path,
        )
    )


# -- the records of installs ----------------------------------------------------------------


def records_path(config: str) -> str:
    return os.path.join(os.path.dirname(config), RECORDS)


def load_records(config: str) -> dict[str, Any]:
    path = records_path(config)
    text = read_text(path)
    if text is None:
        return {}
    data = decode(text, path, comments=False)
    hosts_ = data.get("hosts") if isinstance(data, dict) else None
    if not isinstance(hosts_, dict):
        raise InstallError(f'{path} has no "hosts" object; move it away and install again')
    for host_file, record in hosts_.items():
        earlier = record.get("earlier", []) if isinstance(record, dict) else None
        if (
            not isinstance(record, dict)
            or not all(
                isinstance(record.get(key), str) for key in ("backup", "sha256", "installed")
            )
            or not isinstance(earlier, list)
            or not all(isinstance(backup, str) for backup in earlier)
        ):
            raise InstallError(
                f"{path}: the record of {host_file} is not one mcpbroker wrote (it needs "
                '"backup", "sha256" and "installed"); mend it or move the file away'
            )
    return hosts_


def save_records(config: str, records: dict[str, Any]) -> None:
    text = json.dumps({"hosts": records}, indent=2, ensure_ascii=False) + "\n"
    write_atomically(records_path(config), text)


# -- the broker's config --------------------------------------------------------------------


def read_broker_config(config: str) -> tuple[str, dict[str, Any]]:
    """The broker config's text (a skeleton if there is none) and its servers."""
    text = read_text(config)
    if text is None:
        return EMPTY_CONFIG, {}
    data = decode(text, config, comments=False)
    servers = data.get("mcpServers", {}) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise InstallError(f'{config}: "mcpServers" must be an object')
    return text, servers


def add_to_broker_config(text: str, added: dict[str, Any], config: str) -> str:
    """The broker config's text with ``added`` servers, checked as the daemon checks it."""
    from broker.config import ConfigError, parse_config

    new = same_line_ends(
        text, apply_edits(text, [Set(("mcpServers", name), entry) for name, entry in added.items()])
    )
    try:
        parse_config(json.loads(new))
    except ConfigError as exc:
        raise InstallError(f"{config} would not be a valid config: {exc}") from None
    return new


# -- the commands -----------------------------------------------------------------------------


def install(args: argparse.Namespace, out: Any) -> int:
    host = hosts.HOSTS[args.client]
    home = os.path.expanduser("~")
    path = _host_file(args, host, home)
    config = os.path.abspath(args.config or default_config_path())
    text = read_text(path)
    if text is None:
        raise InstallError(
            f"no {host.title} config at {path}: nothing to install (--file names another file)"
        )
    data = decode(text, path, comments=True)
    records = load_records(config)
    record = records.get(path)
    if record is not None and record.get("sha256") == digest(text):
        print(f"{path}: already installed ({record.get('installed')}); nothing to do", file=out)
        return 0
    broker_text, broker_servers = read_broker_config(config)
    if args.url is not None:
        parts = urlsplit(args.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InstallError(
                f"--url needs the base URL of mcpbroker's HTTP listener, as "
                f"http://HOST:PORT (e.g. http://127.0.0.1:8765), not {args.url!r}"
            )
    target = hosts.Target(
        command=tuple(_mcpbroker_command()),
        config=hosts.shim_config_arg(config, home),
        url=args.url,
    )
    try:
        plan = hosts.plan_install(host, data, broker_servers, target, aggregate=args.aggregate)
    except ValueError as exc:
        raise InstallError(str(exc)) from None
    for block, name, why in plan.kept:
        print(f"left in {host.title}: {_where(block, name)} {why}", file=out)
    if not plan.moved:
        print(f"{path}: no server to move; nothing changed", file=out)
        return 0
    try:
        new_host = same_line_ends(text, apply_edits(text, plan.host_edits))
    except EditError as exc:
        raise InstallError(f"{path}: {exc}") from None
    new_broker = add_to_broker_config(broker_text, plan.broker_added, config)
    if args.dry_run:
        out.write(diff(config, broker_text if os.path.exists(config) else "", new_broker))
        out.write(diff(path, text, new_host))
        print(f"(dry run: {path} would be backed up first; nothing was written)", file=out)
        return 0
    backup = back_up(path, _now())
    write_atomically(config, new_broker)
    write_atomically(path, new_host)
    records[path] = {
        "client": host.client,
        "backup": backup,
        # An install over an earlier one (a server added since): the earlier
        # backups, oldest first, so uninstall gives back what was there before
        # the first (see backups_of).
        "earlier": [*record.get("earlier", []), record["backup"]] if record is not None else [],
        "sha256": digest(new_host),
        "installed": _now().isoformat(timespec="seconds"),
    }
    save_records(config, records)
    for block, name, broker_name in plan.moved:
        if broker_name not in plan.broker_added:
            print(f"{_where(block, name)} is already in {config} as {broker_name!r}", file=out)
            continue
        renamed = f" as {broker_name!r} (the name was taken)" if broker_name != name else ""
        print(f"moved {_where(block, name)} to {config}{renamed}", file=out)
    print(f"backup of {path}: {backup}", file=out)
    print(f"restart {host.title} to use the broker; `mcpbroker uninstall` undoes this", file=out)
    _warn_running_daemon(out)
    return 0


def _warn_running_daemon(out: Any) -> None:
    """A daemon already running serves the config it started with: say so."""
    from actors.paths import default_socket_path
    from cli.status import fetch_status

    try:
        status = fetch_status(default_socket_path(), timeout=2.0)
    except (OSError, ValueError):
        return  # no daemon: the first host to connect starts one with the new config
    pid = status.get("pid")
    print(
        f"a daemon (pid {pid}) is running with the config it started with; it serves "
        f"the new servers once restarted (kill {pid}: the next host to connect starts it)",
        file=out,
    )


def uninstall(args: argparse.Namespace, out: Any) -> int:
    host = hosts.HOSTS[args.client]
    home = os.path.expanduser("~")
    path = _host_file(args, host, home)
    config = os.path.abspath(args.config or default_config_path())
    records = load_records(config)
    record = records.get(path)
    if record is None:
        raise InstallError(f"no install into {path} is recorded in {records_path(config)}")
    backup = record["backup"]
    backups = backups_of(record)
    try:
        with open(path, "rb") as file:
            current: bytes | None = file.read()
    except FileNotFoundError:
        current = None
    changed = current is None or digest(current) != record["sha256"]
    if args.servers_only and current is not None:
        return _restore_servers(args, out, path, current, backups, record, config, records)
    # The last backup as it is, with the server entries of each earlier one
    # put back (an install over an earlier install backed up a file that
    # already pointed at the broker).
    original = backups[0][1]
    for name, older in backups[1:]:
        original = _put_back(path, original, name, older)
    if changed and not args.force:
        what = "is gone" if current is None else "changed"
        raise InstallError(
            f"{path} {what} since `mcpbroker install` ({record['installed']}): "
            f"restoring {backup} would lose that. Look at both, or run "
            f"`mcpbroker uninstall --client {host.client} --servers-only` to put back "
            f"only the server entries, or `--force` to restore the whole file anyway "
            f"(the file as it is now is backed up first)"
        )
    if args.dry_run:
        before = (current or b"").decode("utf-8", "replace")
        out.write(diff(path, before, original.decode("utf-8", "replace")))
        print(f"(dry run: {path} would be restored from {backup}; nothing was written)", file=out)
        return 0
    if current is not None and changed:
        print(f"backup of the changed {path}: {back_up(path, _now())}", file=out)
    mode = os.stat(backup).st_mode & 0o777
    write_atomically(path, original, mode)
    del records[path]
    save_records(config, records)
    earlier = f" and the server entries of {', '.join(n for n, _ in backups[1:])}"
    print(
        f"restored {path} from {backup}{earlier if len(backups) > 1 else ''}; "
        f"the servers stay in {config}",
        file=out,
    )
    print(f"restart {host.title} to use its own servers again", file=out)
    return 0


def backups_of(record: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The record's backups, each read, newest first: its own, then those of
    the installs it was made over (``earlier``)."""
    backups = []
    for name in (record["backup"], *reversed(record.get("earlier", []))):
        try:
            with open(name, "rb") as file:
                backups.append((name, file.read()))
        except OSError as exc:
            raise InstallError(f"cannot read the backup {name}: {exc}") from None
    return backups


def _put_back(path: str, current: bytes, name: str, backup: bytes) -> bytes:
    """``current`` with the server entries of ``backup`` put back (and the
    broker's entries it did not have removed: hosts.restore_servers)."""
    text = current.decode("utf-8")
    edits = hosts.restore_servers(
        decode(text, path, comments=True), decode(backup.decode("utf-8"), name, comments=True)
    )
    try:
        return same_line_ends(text, apply_edits(text, edits)).encode()
    except EditError as exc:
        raise InstallError(f"{path}: {exc}") from None


def _restore_servers(
    args: argparse.Namespace,
    out: Any,
    path: str,
    current: bytes,
    backups: list[tuple[str, bytes]],
    record: dict[str, Any],
    config: str,
    records: dict[str, Any],
) -> int:
    """``uninstall --servers-only``: the backups' server entries put back
    into the file as it is now (for a host that rewrites its file as it
    runs, such as Claude Code's ~/.claude.json), newest first, so that the
    oldest, from before the first install, has the last word."""
    host = hosts.HOSTS[args.client]
    text = current.decode("utf-8")
    restored = current
    for name, backup in backups:
        restored = _put_back(path, restored, name, backup)
    new = restored.decode("utf-8")
    if args.dry_run:
        out.write(diff(path, text, new))
        print(f"(dry run: {path}'s server entries would be put back; nothing written)", file=out)
        return 0
    print(f"backup of {path} as it was: {back_up(path, _now())}", file=out)
    write_atomically(path, new)
    del records[path]
    save_records(config, records)
    names = ", ".join(name for name, _ in backups)
    print(f"put back the server entries of {path} from {names}", file=out)
    print(f"restart {host.title} to use its own servers again", file=out)
    return 0


def import_file(args: argparse.Namespace, out: Any) -> int:
    path = os.path.abspath(args.file)
    config = os.path.abspath(args.config or default_config_path())
    text = read_text(path)
    if text is None:
        raise InstallError(f"no file {path}")
    data = decode(text, path, comments=True)
    if not hosts.server_blocks(data):
        raise InstallError(f'{path} has no "mcpServers" or "servers" object')
    broker_text, broker_servers = read_broker_config(config)
    movable = []
    for block, name, entry in hosts.entries(data):
        why = hosts.why_kept(name, entry)
        if why is None:
            movable.append((block, name, entry))
        else:
            print(f"not imported: {_where(block, name)} {why}", file=out)
    merged = hosts.merge(broker_servers, movable, "imported")
    new_broker = add_to_broker_config(broker_text, merged.added, config)
    for block, name, _ in movable:
        broker_name = merged.names[(block, name)]
        if broker_name in merged.added:
            renamed = f" as {broker_name!r} (the name was taken)" if broker_name != name else ""
            print(f"imported {_where(block, name)}{renamed}", file=out)
        else:
            print(f"already there: {_where(block, name)} (as {broker_name!r})", file=out)
    if args.dry_run:
        out.write(diff(config, broker_text if os.path.exists(config) else "", new_broker))
        print("(dry run: nothing was written)", file=out)
    elif merged.added:
        write_atomically(config, new_broker)
    return 0


def _host_file(args: argparse.Namespace, host: hosts.Host, home: str) -> str:
    """The host's file, through any symlinks (a dotfiles checkout keeps its link)."""
    given = args.file or hosts.host_path(host.client, home, os.environ, _system())
    return os.path.realpath(given)


def _where(block: hosts.BlockPath, name: str) -> str:
    return f"{name!r} ({hosts.describe_block(block)})"


def _mcpbroker_command() -> list[str]:
    from cli.service import daemon_command

    return daemon_command()


def _system() -> str:
    return platform.system()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


# -- the command line -----------------------------------------------------------------------


def parser(command: str) -> argparse.ArgumentParser:
    descriptions = {
        "install": "Move an MCP host's servers into mcpbroker's config and point the "
        "host at mcpbroker (its file is backed up first).",
        "uninstall": "Put an MCP host's config file back as it was before `mcpbroker install`.",
        "import": "Add the servers of an mcpServers (or VS Code servers) file to "
        "mcpbroker's config.",
    }
    parser = argparse.ArgumentParser(prog=f"mcpbroker {command}", description=descriptions[command])
    if command == "import":
        parser.add_argument("file", metavar="FILE", help="a host's config file")
    else:
        parser.add_argument("--client", required=True, choices=sorted(hosts.HOSTS))
        parser.add_argument(
            "--file",
            metavar="PATH",
            default=None,
            help="the host's config file, where it is not in its usual place "
            "(a project's .mcp.json, .cursor/mcp.json, .vscode/mcp.json)",
        )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"mcpbroker's config file (default: {default_config_path()})",
    )
    if command == "install":
        how = parser.add_mutually_exclusive_group()
        how.add_argument(
            "--aggregate",
            action="store_true",
            help="one entry for every server, instead of one entry per server",
        )
        how.add_argument(
            "--url",
            metavar="BASE",
            default=None,
            help="point the host at mcpbroker's HTTP listener (BASE/mcp/NAME, "
            "e.g. http://127.0.0.1:8765) instead of `mcpbroker connect`",
        )
    if command == "uninstall":
        how = parser.add_mutually_exclusive_group()
        how.add_argument(
            "--force",
            action="store_true",
            help="restore the whole file even if it changed since the install",
        )
        how.add_argument(
            "--servers-only",
            action="store_true",
            help="put back only the server entries, keeping the rest of the file as it is "
            "now (for hosts that rewrite their file as they run, like Claude Code)",
        )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would change, write nothing"
    )
    return parser


def main(command: str, argv: list[str]) -> int:
    args = parser(command).parse_args(argv)
    run = {"install": install, "uninstall": uninstall, "import": import_file}[command]
    try:
        return run(args, sys.stdout)
    except (InstallError, OSError) as exc:
        print(f"mcpbroker {command}: {exc}", file=sys.stderr)
        return 1
