"""The resolution layer (DESIGN §1, §10): a plan's defaults resolved and validated
(``resolve``), and every derived symbol computed once into a ``Ctx`` (``derive``), below both the
memory model (``planner.budget``) and the time model (``planner.timing``)."""
