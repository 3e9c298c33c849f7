"""Command-line inputs the commands refuse in one line (exit 2): an empty ``--out``/``--csv``,
an empty or repeated ``--seq-lens`` item, the plot and the CSV written to one file, and a MODEL that
is not the plan file's model."""

from __future__ import annotations

import pytest

from planner import cli

CAPS = None


@pytest.fixture(autouse=True)
def _caps(capsys):
    global CAPS
    CAPS = capsys


def _refused(args: list[str], *needles: str) -> str:
    code = cli.main(args)
    err = CAPS.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_search_refuses_an_empty_out():
    _refused(["search", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "32k", "--out", "", "--no-progress"],
             "--out", "empty path")


@pytest.mark.parametrize("lens, why", [("32k,,64k", "empty item"), ("32k,32k", "twice"), (",", "empty item")])
def test_sweep_refuses_empty_and_repeated_lengths(lens, why):
    _refused(["sweep", "olmoe-1b-7b", "--gpus", "8", "--seq-lens", lens, "--no-progress"], "--seq-lens", why)


def test_sweep_refuses_one_file_for_plot_and_csv(tmp_path):
    p = str(tmp_path / "same.png")
    _refused(["sweep", "olmoe-1b-7b", "--gpus", "8", "--seq-lens", "32k", "--csv", p, "--plot", p, "--no-progress"],
             "--plot", "same file as --csv")
    assert not (tmp_path / "same.png").exists()


def test_check_refuses_a_model_that_is_not_the_plans(tmp_path):
    plan = tmp_path / "p.yaml"
    cli.main(["search", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", "--out", str(plan), "--no-progress"])
    searched = CAPS.readouterr().err  # the search's own output
    assert plan.exists(), searched
    _refused(["check", "olmoe-1b-7b", "--plan", str(plan)], "MODEL", "gpt-oss-20b")
    assert cli.main(["check", "gpt-oss-20b", "--plan", str(plan)]) in (0, 1)
