"""``bench/step_profile.py``'s kernel classes and GPU busy time (the measured breakdown of a W = 1
step is read from them)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_profile  # noqa: E402


def test_kernel_names_fall_in_their_class():
    assert step_profile.classify("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert step_profile.classify("fmha_cutlassB_bf16_aligned_64x64_k128") == "attention"
    assert step_profile.classify("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT") == "gemm"
    assert step_profile.classify("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "gemm"
    assert step_profile.classify("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<Adam>") == "optimizer"
    assert step_profile.classify("Memcpy HtoD (Pinned -> Device)") == "copies"
    assert step_profile.classify("void at::native::vectorized_elementwise_kernel<4, SiluFunctor>") == "other"


def test_busy_time_is_the_union_of_kernel_intervals():
    # µs intervals: [0, 10) and [5, 20) overlap (20 µs), [30, 31) apart (1 µs), [31, 31) empty
    assert step_profile.busy_seconds([(5, 20), (0, 10), (30, 31), (31, 31)]) == 21e-6
    assert step_profile.busy_seconds([]) == 0.0
    assert step_profile.busy_seconds([(0, 100), (10, 20)]) == 100e-6
