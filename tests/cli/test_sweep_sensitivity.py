"""``planner sweep`` prints the routing sensitivity of every plan it shows (issue 13): the peak and
the HBM verdict under balanced, the named skew and worst routing, in the table, the CSV and --json."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from planner import api
from planner.budget.sensitivity import ROUTINGS
from planner.cli import app


def test_sweep_rows_carry_the_sensitivity_of_their_own_plan():
    rows = api.sweep(model="gpt-oss-20b", gpus=8, seq_lens=[32768, 131072])
    assert len(rows) == 4
    for r in rows:
        assert list(r.routing_sensitivity) == list(ROUTINGS)
        bal = r.routing_sensitivity["balanced"]
        assert bal["peak_bytes"] == r.peak_bytes          # the sweep's own routing is balanced
        assert r.routing_sensitivity["worst"]["peak_bytes"] >= bal["peak_bytes"]
        for v in r.routing_sensitivity.values():
            assert v["fits_hbm"] == (v["peak_bytes"] <= r.capacity_bytes)
    # standard EP (FSDP2's) grows with the skew at 128k when the fastest plan shards experts (ep > 1);
    # with ep = 1 no token moves, so the peak does not depend on the routing
    base = next(r for r in rows if r.stack == "fsdp2" and r.seq_len == 131072)
    worst, bal = base.routing_sensitivity["worst"]["peak_bytes"], base.routing_sensitivity["balanced"]["peak_bytes"]
    assert worst > bal if base.plan.baseline.ep > 1 else worst == bal


def test_sweep_json_and_table_show_it():
    res = CliRunner().invoke(app, ["sweep", "gpt-oss-20b", "--gpus", "8", "--seq-lens", "128k", "--json"])
    assert res.exit_code == 0, res.output
    recs = json.loads(res.output)
    assert {"peak_gib_balanced", "peak_gib_80_16", "peak_gib_worst", "fits_hbm_worst"} <= set(recs[0])
    res = CliRunner().invoke(app, ["sweep", "gpt-oss-20b", "--gpus", "8", "--seq-lens", "128k", "--no-progress"])
    assert res.exit_code == 0 and "peak GiB by routing" in res.output

