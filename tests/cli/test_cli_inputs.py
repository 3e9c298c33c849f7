"""Command-line inputs the commands refuse in one line (exit 2): an empty ``--out``/``--csv``,
an empty or repeated ``--seq-lens`` item, the plot and the CSV written to one file, and a MODEL that
is not the plan file's model, an integer too long to print, import-hf writing over its input, and --plot without matplotlib."""

from __future__ import annotations

from pathlib import Path

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


HUGE = "9" * 4301
"""An integer longer than Python prints by default (over 4300 digits): its error must still be one line."""


@pytest.mark.parametrize("flag", ["--seq-len", "--bucket-params", "--token-budget", "--global-batch-tokens"])
def test_an_integer_too_long_to_print_is_one_line(flag):
    args = ["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", flag, HUGE]
    if flag == "--seq-len":
        args = ["check", "gpt-oss-20b", "--gpus", "8", flag, HUGE]
    line = _refused(args, f"error: {flag} (an integer of 4301 digits) must be", "fix:")
    assert len(line) < 400


def test_import_hf_refuses_to_write_over_its_input(tmp_path):
    src = Path(__file__).resolve().parents[2] / "planner" / "profiles" / "hf-configs" / "olmoe-1b-7b-0924.json"
    cfg = tmp_path / "config.json"
    cfg.write_bytes(src.read_bytes())
    before = cfg.read_bytes()
    _refused(["import-hf", str(cfg), "-o", str(tmp_path / "." / "config.json")], "--output", "is the config being imported")
    assert cfg.read_bytes() == before
    assert cli.main(["import-hf", str(cfg), "-o", str(tmp_path / "m.yaml")]) == 0


def test_plot_without_matplotlib_is_refused_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    csv = tmp_path / "new" / "x.csv"
    _refused(["sweep", "gpt-oss-20b", "--gpus", "8", "--seq-lens", "32k", "--csv", str(csv),
              "--plot", str(tmp_path / "new" / "x.png")], "--plot", "needs matplotlib")
    assert not csv.exists()


def test_an_output_folder_that_cannot_be_created_is_refused_before_the_search(tmp_path):
    import time

    t0 = time.perf_counter()
    _refused(["search", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--no-progress",
              "--out", "/proc/no-such-folder/plan.yaml"], "--out", "cannot be created")
    assert time.perf_counter() - t0 < SEARCH_S, "refused before the search ran"
    # a missing folder that can be created is created by the write, and nothing is left by the check
    out = tmp_path / "new" / "deeper" / "plan.yaml"
    assert cli.main(["search", "olmoe-1b-7b", "--gpus", "4", "--seq-len", "32k", "--no-progress",
                     "--out", str(out)]) == 0
    assert out.is_file()


SEARCH_S = 5.0
"""Seconds the refusal may take: the gpt-oss-20b search it must not run takes about 8-15 s here."""


def test_baseline_scan_too_costly_to_plan_names_the_routing_not_a_flag_never_given():
    """Only the grid points the dispatch-free lower bound leaves are planned (628 here, at 256-token
    steps): still too many, so refused in one line naming the routing."""
    line = _refused(["max-context", "olmoe-1b-7b", "--gpus", "8", "--baseline", "--routing", "balanced",
                     "--seq-step", "256"], "--routing ('balanced')", "FSDP2 baseline", "--routing worst")
    assert "--dispatch" not in line and "628 shape(s)" in line


def test_baseline_scan_plans_only_the_points_its_lower_bound_leaves(capsys):
    """``max-context --baseline`` out of the box (it used to be refused: 4,096 shapes to plan): the
    pre-scan leaves 157 of 16,384 points, and the verdict is the planned points' (80/16 binds below
    the lower bound's 160,768)."""
    import json

    assert cli.main(["max-context", "olmoe-1b-7b", "--gpus", "8", "--baseline", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    g = doc["grid"]
    assert len(g["values"]) == 16384 and sum(g["peak_exact"]) == 157
    assert doc["max_seq_len"] == 87040 == max(v for v, ok in zip(g["values"], g["fits"]) if ok)
    assert not any(ok for ok, ex in zip(g["fits"], g["peak_exact"]) if not ex)


@pytest.mark.parametrize("args,flag", [
    (["max-context", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k"], "--seq-len"),
    (["max-batch", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", "--seqs-per-microbatch", "2"],
     "--seqs-per-microbatch"),
    (["max-context", "gpt-oss-20b", "--gpus", "8", "--global-batch-tokens", "5"], "--global-batch-tokens"),
    (["max-batch", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", "--global-batch-tokens", "1m"],
     "--global-batch-tokens")])
def test_the_scanned_quantity_cannot_also_be_given(args, flag):
    _refused(args, flag, "does not apply to", "fix: drop it")
