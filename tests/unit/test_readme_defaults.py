"""``--help`` points every derived knob default at README "Defaults": that table lists exactly the
knobs whose default is derived, each with its flag."""

from __future__ import annotations

import re
from pathlib import Path

from planner.schema.knobs import KNOBS, flag_of

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text()
    m = re.search(r"^### Defaults\n(.*?)^#", text, flags=re.S | re.M)
    assert m, "README has a '### Defaults' section"
    return m.group(1)


def test_the_defaults_table_lists_every_derived_knob():
    derived = {k.name for k in KNOBS.values()
               if k.default is None and (k.cli is None or k.cli.show_default is None)}
    rows = set(re.findall(r"^\| `(\w+)`", _section(), flags=re.M))
    assert derived and rows == derived


def test_each_row_names_the_knobs_flag():
    sec = _section()
    for k in KNOBS.values():
        if k.default is None and k.cli is not None and k.cli.show_default is None:
            flag = flag_of(k.name)
            assert f"`{flag}`" in sec, flag
