"""Profile files for calibration: the core's atomic writers plus a strict mapping reader.

``write_yaml_atomic`` / ``write_text_atomic`` / ``dump_yaml`` are the core's
(``planner.schema.io``): temp file in the same folder, fsync, ``os.replace``, fsync of the folder,
so an interrupted calibration leaves the old profile intact.
"""

from __future__ import annotations

import os
from pathlib import Path


from planner.schema.io import dump_yaml, read_structured, write_text_atomic, write_yaml_atomic

__all__ = ["command_line", "dump_yaml", "read_run", "read_yaml", "section_parser", "write_measurement", "write_text_atomic", "write_yaml_atomic"]


def command_line(launcher: str, argv: list[str] | None) -> str:
    """The command a measurement's provenance records: ``launcher`` (``python3 -m calibration.x``,
    ``torchrun … -m …``) and the arguments as given (``sys.argv[1:]`` when ``argv`` is None), quoted."""
    import shlex
    import sys

    args = sys.argv[1:] if argv is None else argv
    return " ".join([launcher, *(shlex.quote(a) for a in args)])


def section_parser(doc: str, stem: str, smoke_help: str, convert: bool = True):
    """The options of a standalone calibration section: ``--out`` (the folder of ``stem``.json /
    .md / .yaml), ``--smoke`` and, where the section can re-read an earlier run, ``--convert``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", required=True, help=f"folder for {stem}.json / .md / .yaml")
    ap.add_argument("--smoke", action="store_true", help=smoke_help)
    if convert:
        ap.add_argument("--convert", metavar="JSON", help="write the fragment of an earlier run's JSON (no measuring)")
    return ap


def write_measurement(out: Path, stem: str, doc: dict, markdown: str, fragment: dict) -> None:
    """A calibration section's outputs, each atomically: ``stem.json`` (the measurement), ``stem.md``
    (its summary, also printed) and ``stem.yaml`` (the profile fragment ``calibration.merge`` reads)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{stem}.json", json.dumps(doc, indent=1))
    write_text_atomic(out / f"{stem}.md", markdown)
    write_yaml_atomic(out / f"{stem}.yaml", fragment)
    print(markdown)
    print(f"wrote {out / (stem + '.json')} (and .md, .yaml) in {doc['wall_s']:.1f} s")


def read_yaml(path: str | os.PathLike) -> dict:
    """Load one YAML mapping.

    Raises:
        planner.errors.InvalidPlan: the file is missing or not a YAML mapping.
    """
    from planner.errors import InvalidPlan

    p = Path(path)
    data = read_structured(p)            # bounded: size, depth, aliases, integer size
    if not isinstance(data, dict):
        raise InvalidPlan("profile", str(p), "must hold one YAML mapping", "re-run `planner calibrate`")
    return data


def read_run(path: str, section: str, required: tuple[str, ...] = ()) -> dict:
    """An earlier run's JSON document for ``--convert``; a missing, unreadable or malformed file, or
    one without the ``required`` keys of that section's runs, exits 2 with one line naming it
    (``SystemExit``, no traceback)."""
    import json
    import sys

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        why = "no such file"
    except (OSError, UnicodeDecodeError) as e:
        why = f"cannot be read ({type(e).__name__})"
    except json.JSONDecodeError as e:
        why = f"is not JSON (line {e.lineno}: {e.msg})"
    else:
        missing = [k for k in required if k not in doc] if isinstance(doc, dict) else None
        if missing == []:
            return doc
        why = "is not a JSON object" if missing is None else f"has no {', '.join(map(repr, missing))} (not a {section} run)"
    print(f"calibration.{section}: --convert {path}: {why}; give the {section}.json an earlier run of "
          f"python3 -m calibration.{section} wrote", file=sys.stderr)
    raise SystemExit(2)

