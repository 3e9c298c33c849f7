"""Per-rank memory model: one module per live set, each exposing ``terms(ctx) -> list[Term]``."""
