"""Step-time model (DESIGN §4), torch-free: measured curves (``curves``, ``lookups``), FLOPs and
compute time (``flops``, ``compute``), collectives (``comm``), host offload (``offload``),
dispatch pipelines (``dispatch``), per-operator times (``ops``) and the step of each stack
(``composed``, ``baseline``, ``step``)."""
