"""Per-row known gaps of the held-out timing comparison (``test_heldout_timing.py``): row name →
why the time model misses it by more than ``HELDOUT_TOL``. A listed row that comes within the
tolerance fails the test (remove it here), so the list is exactly the current misses. Errors
in the comments are predicted/measured − 1 when the list was written."""


REAL_A = ("shape A (E_p = 8) timed with real data in the emulated receive buffers "
         "(bench/results/dispatch_filled) is 10-19% slower than predicted. The profiler "
         "(bench/results/dispatch_profile, EP balanced, filled) puts the GEMM kernels at 189.7 ms against "
         "the model's 192.5 and the memory-bound kernels at 196.6 ms against 139.0 (the combine's bf16 "
         "index_add_ alone 104.8 ms): the memory-bound rates at shape A on real data are what the model "
         "misses. At E_p = 1 the same memory-bound kernels take 211 ms against 170, and the rows are "
         "within only because the GEMMs are predicted 10% slow there (209 vs 190 ms); open")
REAL_B = ("shape B forward under heavy skew (EP/LLEP one_expert and one_rank, PipelinedLLEP 95/16), timed "
         "with real data in the emulated receive buffers (bench/results/dispatch_filled), is 10-18% slower"
         " than predicted, while shape B's balanced and 30/16 rows are within 0-4% filled: the binding "
         "rank's long single-slot GEMM stream and its memory-bound kernels on real data; open")
PIPE_FWD = ("PipelinedLLEP forward alone at E_p = 1: 128 small blocks per chunk, host-bound at the calibrated"
         " per-block host seconds; the same configuration's forward measured 56 ms (dispatch.json, "
         "2026-11-29) and 93 ms (dispatch_B.json, 2026-12-01): the host-bound forward depends on the "
         "instance")
CHUNK = ("chunk-count curve at another shape: phi(K) measured at the profile curve's shape only, and its "
         "host-bound points (K = 5, 10, 20) carry the host of the instance it ran on (shape A at K = 10: "
         "0.89 s in the profile, 1.35 s in the coverage run)")

KNOWN_ROW_GAPS: dict[str, str] = {
    "pipelined_llep balanced N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": REAL_A,  # -10.6%
    "pipelined_llep balanced N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": REAL_A,  # -13.1%
    "pipelined_llep 30/16 N=65536 H=7168 I=2048 E_p=8 rank 6 fwd [filled]": REAL_A,  # -12.9%
    "pipelined_llep 30/16 N=65536 H=7168 I=2048 E_p=8 rank 6 fwd+bwd [filled]": REAL_A,  # -14.3%
    "pipelined_llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": REAL_A,  # -18.6%
    "pipelined_llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": REAL_A,  # -15.3%
    "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd [filled]": REAL_A,  # -12.5%
    "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd+bwd [filled]": REAL_A,  # -11.8%
    "pipelined_llep 50/4 N=65536 H=7168 I=2048 E_p=8 rank 2 fwd [filled]": REAL_A,  # -10.4%
    "pipelined_llep 50/4 N=65536 H=7168 I=2048 E_p=8 rank 2 fwd+bwd [filled]": REAL_A,  # -11.1%
    "ep balanced N=65536 H=7168 I=2048 E_p=8 rank 0 fwd [filled]": REAL_A,  # -14.5%
    "ep balanced N=65536 H=7168 I=2048 E_p=8 rank 0 fwd+bwd [filled]": REAL_A,  # -12.0%
    "llep balanced N=65536 H=7168 I=2048 E_p=8 rank 0 fwd [filled]": REAL_A,  # -10.5%
    "llep balanced N=65536 H=7168 I=2048 E_p=8 rank 0 fwd+bwd [filled]": REAL_A,  # -10.5%
    "llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": REAL_A,  # -10.2%
    "llep one_expert N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": REAL_A,  # -11.5%
    "llep one_expert N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": REAL_A,  # -11.9%
    "llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": REAL_A,  # -11.9%
    "llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": REAL_A,  # -12.1%
    "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd [filled]": REAL_B,  # -17.5%
    "ep one_expert N=32768 H=4096 I=4096 E_p=8 rank 0 fwd [filled]": REAL_B,  # -10.8%
    "ep one_rank N=32768 H=4096 I=4096 E_p=8 rank 0 fwd [filled]": REAL_B,  # -11.2%
    "llep one_expert N=32768 H=4096 I=4096 E_p=8 rank 1 fwd [filled]": REAL_B,  # -10.8%
    "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_FWD,  # +27.6%
    "chunk-count curve [B] N=32768 H=4096 K=5 (E_p=1) fwd+bwd": CHUNK,  # +13.9%
    "chunk-count curve [B] N=32768 H=4096 K=10 (E_p=1) fwd+bwd": CHUNK,  # -12.1%
}
