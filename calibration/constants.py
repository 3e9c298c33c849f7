"""Runtime-fixed constants of the memory model (DESIGN §3.1) and the allocator's fragmentation.

All need CUDA except the host RSS. Each returns ``{field of MemoryConstants: (value, note)}``:

- ``cuda_context_bytes``: device bytes in use (NVML, else ``cudaMemGetInfo``) minus the caching
  allocator's reserved bytes, once right after CUDA starts and again at the end of the run, when
  the kernels of every benchmark are loaded; the later value is stored.
- ``cublas_workspace_bytes`` / ``cublaslt_workspace_bytes``: bytes the allocator hands out, beyond
  the output, to the first ``torch.mm`` on a fresh stream (cuBLAS) and then to the first ``addmm``
  with a 1-D bias (cuBLASLt epilogue path); persistent or transient, whichever is larger.
- ``flash_workspace_bytes_per_elem``: peak bytes of the causal flash backward beyond its inputs and
  the three gradients, per element of ``q``.
- ``pin_seconds_per_gib``: ``cudaHostRegister`` of a touched pageable buffer.
- ``host_baseline_bytes_per_rank``: this process's RSS with torch and a CUDA context loaded and
  cuBLAS and flash run (a lower bound for a training process: no model code or data loader).
- ``fragmentation_fraction``: ``(max_reserved − max_allocated) / max_reserved`` over one step of a
  representative allocation pattern (a layer loop's boundaries, temporaries, head and backward with
  odd sizes), after two warm-up steps.
"""

from __future__ import annotations

import random
import time

import torch

from calibration.config import GiB, Grid
from planner.runtime.allocator import env_settings
from planner.runtime.measure import device_used_bytes, extra_allocated_bytes, host_rss_bytes, sync


def allocator_settings() -> str:
    """The allocator settings in effect (torch's own view when it offers one, else the environment)."""
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    text = get() if get is not None else ""
    return text or env_settings()


def expandable_segments() -> bool:
    """Whether the allocator runs with ``expandable_segments:True``."""
    return "expandable_segments:true" in allocator_settings().replace(" ", "").lower()


def context_bytes() -> tuple[int, str]:
    """Device bytes in use outside the caching allocator, and the method used (creates the CUDA
    context first if needed)."""
    torch.zeros(1, device="cuda")
    sync()
    used, method = device_used_bytes()
    return used - torch.cuda.memory_reserved(), method


def blas_workspaces() -> dict[str, tuple[float, str]]:
    """cuBLAS and cuBLASLt workspace bytes (see the module docstring)."""
    dev = torch.device("cuda")
    a = torch.randn(1024, 1024, dtype=torch.bfloat16, device=dev)
    b = torch.randn(1024, 1024, dtype=torch.bfloat16, device=dev)
    bias = torch.randn(1024, dtype=torch.bfloat16, device=dev)
    out_bytes = 1024 * 1024 * 2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cublas = extra_allocated_bytes(lambda: torch.mm(a, b), out_bytes)
        lt = extra_allocated_bytes(lambda: torch.addmm(bias, a, b), out_bytes)
    return {
        "cublas_workspace_bytes": (cublas, "first torch.mm (bf16) on a fresh stream: allocator bytes beyond "
                                           "the output"),
        "cublaslt_workspace_bytes": (lt, "then the first addmm with a 1-D bias (cuBLASLt epilogue): bytes beyond the "
                                         "output; 0 means the workspace is shared with cuBLAS's or allocated outside"),
    }


def flash_workspace(grid: Grid) -> tuple[float, str]:
    """Flash backward workspace bytes per element of ``q``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s = max(1024, min(8192, max(grid.attn_seq)))
    h, d = 16, 128
    q, k, v = (torch.randn(1, h, s, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(out)
        extra = extra_allocated_bytes(lambda: torch.autograd.grad(out, (q, k, v), g), 3 * q.nbytes)
    return extra / q.numel(), f"causal flash backward at S={s}, h={h}, d={d}, bf16: peak beyond dq, dk, dv"


def pin_seconds_per_gib(grid: Grid) -> tuple[float, str]:
    """Seconds per GiB to pin a touched pageable buffer with ``cudaHostRegister``."""
    n = grid.pin_bytes
    buf = torch.empty(n, dtype=torch.uint8).fill_(1)
    cudart = torch.cuda.cudart()
    t0 = time.perf_counter()
    err = cudart.cudaHostRegister(buf.data_ptr(), n, 0)
    dt = time.perf_counter() - t0
    cudart.cudaHostUnregister(buf.data_ptr())
    if err != cudart.cudaError.success:
        raise RuntimeError(f"cudaHostRegister failed with error {int(err)}")
    return dt / (n / GiB), f"cudaHostRegister of {n / GiB:.2f} GiB of touched pageable memory"


def host_baseline() -> tuple[float, str]:
    """Host RSS of this process now."""
    return float(host_rss_bytes()), ("RSS of the calibration process with torch, a CUDA context, cuBLAS and "
                                     "flash loaded (no model code, data loader or offload buffers)")


def fragmentation(grid: Grid, seed: int = 0) -> tuple[float, str]:
    """``(max_reserved − max_allocated) / max_reserved`` over one step of the pattern."""
    n, hid, layers = grid.frag_tokens, grid.frag_hidden, grid.frag_layers
    rng = random.Random(seed)
    dev = torch.device("cuda")

    def odd(elems: int) -> int:
        return int(elems * (1.0 + 0.3 * rng.random()))

    def step():
        rng.seed(seed)  # the same odd sizes every step, as in training
        kept = []
        for _ in range(layers):
            kept.append(torch.empty(n * hid, dtype=torch.bfloat16, device=dev))          # boundary
            tmp = [torch.empty(odd(3 * n * hid), dtype=torch.bfloat16, device=dev),       # qkv
                   torch.empty(odd(n * hid), dtype=torch.bfloat16, device=dev)]           # attn out
            kept.append(torch.empty(odd(n * hid // 8), dtype=torch.float32, device=dev))  # saved stats
            tmp.append(torch.empty(odd(4 * n * hid), dtype=torch.bfloat16, device=dev))   # mlp up
            del tmp
        head = torch.empty(odd(n * 4 * hid), dtype=torch.float32, device=dev)             # logits strip
        del head
        grads = []
        for _ in range(layers):
            g = [torch.empty(odd(n * hid), dtype=torch.bfloat16, device=dev),
                 torch.empty(odd(3 * n * hid), dtype=torch.bfloat16, device=dev)]
            grads.append(torch.empty(odd(hid * hid // 4), dtype=torch.float32, device=dev))
            kept.pop()
            kept.pop()
            del g
        del grads

    torch.cuda.empty_cache()
    for _ in range(2):
        step()
    sync()
    torch.cuda.reset_peak_memory_stats()
    step()
    sync()
    res, alloc = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    return ((res - alloc) / res if res else 0.0,
            f"{layers}-layer pattern at N={n}, H={hid}: max_reserved {res} B, max_allocated {alloc} B; "
            f"allocator settings: {allocator_settings() or '(default)'}")
