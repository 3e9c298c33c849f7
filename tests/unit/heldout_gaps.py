"""Per-row known gaps of the held-out timing comparison (``test_heldout_timing.py``): row name →
why the time model misses it by more than ``HELDOUT_TOL``. A listed row that comes within the
tolerance fails the test (remove it here), so the list is exactly the current misses. Errors
in the comments are predicted/measured − 1 when the list was written."""


SHAPE_A_EP = ("EP/LLEP under skew at shape A: the binding slot's long GEMM stream at the sustained-clock factor"
         " of the one GEMM measured for it")
PIPE_SKEW = ("PipelinedLLEP under heavy skew is predicted fast: the chunk-count curve's ratio phi(K) is "
         "measured under balanced routing, and the skewed slots' per-chunk block rows are not")
SHAPE_B_EP = ("EP/LLEP at shape B (H = I = 4096, k = 4) is predicted 10-21% slow even with the kernel curve of "
         "these widths: the sustained-clock factor is measured on one shape-A GEMM, the class rates at one"
         " size, and the dispatch bench was not re-run on the calibration's instance")
PIPE_FWD = ("PipelinedLLEP forward alone at E_p = 1: the chunk-count curve measures forward + backward only, "
         "so its ratio phi(K) is applied to the forward unmeasured")
CHUNK = ("chunk-count curve at another shape: phi(K) measured at the profile curve's shape only")

KNOWN_ROW_GAPS: dict[str, str] = {
    "ep 30/16 N=65536 H=7168 I=2048 E_p=8 rank 0 fwd": SHAPE_A_EP,  # +10.4%
    "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd": PIPE_SKEW,  # -13.9%
    "pipelined_llep 80/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd": PIPE_SKEW,  # -19.9%
    "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd": PIPE_SKEW,  # -16.7%
    "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd+bwd": PIPE_SKEW,  # -12.0%
    "pipelined_llep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 2 fwd": PIPE_SKEW,  # -10.9%
    "ep balanced N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +10.5%
    "ep balanced N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +18.3%
    "ep 30/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +20.9%
    "ep 80/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +16.3%
    "ep 80/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +18.4%
    "ep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +19.9%
    "ep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +19.9%
    "ep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +17.4%
    "ep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +16.6%
    "ep one_expert N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +13.1%
    "ep one_expert N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +13.9%
    "ep one_rank N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +13.5%
    "ep one_rank N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +17.0%
    "llep balanced N=32768 H=4096 I=4096 E_p=8 rank 0 fwd": SHAPE_B_EP,  # +14.4%
    "llep balanced N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +19.9%
    "llep 30/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +19.5%
    "llep 80/16 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +16.4%
    "llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd": SHAPE_B_EP,  # +10.9%
    "llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd+bwd": SHAPE_B_EP,  # +19.5%
    "llep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd+bwd": SHAPE_B_EP,  # +17.1%
    "llep one_expert N=32768 H=4096 I=4096 E_p=8 rank 1 fwd+bwd": SHAPE_B_EP,  # +19.3%
    "llep one_rank N=32768 H=4096 I=4096 E_p=8 rank 1 fwd+bwd": SHAPE_B_EP,  # +18.1%
    "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_FWD,  # +11.7%
    "chunk-count curve [B] N=32768 H=4096 K=5 (E_p=1) fwd+bwd": CHUNK,  # +17.7%
}
