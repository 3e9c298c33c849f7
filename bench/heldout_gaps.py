"""Rewrite ``tests/unit/heldout_gaps.py`` from the current held-out misses, one reason per category
(run from the repository root after a recalibration; review the diff):

    python3 bench/heldout_gaps.py

A miss that matches no category stops the script: add its reason to ``REASONS`` first (a row
measured with filled receive buffers, `` [filled]``, is a miss on real operands: ``SHAPE_B_EP``,
the unfilled rows' reason, does not match it).
"""
import json
import re
import sys
sys.path.insert(0,'tests/unit'); sys.path.insert(0,'.')
from planner.schema.io import load_cluster
import test_heldout_timing as T
cl = load_cluster("h200")
REASONS = [
 (r"^pipelined_llep .*H=7168.*\[filled\]$", "REAL_A", "PipelinedLLEP at shape A (E_p = 8), timed with real data in the emulated receive buffers (bench/results/dispatch_filled), is 11-19% slower than predicted. EP and LLEP at the same shape are within 10% since the memory-bound kernels run at their rate for the bytes of the call (calibration.memory_sizes: the combine's bf16 index_add_ at 524288 routes 0.68 of its rate at 131072); PipelinedLLEP's chunks move a K-th of those bytes per call, and phi(K), measured at E_p = 1, does not carry what its E_p = 8 chunks miss; open"),
 (r"^(ep|llep|pipelined_llep) .*H=4096 I=4096.*\[filled\]$", "REAL_B", "shape B forward under heavy skew (EP/LLEP one_expert and one_rank, PipelinedLLEP 95/16 and 50/4), timed with real data in the emulated receive buffers (bench/results/dispatch_filled), is 11-19% slower than predicted, while shape B's balanced and 30/16 rows are within 0-4% filled: the binding rank's long single-slot GEMM stream and its memory-bound kernels on real data; open"),
 (r"^(ep|llep) balanced .* E_p=1 ", "EP1", "EP with every expert on one rank (E_p = 1) at shape A, forward: 128 blocks of 4096 rows, predicted 10% slow. Under torch.profiler (bench/results/dispatch_profile, E_p = 1) its GEMM kernels take 190 ms against the model's 209: forward GEMMs at the measured runtime/table ratio interpolated between 3277 and 32768 block rows overprice 4096-row blocks; its memory-bound kernels are priced at their rate for the bytes of the call"),
 (r"^(ep|llep) .* H=4096 I=4096 .*(fwd|bwd)$", "SHAPE_B_EP", "EP/LLEP at shape B on the emulated rank (E_p = 8), timed on unwritten receive buffers (zeros: the fake process group's all-to-alls are no-ops), is predicted 10-12% slow: GEMMs on zero operands hold higher clocks than the random operands every calibration GEMM was timed on. The backward GEMM time these rows imply is 0.73-0.84x the table at every block size from 8192 to 1M rows, where the calibration measured the four backward GEMMs at 0.91-1.03x the table at 32768 rows and the E_p = 1 rows (real rows) imply 0.94x, as predicted; the configurations measured filled (dispatch_fill.json: EP and LLEP balanced, LLEP 30/16) are within +0.8..+1.9% (fwd+bwd). Re-run with bench/dispatch.py --fill (dispatch_filled/)"),
 (r"^(ep|llep) .* H=7168", "SHAPE_A_EP", "EP/LLEP under skew at shape A: the binding slot's long GEMM stream at the sustained-clock factor of the one GEMM measured for it"),
 (r"^pipelined_llep (95/16|80/16|50/4)", "PIPE_SKEW", "PipelinedLLEP under heavy skew is predicted fast: the binding rank's small own-expert blocks (160-630 rows, before its imported experts' in each chunk) run at the host's pace block by block from each chunk's synchronising index copy, at the per-block host seconds calibrated on another instance than the bench's (the dispatch bench was not re-run on it)"),
 (r"^pipelined_llep balanced .* E_p=1 .* fwd$", "PIPE_FWD", "PipelinedLLEP forward alone at E_p = 1: 128 small blocks per chunk, host-bound at the calibrated per-block host seconds; the same configuration's forward measured 56 ms (dispatch.json, 2026-11-29) and 93 ms (dispatch_B.json, 2026-12-01): the host-bound forward depends on the instance"),
 (r"^pipelined_llep", "PIPE_OTHER", "PipelinedLLEP: phi(K) from the chunk-count curve's shape used at another shape"),
 (r"^CPUOffloadAdamW", "HOST", "CPUOffloadAdamW is predicted fast: the host AdamW and cast tables in the profile were timed at 3.4e7 parameters, the bench steps 1e9 (state far beyond the last-level cache)"),
 (r"^SCO", "SCO", "SCO: the overlap rule with per-region times split evenly and one measured overhead per byte misses this interior"),
 (r"^chunk-count", "CHUNK", "chunk-count curve at shape B, K = 1 (E_p = 1) predicted 12.6% fast: phi(1) is measured at the profile curve's shape (A), where the whole operator at K = 1 runs 3% below its replay; at shape B, whose calls are 4-7 times smaller, the replay itself is short by 12% (the same rows at K = 2 and 3 are within 10%). The host-bound points (K = 5, 10, 20 at shape A) are not used for phi (chunk_curve.HOST_BOUND_SHARE)"),
]
rows = []
for bench,(fname,reader) in sorted(T.READERS.items()):
    rows += reader(json.loads((T.RESULTS/fname).read_text()), cl)
p = T.RESULTS / T.CHUNK_CURVES
if p.exists():
    doc=json.loads(p.read_text())
    rows += [c for tag,cur in doc["curves"].items() for c in T.chunk_count_cases(cl,cur,f" [{tag}]")]
if cl.curves.sco is not None:
    rows += T.sco_cases(cl)
by = {}
for c in rows:
    if c.held_out and not c.not_comparable and abs(c.error) > T.HELDOUT_TOL:
        for pat, key, text in REASONS:
            if re.search(pat, c.name):
                by.setdefault(key, (text, []))[1].append((c.name, c.error)); break
        else:
            raise SystemExit(f"no reason for {c.name}")
out = ['"""Per-row known gaps of the held-out timing comparison (``test_heldout_timing.py``): row name →',
       'why the time model misses it by more than ``HELDOUT_TOL``. A listed row that comes within the',
       'tolerance fails the test (remove it here), so the list is exactly the current misses. Errors',
       'in the comments are predicted/measured − 1 when the list was written."""', '', '']
for key,(text,items) in by.items():
    import textwrap
    parts = textwrap.wrap(text, 96, drop_whitespace=False)
    out.append(f'{key} = (' + "\n         ".join(f'"{x}"' for x in parts) + ')')
out += ['', 'KNOWN_ROW_GAPS: dict[str, str] = {']
for key,(text,items) in by.items():
    for name, e in items:
        out.append(f'    "{name}": {key},  # {e:+.1%}')
out.append('}')
open('tests/unit/heldout_gaps.py','w').write("\n".join(out)+"\n")
print({k:len(v[1]) for k,v in by.items()})
