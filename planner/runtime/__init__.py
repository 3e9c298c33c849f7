"""Runtime operators (torch only): Ring-DTP, LLEP/PipelinedLLEP, SCO, OffloadStreamAdamW,
their baselines, the stream/collective shim and the fake-tensor trace harness.

The planner core never imports this package.
"""
