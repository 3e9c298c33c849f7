"""``--convert`` of ``calibration.dispatch_kernels`` and ``calibration.memory_sizes``: a missing,
malformed or foreign JSON file is refused with one line that names it, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from calibration import dispatch_kernels, memory_sizes

SECTIONS = [(dispatch_kernels, "dispatch_kernels"), (memory_sizes, "memory_sizes")]


def _refused(mod, path, out, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        mod.main(["--convert", str(path), "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
    return err


@pytest.mark.parametrize("mod, name", SECTIONS)
def test_missing_file(mod, name, tmp_path, capsys):
    err = _refused(mod, tmp_path / "nope.json", tmp_path / "out", capsys)
    assert f"calibration.{name}: --convert" in err and "no such file" in err


@pytest.mark.parametrize("mod, name", SECTIONS)
def test_not_json(mod, name, tmp_path, capsys):
    p = tmp_path / "bad.json"
    p.write_text('{"runs": [')
    assert "is not JSON (line 1" in _refused(mod, p, tmp_path / "out", capsys)


@pytest.mark.parametrize("mod, name", SECTIONS)
def test_another_sections_run(mod, name, tmp_path, capsys):
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"provenance": {}, "cases": []}))
    err = _refused(mod, p, tmp_path / "out", capsys)
    assert f"(not a {name} run)" in err


def test_a_list_is_not_a_run(tmp_path, capsys):
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    assert "is not a JSON object" in _refused(memory_sizes, p, tmp_path / "out", capsys)
