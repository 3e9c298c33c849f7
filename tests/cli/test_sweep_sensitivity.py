"""``planner sweep`` prints the routing sensitivity of every plan it shows (issue 13): the peak and
the HBM verdict under balanced, the named skew and worst routing, in the table, the CSV and --json."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from planner import api
from planner.api.build import build_planfile
from planner.budget.build import make_context
from planner.budget.fsdp2_saved import routed_rows_excess
from planner.budget.sensitivity import ROUTINGS, routing_sensitivity
from planner.plans.routing import NAMED_SKEW
from planner.cli import app


def test_sweep_rows_carry_the_sensitivity_of_their_own_plan():
    rows = api.sweep(model="gpt-oss-20b", gpus=8, seq_lens=[32768, 131072])
    assert len(rows) == 4
    for r in rows:
        assert list(r.routing_sensitivity) == list(ROUTINGS)
        bal = r.routing_sensitivity["balanced"]
        # the row's verdict uses its plan's default routing: balanced under PipelinedLLEP's
        # guarantee, the named skew for the FSDP2 baseline's EP all-to-all (no launch-time bound)
        own = "balanced" if r.stack == "composed" and r.plan.composed.dispatch == "pipelined_llep" else NAMED_SKEW
        assert r.plan.routing == own and r.routing_basis["default"]
        assert r.routing_sensitivity[own]["peak_bytes"] == r.peak_bytes
        assert r.routing_sensitivity["worst"]["peak_bytes"] >= bal["peak_bytes"]
        for v in r.routing_sensitivity.values():
            assert v["fits_hbm"] == (v["peak_bytes"] <= r.capacity_bytes)
    # an FSDP2 row whose experts are all local (ep = 1) receives N·k rows under every routing (no
    # excess rows), and moves only with the per-expert blocks of its expert loop (one expert's block
    # under worst routing holds N rows); one with ep > 1 grows with the skew (no launch-time bound)
    for r in rows:
        if r.stack == "fsdp2":
            sens = r.routing_sensitivity
            if r.plan.baseline.ep == 1:
                assert sens["worst"]["peak_bytes"] >= sens["balanced"]["peak_bytes"]
                pf = build_planfile(model="gpt-oss-20b", gpus=8, seq_len=r.seq_len)
                for routing in ROUTINGS:
                    ctx = make_context(pf.model, pf.cluster, pf.workload, r.plan.model_copy(update={"routing": routing}))
                    assert int(np.max(routed_rows_excess(ctx))) == 0, routing
            else:
                assert sens["worst"]["peak_bytes"] > sens["balanced"]["peak_bytes"]
    # without checkpointing every layer's saved expert rows are sized by the routing too
    pf = build_planfile(model="gpt-oss-20b", gpus=8, seq_len=8192, overrides={"stack": "fsdp2", "ep": 8, "ac": "none"})
    sens = routing_sensitivity(pf.model, pf.cluster, pf.workload, pf.plan)
    assert sens["worst"]["peak_bytes"] > sens[NAMED_SKEW]["peak_bytes"] > sens["balanced"]["peak_bytes"]


def test_sweep_json_and_table_show_it():
    res = CliRunner().invoke(app, ["sweep", "gpt-oss-20b", "--gpus", "8", "--seq-lens", "128k", "--json"])
    assert res.exit_code == 0, res.output
    recs = json.loads(res.output)
    assert {"peak_gib_balanced", "peak_gib_80_16", "peak_gib_worst", "fits_hbm_worst", "routing"} <= set(recs[0])
    assert {r["stack"]: r["routing"] for r in recs}["fsdp2"] == NAMED_SKEW
    res = CliRunner().invoke(app, ["sweep", "gpt-oss-20b", "--gpus", "8", "--seq-lens", "128k", "--no-progress"])
    assert res.exit_code == 0 and "peak GiB by routing" in res.output

