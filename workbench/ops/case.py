"""One input case of an op: what the checker and the benchmark both consume."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Case:
    """Inputs for one call `fn(*args, **kwargs)` of an op, with a readable label.

    `dims` holds the named sizes (legend letters: B, N, T, H, D, E, K, ...) that the roofline
    functions read; `why` says what an EDGE case is for (STYLE.md rule 6).
    """

    op: str
    label: str  # e.g. "T=9 D=7168 E=384 K=8"
    args: tuple
    kwargs: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    why: str = ""
    kind: str = "edge"  # "edge" | "real"
