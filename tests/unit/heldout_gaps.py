"""Per-row known gaps of the held-out timing comparison (``test_heldout_timing.py``): row name →
why the time model misses it by more than ``HELDOUT_TOL``. A listed row that comes within the
tolerance fails the test (remove it here), so the list is exactly the current misses. Errors
in the comments are predicted/measured − 1 when the list was written."""


REAL_B = ("shape B forward under heavy skew (EP/LLEP one_expert and one_rank, PipelinedLLEP 95/16 and "
         "50/4), timed with real data in the emulated receive buffers (bench/results/dispatch_filled), is "
         "11-19% slower than predicted, while shape B's balanced and 30/16 rows are within 0-4% filled: "
         "the binding rank's long single-slot GEMM stream and its memory-bound kernels on real data; open")
PIPE_FWD = ("PipelinedLLEP forward alone at E_p = 1: 128 small blocks per chunk, host-bound at the calibrated"
         " per-block host seconds; the same configuration's forward measured 56 ms (dispatch.json, "
         "2026-11-29) and 93 ms (dispatch_B.json, 2026-12-01): the host-bound forward depends on the "
         "instance")
EP1 = ("EP with every expert on one rank (E_p = 1) at shape A, forward: 128 blocks of 4096 rows, "
         "predicted 10% slow. Under torch.profiler (bench/results/dispatch_profile, E_p = 1) its GEMM "
         "kernels take 190 ms against the model's 209: forward GEMMs at the measured runtime/table ratio "
         "interpolated between 3277 and 32768 block rows overprice 4096-row blocks; its memory-bound "
         "kernels are priced at their rate for the bytes of the call")
CHUNK = ("chunk-count curve at shape B, K = 1 (E_p = 1) predicted 12.6% fast: phi(1) is measured at the "
         "profile curve's shape (A), where the whole operator at K = 1 runs 3% below its replay; at shape "
         "B, whose calls are 4-7 times smaller, the replay itself is short by 12% (the same rows at K = 2 "
         "and 3 are within 10%). The host-bound points (K = 5, 10, 20 at shape A) are not used for phi "
         "(chunk_curve.HOST_BOUND_SHARE)")

KNOWN_ROW_GAPS: dict[str, str] = {
    "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd [filled]": REAL_B,  # -19.0%
    "pipelined_llep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 2 fwd [filled]": REAL_B,  # -11.0%
    "ep one_expert N=32768 H=4096 I=4096 E_p=8 rank 0 fwd [filled]": REAL_B,  # -10.8%
    "ep one_rank N=32768 H=4096 I=4096 E_p=8 rank 0 fwd [filled]": REAL_B,  # -11.3%
    "llep one_expert N=32768 H=4096 I=4096 E_p=8 rank 1 fwd [filled]": REAL_B,  # -10.7%
    "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_FWD,  # +26.8%
    "ep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd": EP1,  # +10.3%
    "chunk-count curve [B] N=32768 H=4096 K=1 (E_p=1) fwd+bwd": CHUNK,  # -12.6%
}

PIPE_EP1_INSTANCE = ("PipelinedLLEP at E_p = 1, shape B, forward+backward predicted 25% fast on the instance's own "
                     "calibration: 128 slots per chunk make its chunk loops host-bound, and on this instance the same "
                     "host-bound configuration moved by 22% within minutes (shape A at K = 10: 0.799 s in the "
                     "calibration's chunk-count curve, 0.973 s in the bench); its forward alone is within 1%")
LLEP_ONE_RANK_B = ("LLEP one_rank at shape B, forward+backward predicted 12% slow on the H100 instance d0b286e2: the "
                   "binding rank's measured step (79.5 ms) is 6-10% faster than LLEP's other routings at the same "
                   "plan shape there (85-92 ms), which the model prices alike (89-96 ms); on the H200 the row is "
                   "within 10%")

TWO_CALLS = ("a forward of 35-45 ms timed as the median of two calls (bench/dispatch.py's default --iters 2) on "
             "instance 00c2e474, 7-28% slower than the same row on d0b286e2 and than the run's neighbouring routings "
             "(LLEP 50/4 at B: 41.3 ms against 31.1-32.5 ms for every other LLEP forward there); "
             "bench/dispatch_same_instance.sh times five calls since (both H200 dec975e8 runs)")
PIPE_SKEW_A = ("PipelinedLLEP at shape A under one_expert/one_rank/95-16 routing predicted 10-12% slow on 00c2e474 "
               "(7.5-8.8% on d0b286e2): the binding rank's forward under these routings runs 7% faster than under "
               "30/16 (145 against 155 ms), which the model prices alike; and this instance's chunk-count curve has "
               "K = 5 host-bound as well, so phi(10) is read at K = 3 (1.042; 1.011 at K = 5 on d0b286e2)")
PIPE_B_EDGE = ("PipelinedLLEP 95/16 at shape B, forward+backward, +10.0% on 00c2e474 (-4.4% on d0b286e2; 141.0 and "
               "146.3 ms measured): at the tolerance's edge, its chunk loops priced with phi(3) = 1.042 from this "
               "instance's curve (1.000 on d0b286e2)")
PIPE_EP1_00C = ("PipelinedLLEP at E_p = 1 (128 slots per chunk, host-bound) on 00c2e474: shape B 75.1 ms forward and "
                "325 ms forward+backward against 56.7 and 270 ms on d0b286e2; the instance's own chunk curve took "
                "1.16 s at K = 10 (0.80 s on d0b286e2): the host pace of these loops moves between and within instances")

PIPE_A_H200 = ("PipelinedLLEP at shape A, E_p = 8 (K = 10 chunks of 16 slots), predicted 10-24% slow on H200 instance "
               "dec975e8 with its own curves (2-18% with the shipped h200 profile). That run's chunk-count curve took "
               "0.710 s at K = 10 (0.891 s in the shipped curve), and the instance's host loops replay that point with "
               "1.1% exposed host, under chunk_curve.HOST_BOUND_SHARE: phi(10) = 1.069 is read from E_p = 1 loops of 128 "
               "slots that run at the edge of host-bound and is applied to E_p = 8's GPU-bound chunks (the shipped "
               "profile drops K = 5 and 10 and reads phi(3) = 1.022). In the second run minutes later the coverage "
               "section's host loops came 1.47x slower (413 against 281 us per chunk_bwd block), K = 10 replayed "
               "host-bound and was dropped, and only the skewed routings stayed outside (PIPE_SKEW_A). Merging the "
               "calibration's own dispatch_kernels last (the curve's host pace) was tried: 67 and 65 of 84, worse")
PIPE_EP1_H200 = ("PipelinedLLEP at E_p = 1 (128 slots per chunk, host-bound) on H200 dec975e8: shape B forward 53.6 ms "
                 "(second run), forward+backward 201 ms (first); at shape A (the chunk curve's configuration, not compared) "
                 "its forward took 196 and 235 ms in the two runs of the same instance minutes "
                 "apart (1.20x): the host pace of these loops moves within an instance (PIPE_EP1_00C)")
PIPE_SKEW_B_H200 = ("PipelinedLLEP one_rank at shape B forward, +10.4% on H200 dec975e8 (31.2 ms, against 34.0-38.8 ms for "
                    "its balanced, 30/16, 80/16 and 95/16 forwards there): the binding rank's forward under one-rank "
                    "routing is faster, which the model prices alike (PIPE_SKEW_A)")

PIPE_B_EP8 = ("PipelinedLLEP forward at shape B, E_p = 8, predicted 12-13% fast on H100 d4d3ef6b with the instance's "
              "E_p = 8 chunk curve: phi is measured at shape A (0.954-0.990 at K = 3-10) and used at every shape, while "
              "the same instance's E_p = 8 curve at shape B (bench/results/calibration/chunk_ep8_h100_d4d3ef6b) gives "
              "1.021, 1.081 and 1.099 at K = 3, 5 and 10: the per-chunk costs the replay misses grow as a chunk's work "
              "shrinks. With the shipped h100 profile's E_p = 1 curve (phi(3) = 1.011) the same rows are 6-11% fast")
CHUNK_B_EP8 = ("chunk-count curve at shape B, E_p = 8, K = 5 on H100 d4d3ef6b predicted 11.5% fast: phi(5) = 0.954 is "
               "measured at shape A, where the replay of that configuration is 4% above the measurement, and at shape B the "
               "replay is 8% below it (PIPE_B_EP8); K = 10 is at -9.7%")
PIPE_EP1_EP8 = ("PipelinedLLEP at E_p = 1 (128 slots per chunk, host-bound) on H100 d4d3ef6b, priced with phi from an E_p = 8 "
                "curve (no exposed host): the replay's host seconds are the instance's host-loop calibration, whose pace "
                "these loops do not keep (PIPE_EP1_00C); shape A at E_p = 1 was the E_p = 1 curve's own configuration "
                "before the curve moved to E_p = 8")

INSTANCE_BELOW_TARGET: dict[str, str] = {
    "h100_00c2e474": "67 of 76 (88%) within 10%, 67 also with the shipped profile alone: five PipelinedLLEP rows at "
                     "shape A under skew (PIPE_SKEW_A), two host-bound E_p = 1 rows, two forwards timed by two calls",
    "h200_dec975e8": "66 of 84 (79%) within 10%, 76 (90%) with the shipped h200 profile alone: 14 PipelinedLLEP rows "
                     "at shape A, E_p = 8, over-priced by phi(10) read from a near-host-bound point (PIPE_A_H200)",
    "h200_run2_dec975e8": "74 of 84 (88%) within 10%, 74 also with the shipped profile: the same instance minutes "
                          "later, five calls per row; seven PipelinedLLEP rows at shape A under skew (PIPE_SKEW_A), "
                          "PipelinedLLEP's host-bound E_p = 1 forward at shape B, and EP/LLEP's E_p = 1 forward at "
                          "shape A (EP1)",
}
"""Same-instance runs below ``INSTANCE_TARGET``, with why (the test fails if one reaches it)."""

INSTANCE_ROW_GAPS: dict[str, dict[str, str]] = {
    "h100_00c2e474": {
        "llep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 0 fwd [filled]": TWO_CALLS,  # -20.0%
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=8 rank 2 fwd [filled]": TWO_CALLS,  # -14.0%
        "pipelined_llep 95/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd+bwd [filled]": PIPE_B_EDGE,  # +10.0%
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_EP1_00C,  # -16.0%
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd+bwd": PIPE_EP1_00C,  # -10.6%
        "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd+bwd [filled]": PIPE_SKEW_A,  # +10.7%
        "pipelined_llep one_expert N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_SKEW_A,  # +11.4%
        "pipelined_llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_SKEW_A,  # +11.6%
        "pipelined_llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_SKEW_A,  # +10.4%
    },
    "h100_d0b286e2": {
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd+bwd": PIPE_EP1_INSTANCE,  # -25.3%
        "llep one_rank N=32768 H=4096 I=4096 E_p=8 rank 1 fwd+bwd [filled]": LLEP_ONE_RANK_B,  # +12.1%
    },
    "h100_d4d3ef6b": {
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=8 rank 2 fwd [filled]": PIPE_B_EP8,  # -12.0%
        "pipelined_llep 30/16 N=32768 H=4096 I=4096 E_p=8 rank 2 fwd [filled]": PIPE_B_EP8,  # -12.7%
        "pipelined_llep 80/16 N=32768 H=4096 I=4096 E_p=8 rank 3 fwd [filled]": PIPE_B_EP8,  # -12.5%
        "pipelined_llep 50/4 N=32768 H=4096 I=4096 E_p=8 rank 2 fwd [filled]": PIPE_B_EP8,  # -12.2%
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_EP1_EP8,  # -21.9%
        "pipelined_llep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd": PIPE_EP1_EP8,  # +15.0%
        "pipelined_llep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd+bwd": PIPE_EP1_EP8,  # -29.4%
    },
    "h200_dec975e8": {
        "pipelined_llep one_rank N=32768 H=4096 I=4096 E_p=8 rank 2 fwd [filled]": PIPE_SKEW_B_H200,  # +10.4%
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd+bwd": PIPE_EP1_H200,  # -11.6%
        "pipelined_llep balanced N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_A_H200,  # +18.4%
        "pipelined_llep balanced N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_A_H200,  # +12.2%
        "pipelined_llep 30/16 N=65536 H=7168 I=2048 E_p=8 rank 6 fwd [filled]": PIPE_A_H200,  # +13.8%
        "pipelined_llep 30/16 N=65536 H=7168 I=2048 E_p=8 rank 6 fwd+bwd [filled]": PIPE_A_H200,  # +11.0%
        "pipelined_llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_A_H200,  # +20.0%
        "pipelined_llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_A_H200,  # +15.1%
        "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd [filled]": PIPE_A_H200,  # +20.0%
        "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd+bwd [filled]": PIPE_A_H200,  # +16.6%
        "pipelined_llep 50/4 N=65536 H=7168 I=2048 E_p=8 rank 2 fwd [filled]": PIPE_A_H200,  # +17.4%
        "pipelined_llep 50/4 N=65536 H=7168 I=2048 E_p=8 rank 2 fwd+bwd [filled]": PIPE_A_H200,  # +16.0%
        "pipelined_llep one_expert N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_A_H200,  # +22.0%
        "pipelined_llep one_expert N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_A_H200,  # +18.0%
        "pipelined_llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_A_H200,  # +24.1%
        "pipelined_llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_A_H200,  # +22.0%
        "ep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd": EP1,  # +10.1%
        "llep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd": EP1,  # +10.6%
    },
    "h200_run2_dec975e8": {
        "pipelined_llep balanced N=32768 H=4096 I=4096 E_p=1 rank 0 fwd": PIPE_EP1_H200,  # +56.1%
        "pipelined_llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_SKEW_A,  # +16.6%
        "pipelined_llep 80/16 N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_SKEW_A,  # +10.1%
        "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd [filled]": PIPE_SKEW_A,  # +15.8%
        "pipelined_llep 95/16 N=65536 H=7168 I=2048 E_p=8 rank 7 fwd+bwd [filled]": PIPE_SKEW_A,  # +14.3%
        "pipelined_llep one_expert N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_SKEW_A,  # +14.1%
        "pipelined_llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd [filled]": PIPE_SKEW_A,  # +15.4%
        "pipelined_llep one_rank N=65536 H=7168 I=2048 E_p=8 rank 1 fwd+bwd [filled]": PIPE_SKEW_A,  # +12.2%
        "ep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd": EP1,  # +11.7%
        "llep balanced N=65536 H=7168 I=2048 E_p=1 rank 0 fwd": EP1,  # +10.6%
    },
}
"""Same-instance runs (``test_heldout_dispatch_instance.py``): folder → row name → why it misses."""
