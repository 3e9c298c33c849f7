"""Torch-free facts of the attention kernels' input layout, shared by ``planner.runtime.sdpa``
(which builds the tensors) and ``planner.budget.attention_sliding`` (which counts them)."""

SINK_PAD = 8
"""Extra query/key channels that carry the sink logit (keeps ``d`` a multiple of 8)."""
MASK_ALIGN = 16
"""Key-length alignment of an explicit mask for the memory-efficient kernel."""
