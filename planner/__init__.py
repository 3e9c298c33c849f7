"""moe-planner: per-rank memory and step-time planner for long-context MoE training.

The planner core (everything outside ``planner.runtime``) never imports torch.
"""

__version__ = "0.1.0"
