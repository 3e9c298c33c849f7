"""Bounds of the profile/plan reader, applied before or while parsing so that no file crashes or
hangs it: regular files only, a size limit, a nesting limit (checked on the YAML tokens before
libyaml's recursive composer), a limit on values after alias expansion, an integer-size limit.
Every refusal is a one-line ``InvalidPlan``."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from planner.errors import InvalidPlan

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader when available (8x faster on the 40 KB cluster profile)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping states the same key twice (YAML would silently keep the last)."""

    def __init__(self, key: Any, first: Any = None, again: Any = None) -> None:
        """``first``/``again``: the YAML marks of both statements (none for JSON, which reports no line)."""
        self.key = key
        self.first_line, self.line = (first.line + 1, again.line + 1) if again is not None else (None, None)
        super().__init__(None, None, f"found duplicate key {key!r}", again)


class _Loader(_BaseLoader):
    """The safe loader, refusing a mapping that states a key twice (``<<`` merge keys may still be
    overridden, as YAML defines)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise DuplicateKey(key, seen[key], key_node.start_mark)
                    seen[key] = key_node.start_mark
                except TypeError:
                    pass  # an unhashable key: the base constructor reports it
        return super().construct_mapping(node, deep=deep)


MAX_FILE_BYTES = 16 << 20
"""Largest profile, plan or config file read (the shipped cluster profile is 55 KB)."""
MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a file may have (the schema needs 6)."""
MAX_VALUES = 1_000_000
"""Most values a file may hold once its YAML aliases are expanded (an alias bomb stops here)."""
MAX_INT = 1 << 62
"""Largest integer magnitude a file may state; the schema bounds each field further."""
_OPEN = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
         yaml.FlowSequenceStartToken)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _too_deep(p: Path, where: str) -> InvalidPlan:
    return InvalidPlan(str(p), where, f"nests mappings or lists more than {MAX_DEPTH} levels deep",
                       "write a flat profile (see planner/profiles/)")


def _read_bytes(p: Path) -> bytes:
    """The file's bytes, refusing what is not a regular file or is larger than ``MAX_FILE_BYTES``
    (before reading: a FIFO would block and ``/dev/zero`` never ends)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InvalidPlan("file", str(p), "does not exist", "check the path") from None
    except OSError as e:
        raise InvalidPlan("file", str(p), f"cannot be read: {e.strerror or e}", "check the path") from None
    if stat.S_ISDIR(st.st_mode):
        inside = p / "config.json"
        raise InvalidPlan("file", str(p), "is a directory",
                          f"pass {inside}" if inside.is_file() else "pass a YAML or JSON file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise InvalidPlan("file", str(p), "is not a regular file (a FIFO, device or socket)",
                          "pass a YAML or JSON file")
    if st.st_size > MAX_FILE_BYTES:
        raise InvalidPlan("file", str(p), f"is {st.st_size} bytes, larger than the {MAX_FILE_BYTES >> 20} MiB "
                          "a profile or plan may be", "pass the profile or plan file itself")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise InvalidPlan("file", str(p), f"cannot be read: {e.strerror or e}", "check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise InvalidPlan("file", str(p), f"is larger than the {MAX_FILE_BYTES >> 20} MiB a profile or plan "
                          "may be", "pass the profile or plan file itself")
    return data


def _check_yaml_depth(p: Path, text: str) -> None:
    """Refuse deep nesting before libyaml's recursive composer sees it (it crashes the process at
    ~10^5 levels): one linear pass over the tokens."""
    depth = 0
    for tok in yaml.scan(text, Loader=_Loader):
        if isinstance(tok, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                mark = tok.start_mark
                raise _too_deep(p, f"line {mark.line + 1} column {mark.column + 1}")
        elif isinstance(tok, _CLOSE):
            depth -= 1


_KEY_KINDS = {int: "an integer", bool: "a boolean (YAML reads on, off, yes and no as booleans)",
              float: "a number", type(None): "null", tuple: "a list", list: "a list"}
"""What a non-string mapping key is, in a YAML user's words."""


def _int_keyed(where: str) -> bool:
    """The mappings the schema keys by integer: the collective curves by group size
    (``curves.collectives.<op>``, ``planner.schema.curves.CollectiveCurves``), in a profile or
    a plan's embedded cluster."""
    from planner.schema.curves import CollectiveCurves

    parts = where.split(".")
    return len(parts) >= 2 and parts[-2] == "collectives" and parts[-1] in CollectiveCurves.model_fields


def _check_values(p: Path, data: Any) -> None:
    """Bound the parsed document: depth, count of values with aliases expanded, integer size."""
    stack = [(data, 0, "")]
    seen = 0
    while stack:
        node, depth, where = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InvalidPlan(str(p), f"{MAX_VALUES} values", "expands to more values than a profile holds "
                              "(YAML aliases repeating one another?)", "write the values out without aliases")
        if depth > MAX_DEPTH:
            raise _too_deep(p, where or "top level")
        if isinstance(node, dict):
            bad = [k for k in node if not isinstance(k, str)]
            if bad and _int_keyed(where):      # only where a non-string key was found
                bad = [k for k in bad if not isinstance(k, int) or isinstance(k, bool)]
            if bad:   # YAML reads `1:`, `on:` or `null:` as a non-string key, which no schema has
                raise InvalidPlan(f"{p.name}: {where or 'top level'}", f"key {bad[0]!r}",
                                  f"is {_KEY_KINDS.get(type(bad[0]), 'not a string')}, not a field name",
                                  "write field names as plain words (quote a key YAML reads as a number, "
                                  "boolean or null)")
            stack.extend((v, depth + 1, f"{where}.{k}" if where else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_INT:
            raise InvalidPlan(f"{p.name}: {where or 'value'}", f"{len(str(abs(node)))}-digit integer",
                              "is too large", "give a value below 2^62 in the unit the field names")
