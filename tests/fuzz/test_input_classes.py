"""One generator per class of bad input (issue 10: 3, 3a–3e, 4, 5): each generates many inputs of
its class and asserts exit 2, one ``error:`` line on stderr, no traceback and a run under
``RUN_LIMIT_S``. Inputs are drawn from seeded generators over the shipped profiles, so a failure
names a reproducible case.
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import pytest
import yaml

from planner import api, cli
from planner.errors import InvalidPlan
from planner.schema.io import MAX_DEPTH, PROFILES_DIR

RUN_LIMIT_S = 10.0
"""Every bad input is refused within this many seconds."""
SEED = 10
WRAP_CASES = 16
"""Generated configurations of the no-wrap property (each a full check)."""
MODEL_YAML = (PROFILES_DIR / "models" / "gpt-oss-20b.yaml").read_text()
MLA_YAML = (PROFILES_DIR / "models" / "deepseek-v2-lite.yaml").read_text()
CLUSTER = yaml.safe_load((PROFILES_DIR / "clusters" / "h200.yaml").read_text())
BASE = ["--gpus", "8", "--seq-len", "8k"]


def _refused(args: list[str], capsys) -> str:
    t = time.perf_counter()
    code = cli.main(args)
    took = time.perf_counter() - t
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert code == 2, (args[:6], code, cap.err[-400:])
    assert "Traceback" not in cap.err, cap.err[-400:]
    assert len(lines) == 1 and lines[0].startswith("error:"), cap.err[:400]
    assert len(lines[0]) < 2000, len(lines[0])
    assert not any(ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0 for ch in lines[0]), repr(lines[0][:200])
    assert took < RUN_LIMIT_S, (args[:6], took)
    return lines[0]


def _write(tmp_path, name: str, text: str | bytes) -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


def _model(**fields) -> str:
    d = yaml.safe_load(MODEL_YAML)
    d.update(fields)
    return yaml.safe_dump(d)


def _cluster(mutate) -> str:
    d = json.loads(json.dumps(CLUSTER))
    mutate(d)
    return yaml.safe_dump(d)


# ---- 3. files that crash or hang the reader -------------------------------------------------------
def _deep(rng: random.Random) -> tuple[str, str]:
    depth = rng.choice([MAX_DEPTH + 1, 100, 1000, 20_000, 200_000])
    style = rng.choice(["json_list", "json_map", "yaml_flow", "yaml_block"])
    if style == "json_list":
        return "deep.json", "[" * depth + "]" * depth
    if style == "json_map":
        return "deep.json", '{"a":' * depth + "1" + "}" * depth
    if style == "yaml_flow":
        return "deep.yaml", "[" * depth + "]" * depth
    depth = min(depth, 3000)
    return "deep.yaml", "".join("  " * i + "a:\n" for i in range(depth)) + "  " * depth + "1\n"


def _bomb(rng: random.Random) -> tuple[str, str]:
    width, levels = rng.randint(6, 12), rng.randint(7, 10)
    text = "a0: &a0 [" + ", ".join(['"x"'] * width) + "]\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]\n"
    return "bomb.yaml", text


def _big_int(rng: random.Random) -> tuple[str, str]:
    digits = rng.choice([20, 40, 300, 1000, 5000])
    n = "9" * digits
    where = rng.choice(["model", "cluster"])
    if where == "model":
        field = rng.choice(["hidden_size", "num_layers", "vocab_size", "num_experts", "expert_ffn"])
        return "model.yaml", MODEL_YAML.replace(f"\n{field}:", f"\n{field}: {n}\n_old_{field}:", 1)
    text = _cluster(lambda d: d["topology"].update(
        {rng.choice(["hbm_bytes", "host_ram_bytes", "gpus_per_node"]): 123456789123456789}))
    return "cluster.yaml", text.replace("123456789123456789", n)


@pytest.mark.parametrize("case", range(24))
def test_files_that_crashed_or_hung_the_reader(case, tmp_path, capsys):
    rng = random.Random(SEED * 1000 + case)
    name, text = [_deep, _bomb, _big_int][case % 3](rng)
    path = _write(tmp_path, name, text)
    args = ["check", path, *BASE] if name != "cluster.yaml" else ["check", "gpt-oss-20b", *BASE, "--cluster", path]
    _refused(args, capsys)


def test_files_that_are_not_regular_or_too_large(tmp_path, capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(17 << 20)
    (tmp_path / "d.yaml").mkdir()
    for path, words in ((fifo, "not a regular file"), ("/dev/null", "not a regular file"),
                        (tmp_path / "d.yaml", ("is a directory", "is a folder")), (big, "larger than"),
                        (tmp_path / "missing.yaml", "does not exist")):
        for args in (["check", str(path), *BASE], ["check", "gpt-oss-20b", *BASE, "--cluster", str(path)],
                     ["check", "--plan", str(path)]):
            line = _refused(args, capsys)
            assert any(w in line for w in ((words,) if isinstance(words, str) else words)), line


# ---- 3a. constants that wrap int64 ---------------------------------------------------------------
OUTSIDE_ALLOCATOR = ("cuda_context_bytes", "nccl_buffer_bytes")
"""Constants subtracted from the HBM before any verdict (``planner.budget.peak.outside_allocator_bytes``)."""
MEMORY_BYTES = ["cuda_context_bytes", "nccl_buffer_bytes", "cublas_workspace_bytes", "cublaslt_workspace_bytes",
                "host_baseline_bytes_per_rank", "flash_workspace_bytes_per_elem"]


@pytest.mark.parametrize("case", range(16))
def test_cluster_constants_near_int64_are_refused(case, tmp_path, capsys):
    rng = random.Random(SEED * 2000 + case)
    value = rng.choice([2 ** 63 - 1, 9.2e18, 1.15e18, 2 ** 51, 1e30, 2 ** 62])
    if case % 2:
        name = rng.choice(MEMORY_BYTES)
        text = _cluster(lambda d: d["memory"][name].update(value=value))
    else:
        key = rng.choice(["hbm_bytes", "host_ram_bytes"])
        text = _cluster(lambda d: d["topology"].update({key: int(value) * 64}))
    _refused(["check", "gpt-oss-20b", *BASE, "--cluster", _write(tmp_path, "c.yaml", text)], capsys)


def test_no_evaluated_byte_count_is_negative_or_wrapped():
    """Inputs drawn at and near every bound: each is refused, or every byte count is >= 0 and every
    phase total equals the exact (Python integer) sum of its terms, and the host sum its parts."""
    rng = random.Random(SEED)
    fitted = 0
    for _ in range(WRAP_CASES):
        fields = dict(hidden_size=rng.choice([64, 4096, 1 << 16, 1 << 20]),
                      vocab_size=rng.choice([1000, 1 << 18, 1 << 24]),
                      num_layers=rng.choice([1, 2, 24]),
                      expert_ffn=rng.choice([16, 2880, 1 << 20]), num_experts=rng.choice([32, 1024, 1 << 14]))
        try:
            from planner.schema import ModelSpec
            spec = yaml.safe_load(MODEL_YAML) | fields
            spec.pop("local_layers", None)
            ModelSpec(**spec)
        except InvalidPlan:
            continue
        W = rng.choice([8, 64])
        S = rng.choice([1 << 13, 1 << 20, 1 << 26]) * W // 8
        c = json.loads(json.dumps(CLUSTER))
        for name in MEMORY_BYTES[:-1]:
            c["memory"][name]["value"] = rng.choice([0, 2 ** 40, 2 ** 50])
        for name in OUTSIDE_ALLOCATOR:   # at most the HBM between them (more is refused: no capacity)
            c["memory"][name]["value"] = rng.choice([0, c["topology"]["hbm_bytes"] // 4])
        c["topology"]["host_ram_bytes"] = rng.choice([2 ** 40, 2 ** 56])
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            cp, mp = os.path.join(d, "c.yaml"), os.path.join(d, "m.yaml")
            with open(cp, "w") as f:
                yaml.safe_dump(c, f)
            with open(mp, "w") as f:
                yaml.safe_dump(spec, f)
            try:
                rep = api.check(model=mp, cluster=cp, gpus=W, seq_len=S)
            except InvalidPlan:
                continue
        fitted += 1
        ev = rep.evaluation
        tb = np.asarray(ev.term_bytes)
        assert (tb >= 0).all()
        for p in range(tb.shape[1]):
            assert sum(int(x) for x in tb[:, p].reshape(-1)) == int(np.asarray(ev.by_phase)[p])
        h = rep.host
        assert int(h.bytes) >= 0
        assert int(h.bytes) == int(h.baseline_bytes) + int(h.optimizer_bytes) + int(h.sco_bytes)
        assert 0 <= rep.peak_bytes < 2 ** 62
    assert fitted >= 3, fitted


# ---- 3b. fields that contradict each other -------------------------------------------------------
@pytest.mark.parametrize("case", range(12))
def test_contradictory_attention_fields_are_refused(case, tmp_path, capsys):
    rng = random.Random(SEED * 3000 + case)
    kind = case % 3
    if kind == 0:   # MLA head dims that disagree with its ranks
        d = yaml.safe_load(MLA_YAML)
        d[rng.choice(["head_dim", "v_head_dim"])] = rng.choice([1, 7, 100, 4096])
    elif kind == 1:  # gqa / mha beside an mla block
        d = yaml.safe_load(MLA_YAML)
        d["attention"] = rng.choice(["gqa", "mha"])
    else:           # mha with fewer KV heads
        d = yaml.safe_load(MODEL_YAML)
        d["attention"] = "mha"
        d["num_kv_heads"] = rng.choice([1, 2, 4, 8])
    line = _refused(["check", _write(tmp_path, "m.yaml", yaml.safe_dump(d)), *BASE], capsys)
    assert "model." in line


# ---- 3c. check on a Hugging Face config keeps the importer's warnings ----------------------------
@pytest.mark.parametrize("source,mutate", [
    ("olmoe-1b-7b-0924.json", lambda d: d.update(num_experts=0)),
    ("olmoe-1b-7b-0924.json", lambda d: d.pop("tie_word_embeddings")),
    ("llama-4-scout-17b-16e.json", lambda d: None),
    ("olmoe-1b-7b-0924.json", lambda d: d.update(model_type="unheard_of_moe"))],
    ids=["dense", "tied_missing", "vision_tower", "unknown_family"])
def test_check_on_hf_config_prints_importer_warnings(source, mutate, tmp_path, capsys):
    d = json.loads((PROFILES_DIR / "hf-configs" / source).read_text())
    mutate(d)
    path = _write(tmp_path, "config.json", json.dumps(d))
    from planner.schema.hf_import import import_hf
    _, warnings = import_hf(d, name="x")
    assert warnings
    cli.main(["check", path, *BASE, "--json"])
    cap = capsys.readouterr()
    got = json.loads(cap.out)["warnings"]
    assert got[:len(warnings)] == warnings            # the importer's first, then the check's own
    assert all("released context" in w for w in got[len(warnings):])
    for w in warnings:
        assert f"warning: {w}" in cap.err


# ---- 3d. inputs that ran for minutes or exhausted memory -----------------------------------------
@pytest.mark.parametrize("case", range(10))
def test_costly_inputs_are_refused_fast(case, tmp_path, capsys):
    rng = random.Random(SEED * 4000 + case)
    kind = case % 5
    if kind == 0:
        args = ["check", _write(tmp_path, "m.yaml", _model(name="n" * rng.choice([200, 10_000, 100_000]))), *BASE]
    elif kind == 1:
        key = "k" * rng.choice([1000, 1_000_000, 5_000_000])
        args = ["check", _write(tmp_path, "m.yaml", MODEL_YAML + f"{key}: 1\n"), *BASE]
    elif kind == 2:
        E = rng.choice([1024, 4096, 16384])
        args = ["check", _write(tmp_path, "m.yaml", _model(num_experts=E)), "--gpus", str(E), "--seq-len", "1m",
                "--dispatch-bound", "expected", "--routing", rng.choice(["80/16", "worst"])]
    elif kind == 3:
        args = ["max-context", "gpt-oss-20b", "--gpus", str(rng.choice([8, 4096])), "--dispatch-bound", "expected",
                "--routing", "80/16"]
    else:
        args = ["check", _write(tmp_path, "m.yaml", _model(num_experts=rng.choice([65536, 1 << 20]))), *BASE]
    _refused(args, capsys)


# ---- 3e. other escapes -----------------------------------------------------------------------------
@pytest.mark.parametrize("case", range(12))
def test_other_escapes(case, tmp_path, capsys):
    rng = random.Random(SEED * 5000 + case)
    kind = case % 4
    if kind == 0:   # huge model fields: the model field is named, not the sequence length
        field = rng.choice(["hidden_size", "vocab_size", "expert_ffn", "num_heads"])
        line = _refused(["check", _write(tmp_path, "m.yaml", _model(**{field: 10 ** rng.randint(8, 15)})), *BASE],
                        capsys)
        assert "model." in line and "seq_len" not in line
    elif kind == 1:  # control characters in a name
        name = "a" + rng.choice(["\x1b[31m", "\x07", "\n", "\x9b2J", "\r"]) + "b"
        _refused(["check", _write(tmp_path, "m.yaml", _model(name=name)), *BASE], capsys)
    elif kind == 2:  # booleans for float fields
        what = rng.choice(["pin_seconds_per_gib", "reserve_fraction", "host_reserve_fraction"])
        text = _cluster(lambda d: d["memory"][what].update(value=True))
        _refused(["check", "gpt-oss-20b", *BASE, "--cluster", _write(tmp_path, "c.yaml", text)], capsys)
    else:           # fractional parameter counts
        _refused(["check", "gpt-oss-20b", *BASE, "--bucket-params", rng.choice(["16.9", "0.5", "1.00001k"])], capsys)


# ---- 4. sizes and values that were accepted silently -------------------------------------------
FRACTIONAL = [["--seq-len", "1.5m"], ["--seq-len", "0.5k"], ["--token-budget", "0.5k"],
              ["--global-batch-tokens", "1.5m"], ["--token-budget", "2.25k"]]
ROUTINGS = ["0/1", "0/16", "٨٠/16", "８０/16", "80/١٦", "101/16", "80/0", "-1/4", "80/16/2", "1e1/4"]


@pytest.mark.parametrize("case", range(len(FRACTIONAL) + len(ROUTINGS) + 6))
def test_sizes_and_values_accepted_silently(case, tmp_path, capsys):
    if case < len(FRACTIONAL):
        args = ["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "8k", *FRACTIONAL[case]]
        if FRACTIONAL[case][0] == "--seq-len":
            args = ["check", "gpt-oss-20b", "--gpus", "8", *FRACTIONAL[case]]
    elif case < len(FRACTIONAL) + len(ROUTINGS):
        args = ["check", "gpt-oss-20b", *BASE, "--routing", ROUTINGS[case - len(FRACTIONAL)]]
    else:
        i = case - len(FRACTIONAL) - len(ROUTINGS)
        args = [
            ["check", "gpt-oss-20b", *BASE, "--cluster", ""],
            ["check", "gpt-oss-20b", *BASE, "--cluster", "  "],
            ["search", "gpt-oss-20b", *BASE, "--top", str(10 ** 30), "--no-progress"],
            ["search", "gpt-oss-20b", *BASE, "--top", "1001", "--no-progress"],
            ["check", "gpt-oss-20b", *BASE, "--cluster", _write(tmp_path, "c.yaml", _cluster(
                lambda d: d["topology"].update(host_mem_bw_bytes_per_s=float("inf"))))],
            ["check", "gpt-oss-20b", *BASE, "--cluster", _write(tmp_path, "c2.yaml", _cluster(
                lambda d: d["memory"]["pin_seconds_per_gib"].update(value=float("inf"))))],
        ][i]
    _refused(args, capsys)


# ---- 5. knobs that do nothing in the chosen plan ---------------------------------------------------
INERT = [(["--checkpoint", "none"], ["--sco-host-gib", "10"]), (["--checkpoint", "per_layer"], ["--sco-host-gib", "1"]),
         (["--vocab", "dense"], ["--vocab-blocks", "4"]), (["--vocab", "vocab_parallel"], ["--vocab-blocks", "2"]),
         (["--vocab", "dense"], ["--vocab-parallel", "2"]), (["--optimizer", "gpu"], ["--bucket-params", "50M"]),
         (["--optimizer", "cpu_offload"], ["--staging-slots", "3"]), (["--dispatch", "ep"], ["--token-budget", "2k"]),
         (["--dispatch", "llep"], ["--max-chunks", "4"]), (["--dispatch", "ep"], ["--llep-alpha", "1.5"]),
         (["--dispatch", "ep"], ["--max-imports", "2"])]


@pytest.mark.parametrize("choice,knob", INERT, ids=[f"{a[1]}-{b[0]}" for a, b in INERT])
def test_knobs_that_do_nothing_are_refused(choice, knob, capsys):
    for args in (["check", "gpt-oss-20b", *BASE, *choice, *knob], ["check", "gpt-oss-20b", *BASE, *knob, *choice]):
        line = _refused(args, capsys)
        assert knob[0] in line and "does nothing" in line


def test_seq_len_that_forces_d1_warns_in_one_line(capsys):
    code = cli.main(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "100001"])
    err = capsys.readouterr().err
    warns = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert code == 0 and len(warns) == 1 and "D = 1" in warns[0], err


# ---- 3f. calibrate --out ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", range(8))
def test_calibrate_out_is_refused_before_measuring(case, tmp_path, capsys):
    pytest.importorskip("torch")
    rng = random.Random(SEED * 6000 + case)
    kind = case % 4
    if kind == 0:
        out = str(tmp_path / rng.choice(["prof.md", "x.MD", "a.b.md"]))
    elif kind == 1:
        (tmp_path / "d.yaml").mkdir()
        out = str(tmp_path / "d.yaml")
    elif kind == 2:
        (tmp_path / "f").write_text("")
        out = str(tmp_path / "f" / "prof.yaml")                 # parent is a file
    else:
        (tmp_path / "p.summary.md").mkdir()                    # the summary's path is a folder
        out = str(tmp_path / "p.yaml")
    line = _refused(["calibrate", "--quick", "--no-progress", "--out", out], capsys)
    assert "--out" in line


def test_calibrate_outputs_never_clobber_and_interrupts_say_what_was_written(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from calibration import io as cal_io

    out = tmp_path / "prof.yaml"
    (tmp_path / "prof.md").write_text("unrelated notes")
    o, summary = cal_io.output_paths(out)
    assert summary.name == "prof.summary.md"
    cal_io.write_outputs(o, summary, {"a": 1}, "# summary")
    assert (tmp_path / "prof.md").read_text() == "unrelated notes"
    assert yaml.safe_load(out.read_text()) == {"a": 1} and summary.read_text() == "# summary"

    def interrupt(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cal_io, "write_text_atomic", interrupt)     # after the profile's rename
    with pytest.raises(cal_io.Interrupted, match="was written .* summary .* was not written"):
        cal_io.write_outputs(o, summary, {"a": 2}, "# new")
    assert yaml.safe_load(out.read_text()) == {"a": 2}
    monkeypatch.setattr(os, "fsync", interrupt)                       # during the profile's write
    with pytest.raises(KeyboardInterrupt):
        cal_io.write_outputs(o, summary, {"a": 3}, "# new")
    assert yaml.safe_load(out.read_text()) == {"a": 2}                 # old profile intact
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
