"""Per-row known gaps of the held-out timing comparison (``test_heldout_timing.py``): row name →
why the time model misses it by more than ``HELDOUT_TOL``. A listed row that comes within the
tolerance fails the test (remove it here), so the list is exactly the current misses. Errors
in the comments are predicted/measured − 1 when the list was written."""


PIPE_SKEW = ("PipelinedLLEP under heavy skew is predicted fast: the chunk-count curve's ratio phi(K) is "
         "measured under balanced routing, and the skewed slots' per-chunk block rows are not")
EP1 = ("EP/LLEP with every expert on one rank (E_p = 1) is predicted 10-12% fast: its GEMM stream is 128"
         " blocks of 1k-4k rows (and the shim's copies), whose rate in the dispatch bench sits below the "
         "GEMM table x the sustained factor, measured on one 32768-row GEMM in another run than the table "
         "and the bench")
PIPE_FWD = ("PipelinedLLEP forward alone at E_p = 1: the chunk-count curve measures forward + backward only, "
         "so its ratio phi(K) is applied to the forward unmeasured")
CHUNK = ("chunk-count curve at another shape: phi(K) measured at the profile curve's shape only")

KNOWN_ROW_GAPS: dict[str, str] = {
    "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd": PIPE_SKEW,  # -20.1%
    "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd+bwd": PIPE_SKEW,  # -17.4%
    "pipelined_llep 80/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd": PIPE_SKEW,  # -20.2%
    "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd": PIPE_SKEW,  # -17.1%
    "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd+bwd": PIPE_SKEW,  # -13.2%
    "pipelined_llep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 2 fwd": PIPE_SKEW,  # -11.2%
    "ep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd+bwd": EP1,  # -11.8%
    "llep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd+bwd": EP1,  # -11.2%
    "ep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": EP1,  # -10.8%
    "llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": EP1,  # -10.8%
    "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_FWD,  # +21.5%
    "chunk-count curve [B] N=32768 H=4096 K=5 (E_p=1) fwd+bwd": CHUNK,  # +28.0%
}
