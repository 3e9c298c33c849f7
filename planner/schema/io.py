"""Reading and writing profiles and plan files, with one-line errors for bad input.

- ``load_model(ref)``, ``load_cluster(ref)``, ``shipped(kind)``: ``planner.schema.profiles``.
- ``read_structured(path)``, ``validate(cls, data, prefix)``: ``planner.schema.documents``.
- ``load_planfile(path)``.
- ``write_yaml_atomic(path, data)``: temp file in the same folder, fsync, ``os.replace``;
  ``check_writable(path)`` fails fast before a long computation.

Every failure is an ``InvalidPlan`` naming the file or field, the value and the fix.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from planner.errors import InvalidPlan, UnwritableOutput
from planner.schema.cluster_ref import read_plan_document
from planner.schema.documents import read_structured, validate, validation_error  # noqa: F401 - re-exported
from planner.schema.documents import JSON_SUFFIX
from planner.schema.planfile import PlanFile
from planner.schema.profiles import (PROFILES_DIR, _looks_like_path, load_cluster, load_model,  # noqa: F401
                                     load_model_noted, shipped)
from planner.schema.read_bounds import MAX_DEPTH, MAX_FILE_BYTES, MAX_INT, MAX_VALUES  # noqa: F401 - re-exported


def load_planfile(path: str | Path) -> PlanFile:
    """Load a plan file (``search --out`` output); its cluster may be embedded or named by
    ``planner.schema.cluster_ref``."""
    return read_plan_document(str(path))[0]


def _unwritable(path: Path, field: str, why: str) -> UnwritableOutput:
    return UnwritableOutput(field, str(path), why, "give a file path in a folder you can write")


def _target(path: Path, field: str) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or for a symlink to a regular file
    the file it points to (the write goes through the link, which stays a link).

    Raises:
        UnwritableOutput: ``path`` exists and is not a regular file (a device node, a FIFO, a
            socket, a directory) or is a symlink to one or to nothing: an output never replaces
            what is not a plain file.
    """
    try:
        link = path.is_symlink()
    except OSError as e:      # a name the file system refuses (longer than 255 bytes, or 4096 in all)
        raise _unwritable(path, field, f"cannot be written: {e.strerror or e}") from None
    if link:
        real = Path(os.path.realpath(path))
        if not real.exists() and path.exists():   # /dev/stdout: a /proc magic link to a pipe or a terminal
            raise UnwritableOutput(field, str(path), "is a link to a stream (a pipe or a terminal), not a regular file",
                                   "give a file name; the file is written whole, atomically")
        if not real.exists():
            raise UnwritableOutput(field, str(path), "is a symlink to nothing",
                                   "give a regular file or a new file name")
        if not real.is_file():
            raise UnwritableOutput(field, str(path), f"is a symlink to something that is not a regular file ({real})",
                                   "give a regular file or a new file name")
        return real
    try:
        st = path.lstat()
    except FileNotFoundError:
        return path
    except OSError:
        return path  # the folder cannot be searched: the write reports it
    if stat.S_ISDIR(st.st_mode):
        raise _unwritable(path, field, "is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise UnwritableOutput(field, str(path), "exists and is not a regular file (a device, FIFO or socket)",
                               "give a regular file or a new file name")
    return path


def check_writable(path: str | Path, field: str = "output") -> Path:
    """Fail fast (before a long computation) when ``path`` cannot be written as a file.

    Tries what ``write_bytes_atomic`` will do: a temp file in the target's folder, removed at once.

    Raises:
        InvalidPlan: ``path`` is a directory or another thing that is not a regular file (see
            ``_target``), its folder is not a directory, or the folder refuses a new file (a
            missing folder: the nearest existing one refuses new folders).
    """
    if not str(path).strip():                  # Path("") is "."; name what was given
        raise InvalidPlan(field, str(path), "is an empty path", f"give a file name, e.g. {field} out.yaml")
    if str(path).endswith(("/", os.sep)) or Path(path).name in ("", ".", ".."):   # newdir/, ., .., /
        raise InvalidPlan(field, str(path), "names a folder, not a file", f"give a file name, e.g. {field} out.yaml")
    p = _target(Path(path), field)
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise _unwritable(p, field, f"has a parent that is not a folder ({parent})")
    if parent.is_dir():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
        except OSError as e:
            raise _unwritable(p, field, f"cannot be written: {e.strerror or e}") from None
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
    else:   # the write will create the missing folders: try the first one now, and remove it
        first = next(a for a in (parent, *parent.parents) if a.parent.exists())
        try:
            first.mkdir()
        except OSError as e:
            raise _unwritable(p, field, f"needs the folder {first}, which cannot be created: "
                                        f"{e.strerror or e}") from None
        first.rmdir()
    return p


def write_bytes_atomic(path: str | Path, data: bytes, field: str = "output") -> Path:
    """Write bytes atomically: temp file in the target's own folder, fsync, ``os.replace``, fsync of
    the folder.

    The file keeps an existing file's mode, else gets 0666 less the umask (``mkstemp`` alone gives
    0600). An interrupted write leaves the old file intact and no temp file behind; no temp file is
    ever created outside the target's folder. A symlink to a regular file is written through (the
    file it points to is replaced, the link stays); anything else that exists and is not a regular
    file (a device node, a FIFO, a socket, a dangling symlink) is refused, never replaced.

    Raises:
        UnwritableOutput: (an ``InvalidPlan`` and an ``OSError``) ``path`` is a directory, is not a
            regular file, or cannot be written (``field`` names the option).
    """
    p = _target(Path(path), field)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = f"cannot be written: its folder cannot be created ({e.strerror or e})"
        raise _unwritable(p, field, why) from None
    if p.exists():
        mode = p.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise _unwritable(p, field, f"cannot be written: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(p, field, f"cannot be written: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return p


def write_text_atomic(path: str | Path, text: str, field: str = "output") -> Path:
    """Write UTF-8 text atomically (see ``write_bytes_atomic``)."""
    return write_bytes_atomic(path, text.encode("utf-8"), field)


class _Dumper(yaml.SafeDumper):
    """Safe YAML with scalar lists in flow style (``[1, 2, 3]``) so rate tables stay readable."""


def _represent_list(dumper: yaml.SafeDumper, data):
    flow = all(not isinstance(v, (list, tuple, dict)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", list(data), flow_style=flow)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(tuple, _represent_list)


def dump_yaml(data: Any) -> str:
    """YAML text of plain data, keys in insertion order, scalar lists in flow style."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def structured_text(path: str | Path, data: Any, yaml_text: str | None = None) -> str:
    """``data`` in the format ``path`` is read back in (``read_structured``): JSON for a ``.json``
    path, else YAML (``yaml_text`` when given, or ``dump_yaml``)."""
    if Path(path).suffix == JSON_SUFFIX:
        return json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    return dump_yaml(data) if yaml_text is None else yaml_text


def write_yaml_atomic(path: str | Path, data: Any, field: str = "output") -> Path:
    """Write ``data`` atomically (see ``write_bytes_atomic``): YAML, or JSON for a ``.json`` path
    (``structured_text``), so that a profile or plan written there reads back."""
    return write_text_atomic(path, structured_text(path, data), field)
