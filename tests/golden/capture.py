"""Golden outputs of the planner's ``--json`` commands, to show a refactor changes no result.

    python3 tests/golden/capture.py capture   # (re)write tests/golden/outputs/
    python3 tests/golden/capture.py compare   # rerun, report every byte difference, exit 1 on any

Runs ``planner check --json`` on every shipped model on both stacks, and ``search``, ``sweep``,
``max-context`` and ``max-batch`` on three models, each as its own ``python3 -m planner.cli``
process from the repository root (so the tree's ``planner`` is the one measured).

Nondeterministic fields, handled explicitly (``VOLATILE``): ``search``'s ``elapsed_s`` (wall time
of the search) is replaced by ``"<volatile>"`` before storing and comparing. Nothing else varies between runs: the FSDP2 time model once iterated a
``set`` of breakdown names (its sums followed ``PYTHONHASHSEED``; fixed, and
``tests/cli/test_hash_seed_output.py`` holds it); every command still runs with ``PYTHONHASHSEED=0``
(``HASH_SEED``) so that a new hash-order dependence cannot hide in the golden set. The compare reports
any other difference byte for byte.

Recaptured after the deliberate result changes of the fidelity work (the default routing of unbounded
dispatch, the per-phase memory terms fixed against the H200 allocator history, the recalibrated time
model); a refactor keeps them byte-identical. The ``check`` outputs were recaptured alone when its
``--json`` gained ``headroom_fraction``, ``min_headroom`` and ``under_min_headroom`` (three added
lines each, nothing else moved). The composed ``check`` outputs and two sweeps were recaptured alone
when Ring-DTP's backward began carrying ``(m, scale/z, scale)`` instead of ``(lse, scale)`` (the
vocab live set's terms and bytes moved, 12 B per token; no verdict changed). The nine ``max-context``
and ``max-batch`` outputs were recaptured alone when their ``--json`` grid gained ``peak_exact`` (the
FSDP2 baseline's dispatch-free pre-scan; added lines only, nothing else moved).
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = Path(__file__).resolve().parent / "outputs"
TIMEOUT_S = 120
"""Per command; every command here runs in a few seconds."""

MODELS = sorted(p.stem for p in (ROOT / "planner" / "profiles" / "models").glob("*.yaml"))
CHECK_ARGS = ["--gpus", "64", "--seq-len", "128k"]
"""One launch every shipped model is checked at (fits or not: both verdicts are golden)."""
QUERY_MODELS = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v2-lite")
"""Three models of different shapes (MHA with 64 experts, GQA with 128, MLA with shared experts)."""

HASH_SEED = "0"
"""``PYTHONHASHSEED`` of every command (see the module docstring)."""
VOLATILE = {"search": ("elapsed_s",)}
"""Command → top-level JSON keys whose values are wall-clock times (replaced before storing)."""


def commands() -> dict[str, list[str]]:
    """Output name → planner arguments."""
    out: dict[str, list[str]] = {}
    for m in MODELS:
        out[f"check-{m}-composed"] = ["check", m, *CHECK_ARGS, "--json"]
        out[f"check-{m}-fsdp2"] = ["check", m, *CHECK_ARGS, "--baseline", "--json"]
    for m in QUERY_MODELS:
        out[f"search-{m}"] = ["search", m, "--gpus", "8", "--seq-len", "32k", "--top", "3", "--json"]
        out[f"sweep-{m}"] = ["sweep", m, "--gpus", "8", "--seq-lens", "32k,64k", "--json"]
        out[f"max-context-{m}"] = ["max-context", m, "--gpus", "8", "--max-seq-len", "256k", "--json"]
        out[f"max-context-{m}-fsdp2"] = ["max-context", m, "--gpus", "8", "--max-seq-len", "64k", "--baseline",
                                         "--json"]
        out[f"max-batch-{m}"] = ["max-batch", m, "--gpus", "8", "--seq-len", "32k",
                                 "--max-tokens", "256k", "--json"]
    return out


def run_one(args: list[str]) -> str:
    """``exit=N`` line, then stdout with the volatile fields replaced, then stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "PYTHONHASHSEED": HASH_SEED}
    p = subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    stdout = p.stdout
    keys = VOLATILE.get(args[0], ())
    if keys and stdout.strip():
        doc = json.loads(stdout)
        for k in keys:
            if k in doc:
                doc[k] = "<volatile>"
        stdout = json.dumps(doc, indent=1) + "\n"
    return f"exit={p.returncode}\n--- stdout\n{stdout}--- stderr\n{p.stderr}"


def run_all() -> dict[str, str]:
    cmds = commands()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        texts = pool.map(run_one, cmds.values())
    return dict(zip(cmds, texts))


def capture() -> int:
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    for old in OUTPUTS.glob("*.txt"):
        old.unlink()
    for name, text in run_all().items():
        (OUTPUTS / f"{name}.txt").write_text(text)
    print(f"wrote {len(commands())} outputs to {OUTPUTS}")
    return 0


def compare() -> int:
    now = run_all()
    stored = {p.stem for p in OUTPUTS.glob("*.txt")}
    bad = sorted(stored ^ set(now))
    for name in bad:
        print(f"{name}: {'missing from the golden set' if name in now else 'no longer produced'}")
    for name, text in now.items():
        path = OUTPUTS / f"{name}.txt"
        if not path.exists():
            continue
        old = path.read_text()
        if old != text:
            bad.append(name)
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), "golden", "now", lineterm="", n=1)
            print(f"{name}: differs\n" + "\n".join(list(diff)[:40]))
    print(f"{len(now) - len(bad)}/{len(now)} outputs byte-identical")
    return 1 if bad else 0


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="capture: (re)write tests/golden/outputs/; compare (the default): "
                                        "rerun every command, print each byte difference, exit 1 on any.")
    ap.add_argument("mode", nargs="?", choices=("capture", "compare"), default="compare")
    return {"capture": capture, "compare": compare}[ap.parse_args(argv).mode]()


if __name__ == "__main__":
    sys.exit(main())
