"""Profile files for calibration: the core's atomic writers plus a strict mapping reader.

``write_yaml_atomic`` / ``write_text_atomic`` / ``dump_yaml`` are the core's
(``planner.schema.io``): temp file in the same folder, fsync, ``os.replace``, fsync of the folder,
so an interrupted calibration leaves the old profile intact.
"""

from __future__ import annotations

import os
from pathlib import Path


from planner.errors import InvalidPlan, PlanError
from planner.schema.io import check_writable, dump_yaml, read_structured, write_text_atomic, write_yaml_atomic

__all__ = ["Interrupted", "command_line", "dump_yaml", "output_paths", "read_run", "read_yaml", "section_parser",
           "summary_path", "write_measurement", "write_outputs", "write_text_atomic", "write_yaml_atomic"]


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


class Interrupted(PlanError):
    """An interrupt after the profile was replaced: the profile is complete, the summary is not."""

    exit_code = 130


def summary_path(out_path) -> Path:
    """``<stem>.summary.md`` beside the profile ``out_path``."""
    out = Path(out_path)
    return out.with_name(f"{out.stem}.summary.md")


def output_paths(out_path) -> tuple[Path, Path]:
    """(profile, summary) paths, both checked writable before anything is measured. The summary is
    ``<stem>.summary.md`` beside the profile, so it never replaces the profile or a ``<stem>.md``.

    Raises:
        planner.errors.InvalidPlan: ``--out`` ends in ``.md`` (the summary's extension), or a path
            cannot be written.
    """
    check_writable(out_path, "--out")            # a folder (newdir/, .) is refused here
    out = Path(out_path)
    if out.suffix.lower() == ".md":
        raise InvalidPlan("--out", str(out), "ends in .md, the extension of the calibration summary",
                          "give the profile a .yaml name (its summary goes to <stem>.summary.md)")
    summary = summary_path(out)
    check_writable(summary, "--out (its summary)")
    return out, summary


def write_outputs(out: Path, summary: Path, profile: dict, text: str) -> None:
    """Profile then summary, each atomically; SIGTERM during the writes raises ``SystemExit`` so
    the temp file is removed (``write_bytes_atomic``'s ``finally``)."""
    import signal
    import threading

    def _term(signum, frame):
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _term) if main else None
    written = False
    try:
        write_yaml_atomic(out, profile, "--out")
        written = True
        write_text_atomic(summary, text, "--out (its summary)")
    except (KeyboardInterrupt, SystemExit):
        if written:
            raise Interrupted(f"interrupted after {out} was written (the profile is complete); its summary "
                              f"{summary} was not written") from None
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
