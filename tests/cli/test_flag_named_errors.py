"""A refusal of a value the user typed as a flag names the flag (``--tp (3) must …``), not the schema
field the flag set (``plan.baseline.tp``); the same value read from a plan file keeps the file's
field path. One mapping, ``planner.cli.options.FLAG_OF_FIELD``, applied by ``planner.cli.main``."""

from __future__ import annotations

import json

import pytest
import yaml

from cli_lines import one_line
from planner import api, cli
from planner.cli.options import FLAG_OF_FIELD, typed_flags
from planner.schema import PlanFile
from planner.schema.knobs import KNOBS

MODEL = "gpt-oss-20b"
"""32 experts, 8 KV heads: E_p = 3, D = 3 and tp = 3 divide nothing on 8 GPUs."""
LAUNCH = [MODEL, "--gpus", "8", "--seq-len", "32k"]


@pytest.mark.parametrize("argv, line", [
    (["search", *LAUNCH, "--global-batch-tokens", "5", "--no-progress"],
     ("error: --global-batch-tokens (5) must be a multiple of the tokens per micro-step W·N (32768); "
      "fix: use e.g. 32768")),
    (["check", MODEL, "--gpus", "0", "--seq-len", "32k"],
     "error: --gpus (0) must be > 0; fix: give a value > 0"),
    (["check", MODEL, "--gpus", "12", "--seq-len", "32k"],
     ("error: --gpus (12) must be a multiple of cluster.topology.gpus_per_node (8) or smaller than it "
      "(whole nodes, or part of one); fix: use --gpus 8 or 16, or fix --gpus-per-node")),
    (["check", MODEL, "--gpus", "8", "--seq-len", "5000000000"],
     "error: --seq-len (5000000000) must be <= 4294967296; fix: give a value <= 4294967296"),
    (["check", *LAUNCH, "--seqs-per-microbatch", "0"],
     "error: --seqs-per-microbatch (0) must be > 0; fix: give a value > 0"),
    (["check", *LAUNCH, "--seq-parallel", "3"],
     "error: --seq-parallel (3) must divide world_size (8); fix: use one of 1, 2, 4, 8"),
    (["check", *LAUNCH, "--expert-parallel=3"],
     "error: --expert-parallel (3) must divide world_size (8); fix: use one of 1, 2, 4, 8"),
    (["check", *LAUNCH, "--max-chunks", "0"],
     "error: --max-chunks (0) must be > 0; fix: give a value > 0"),
    (["check", *LAUNCH, "--routing", "80/2"],
     ("error: --routing ('80/2') hot experts H (2) must be >= model.top_k (4): a top-k router never picks "
      "one expert twice for a token; fix: use H >= 4, or --routing worst")),
    (["check", *LAUNCH, "--baseline", "--tp", "3"],
     "error: --tp (3) must divide world_size (8); fix: use one of 1, 2, 4, 8"),
    (["check", *LAUNCH, "--baseline", "--cp", "3"],
     "error: --cp (3) times tp (1) must divide world_size (8); fix: lower --cp or --tp"),
    (["check", *LAUNCH, "--baseline", "--dp-shard", "3"],
     ("error: --dp-shard (3) times dp_replicate (1) times tp (1) times cp (1) must equal world_size (8); "
      "fix: drop --dp-shard to derive it")),
    (["check", *LAUNCH, "--baseline", "--expert-parallel", "3"],
     "error: --expert-parallel (3) must divide dp_shard·cp (8); fix: use one of 1, 2, 4, 8"),
    (["sweep", MODEL, "--gpus", "8", "--seq-lens", "32k,5000000000", "--no-progress"],
     "error: --seq-lens (5000000000) must be <= 4294967296; fix: give a value <= 4294967296"),
], ids=["global_batch_tokens", "gpus_zero", "gpus_whole_nodes", "seq_len", "seqs_per_microbatch",
        "seq_parallel", "expert_parallel_equals", "max_chunks", "routing", "tp", "cp", "dp_shard",
        "baseline_expert_parallel", "sweep_seq_lens"])
def test_a_typed_value_is_named_by_its_flag(argv, line, capsys):
    assert one_line(argv, capsys) == line


def test_json_error_names_the_flag(capsys):
    code = cli.main(["check", *LAUNCH, "--baseline", "--tp", "3", "--json"])
    captured = capsys.readouterr()
    assert code == 2
    doc = json.loads(captured.out)
    assert doc["field"] == "--tp" and doc["error"].startswith("--tp (3) must divide world_size (8)"), doc


def test_sco_host_gib_is_refused_in_gib_not_in_bytes(capsys):
    line = one_line(["check", *LAUNCH, "--sco-host-gib", "1e12"], capsys)
    assert line == ("error: --sco-host-gib (1000000000000.0) must be <= 1073741824 GiB (2^60 bytes); "
                    "fix: give a budget in GiB, e.g. 64")


def _plan_file(tmp_path, section: str, **changes) -> str:
    doc = api.build_planfile(model=MODEL, gpus=8, seq_len=1 << 15).model_dump(mode="json")
    {"plan": doc["plan"], "composed": doc["plan"]["composed"], "workload": doc["workload"]}[section].update(changes)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("section, changes, line", [
    ("composed", {"expert_parallel": 3},
     "error: plan.composed.expert_parallel (3) must divide world_size (8); fix: use one of 1, 2, 4, 8"),
    ("plan", {"world_size": 12},
     ("error: plan.world_size (12) must be a multiple of cluster.topology.gpus_per_node (8) or smaller than it "
      "(whole nodes, or part of one); fix: use --gpus 8 or 16, or fix --gpus-per-node")),
    ("workload", {"global_batch_tokens": 5},
     ("error: workload.global_batch_tokens (5) must be a multiple of the tokens per micro-step W·N (32768); "
      "fix: use e.g. 32768")),
    ("workload", {"seqs_per_microbatch": 0},
     "error: workload.seqs_per_microbatch (0) must be > 0; fix: give a value > 0"),
], ids=["expert_parallel", "world_size", "global_batch_tokens", "seqs_per_microbatch"])
def test_a_plan_file_value_keeps_the_files_field(section, changes, line, tmp_path, capsys):
    assert one_line(["check", "--plan", _plan_file(tmp_path, section, **changes)], capsys) == line


def test_a_flag_over_a_plan_file_is_named_by_the_flag_and_the_files_own_field_by_its_path(tmp_path, capsys):
    good = _plan_file(tmp_path, "composed")
    assert one_line(["check", "--plan", good, "--expert-parallel", "3"], capsys) == (
        "error: --expert-parallel (3) must divide world_size (8); fix: use one of 1, 2, 4, 8")
    bad = _plan_file(tmp_path, "composed", expert_parallel=3)
    # --gpus is typed, but the refused value is the file's expert_parallel: its path stays
    assert one_line(["check", "--plan", bad, "--gpus", "8"], capsys) == (
        "error: plan.composed.expert_parallel (3) must divide world_size (8); fix: use one of 1, 2, 4, 8")


def test_the_api_keeps_the_schema_path():
    from planner.errors import InvalidPlan

    with pytest.raises(InvalidPlan, match=r"^plan\.baseline\.tp \(3\) must divide world_size \(8\)") as e:
        api.check(model=MODEL, gpus=8, seq_len=1 << 15, overrides={"stack": "fsdp2", "tp": 3})
    assert e.value.field == "plan.baseline.tp"


def test_the_mapping_covers_every_knob_flag_and_names_real_fields():
    for k in KNOBS.values():
        if k.cli is not None and k.cli.parse != "gib":
            assert FLAG_OF_FIELD[k.path] == (k.flag,), k.name
    assert FLAG_OF_FIELD["plan.baseline.ep"] == ("--expert-parallel",)
    for path in FLAG_OF_FIELD:
        head, *rest = path.split(".")
        model = PlanFile
        for part in (head, *rest):
            assert part in model.model_fields, path
            model = model.model_fields[part].annotation
    assert "plan.composed.sco_host_bytes" not in FLAG_OF_FIELD      # bytes, not the flag's GiB


def test_typed_flags_read_the_command_line_as_click_does():
    assert typed_flags(["check", "m", "--tp=3", "--gpus", "8", "--", "--cp"]) == {"--tp", "--gpus"}
