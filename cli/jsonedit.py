"""Edit a JSON (or JSON-with-comments) text in place: set or delete members
by path, leaving every other byte where it was.

``mcpbroker install`` rewrites a few entries of a host's config file. Loading
the file and dumping it again would reformat the user's file and drop the
comments VS Code allows; this module changes only the members it is asked to,
through json-five's round-trip model (a syntax tree that keeps whitespace and
comments and dumps back to the same text). A new value is laid out like its
neighbours: on one line where the object is on one line, indented like the
other members otherwise.

Pure functions on text (no files): :func:`apply_edits` takes the text and a
list of :class:`Set` and :class:`Delete` and returns the new text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
from json5 import model
from json5.dumper import ModelDumper
from json5.dumper import dumps as model_dumps
from json5.loader import ModelLoader
from json5.loader import loads as model_loads

Path = tuple[str, ...]


class EditError(Exception):
    """The text cannot be edited as asked (not JSON, a path through a non-object,
    or through a key given twice)."""


@attrs.frozen
class Set:
    """Set the member at ``path`` to ``value``: replaced where it is, else
    added as the last member of its object (made, with its parents, if need be)."""

    path: Path
    value: Any


@attrs.frozen
class Delete:
    """Remove the member at ``path`` (nothing happens if there is none)."""

    path: Path


Edit = Set | Delete


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """``text`` with ``edits`` made, in order; what they do not touch is kept byte for byte."""
    if not edits:
        return text
    try:
        tree = model_loads(text, loader=ModelLoader())
    except Exception as exc:  # json-five raises its own parser errors, of several kinds
        raise EditError(f"not JSON: {exc}") from None
    unit = indent_unit(text)
    for edit in edits:
        if isinstance(edit, Set):
            _set(tree.value, edit.path, edit.value, "", unit)
        else:
            _delete(tree.value, edit.path)
    return _dump(tree)


def indent_unit(text: str) -> str:
    """One level of indentation as the text has it: a tab, or the smallest
    run of spaces that starts an indented line (two where there is none)."""
    widths = []
    for line in text.splitlines():
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            if line[0] == "\t":
                return "\t"
            widths.append(len(line) - len(stripped))
    return " " * min(widths) if widths else "  "


# -- the tree -------------------------------------------------------------------------------


def _key_text(key: model.Key) -> str:
    if isinstance(key, model.Identifier):
        return key.name
    return str(key.characters)  # type: ignore[attr-defined]


def _find(obj: model.JSONObject, name: str, where: Path) -> int | None:
    """The index of member ``name``; an :class:`EditError` if it is given
    more than once (a host reads the last, and an edit of either would not
    be what the user meant: they choose)."""
    found = [index for index, key in enumerate(obj.keys) if _key_text(key) == name]
    if len(found) > 1:
        place = ".".join(where) or "the top level"
        raise EditError(
            f"{json.dumps(name)} is given {len(found)} times in {place} (a host reads only "
            "the last): remove the others, then run this again"
        )
    return found[0] if found else None


def _object(node: model.Value, path: Path) -> model.JSONObject:
    if not isinstance(node, model.JSONObject):
        raise EditError(f"{'.'.join(path) or 'the top level'} is not an object")
    return node


def _set(obj_node: model.Value, path: Path, value: Any, indent: str, unit: str) -> None:
    obj = _object(obj_node, ())
    for depth, name in enumerate(path[:-1]):
        index = _find(obj, name, path[:depth])
        if index is None:  # make the rest of the path as one new value
            nested: Any = value
            for part in reversed(path[depth + 1 :]):
                nested = {part: nested}
            _append(obj, name, nested, indent, unit)
            return
        indent = _indent_of(obj, index, indent, unit)
        obj = _object(obj.values[index], path[: depth + 1])
    name = path[-1]
    index = _find(obj, name, path[:-1])
    if index is None:
        _append(obj, name, value, indent, unit)
        return
    old = obj.values[index]
    key_indent = _indent_of(obj, index, indent, unit)
    one_line = "\n" not in _dump(old).strip()
    new = _parse(_format(value, key_indent, unit, one_line and _is_flat(value, old)))
    new.wsc_before[:] = old.wsc_before
    new.wsc_after[:] = old.wsc_after
    obj.values[index] = new


def _is_flat(value: Any, old: model.Value) -> bool:
    """Whether a one-line old value may be replaced by a one-line new one."""
    return isinstance(old, model.JSONObject) or not isinstance(value, dict)


def _delete(obj_node: model.Value, path: Path) -> None:
    obj = _object(obj_node, ())
    for depth, name in enumerate(path[:-1]):
        index = _find(obj, name, path[:depth])
        if index is None:
            return
        obj = _object(obj.values[index], path[: depth + 1])
    index = _find(obj, path[-1], path[:-1])
    if index is None:
        return
    last = index == len(obj.keys) - 1
    removed = obj.values[index]
    before_close = _pop_trailing_space(removed.wsc_after) if last else None
    if not last:  # a comment on this member's line, after its comma, goes with it
        following = obj.keys[index + 1].wsc_before
        del following[: len(_same_line(following))]
    if index > 0:  # a comment on the line of the comma before it is the previous member's
        kept = _same_line(obj.keys[index].wsc_before)
        if last:
            obj.values[index - 1].wsc_after.extend(kept)
        else:
            obj.keys[index + 1].wsc_before[:0] = kept
    elif not last:
        # What came between this member's comma and the next key now opens the object.
        obj.leading_wsc[:] = obj.keys[1].wsc_before
        obj.keys[1].wsc_before.clear()
    del obj.keys[index]
    del obj.values[index]
    if before_close is not None:
        if obj.values:
            obj.values[-1].wsc_after.append(before_close)
        else:
            obj.leading_wsc[:] = [before_close]


def _append(obj: model.JSONObject, name: str, value: Any, indent: str, unit: str) -> None:
    multi_line = _is_multi_line(obj)
    member_indent = _indent_of(obj, len(obj.keys) - 1, indent, unit) if obj.keys else indent + unit
    text = _format(value, member_indent, unit, not multi_line)
    pair = _parse("{" + json.dumps(name, ensure_ascii=False) + ": " + text + "}")
    assert isinstance(pair, model.JSONObject)
    key, new = pair.keys[0], pair.values[0]
    if obj.keys:
        last = obj.values[-1]
        before_close = _pop_trailing_space(last.wsc_after)
        # Whatever followed the last value (a comment) now follows its comma.
        key.wsc_before[:] = [*last.wsc_after, "\n" + member_indent if multi_line else " "]
        last.wsc_after.clear()
        if obj.trailing_comma is None:
            new.wsc_after[:] = [before_close] if before_close else []
    else:
        key.wsc_before[:] = ["\n" + member_indent] if multi_line else []
        new.wsc_after[:] = ["\n" + indent] if multi_line else []
        obj.leading_wsc.clear()
    obj.keys.append(key)
    obj.values.append(new)


def _same_line(wsc: list[Any]) -> list[Any]:
    """The whitespace and comments of ``wsc`` before its first line break."""
    kept: list[Any] = []
    for item in wsc:
        if isinstance(item, str) and "\n" in item:
            break
        kept.append(item)
    return kept if any(isinstance(item, model.Comment) for item in kept) else []


def _pop_trailing_space(wsc: list[Any]) -> str:
    return wsc.pop() if wsc and isinstance(wsc[-1], str) else ""


def _is_multi_line(obj: model.JSONObject) -> bool:
    if not obj.keys:
        return any(isinstance(w, str) and "\n" in w for w in obj.leading_wsc)
    return "\n" in "".join(
        w for w in [*obj.leading_wsc, *obj.keys[0].wsc_before] if isinstance(w, str)
    )


def _indent_of(obj: model.JSONObject, index: int, outer: str, unit: str) -> str:
    """The indentation of member ``index``'s key: what follows the last
    newline before it (for the first member, inside the object's brace)."""
    wsc = list(obj.keys[index].wsc_before)
    if index == 0:
        wsc = [*obj.leading_wsc, *wsc]
    for item in reversed(wsc):
        if isinstance(item, str) and "\n" in item:
            return item.rsplit("\n", 1)[1]
    return outer + unit


def _format(value: Any, indent: str, unit: str, one_line: bool) -> str:
    """``value`` as JSON: objects one member a line (unless ``one_line``), and
    lists of plain values on one line, as people write ``args``."""
    if one_line or not isinstance(value, dict | list) or not value:
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list) and not any(isinstance(item, dict | list) for item in value):
        return json.dumps(value, ensure_ascii=False)
    inner = indent + unit
    if isinstance(value, list):
        items = [inner + _format(item, inner, unit, False) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    members = [
        inner + json.dumps(key, ensure_ascii=False) + ": " + _format(item, inner, unit, False)
        for key, item in value.items()
    ]
    return "{\n" + ",\n".join(members) + "\n" + indent + "}"


def _dump(node: model.Node) -> str:
    # (json-five annotates ``dumper`` as its base class, which ModelDumper is not)
    return str(model_dumps(node, dumper=ModelDumper()))  # type: ignore[arg-type]


def _parse(text: str) -> model.Value:
    value = model_loads(text, loader=ModelLoader()).value
    assert isinstance(value, model.Value)
    return value
