"""One input case of an op: what the checker and the benchmark both consume."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Case:
    """Inputs for one call `fn(*args, **kwargs)` of an op, with a readable label.

    `dims` holds the named sizes (legend letters: B, N, T, H, D, E, K, ...) that the roofline
    functions read; `why` says what an EDGE case is for (STYLE.md rule 6).
    `inputs` is the args tuple, or a function that builds it: REAL inputs too big to hold all
    cases at once (the drafter's bs 64 x 32k cache is 52 GB) are built on first use of `args`
    and dropped by `release()`, which the benchmark calls when it is done with a case.
    """

    op: str
    label: str  # e.g. "T=9 D=7168 E=384 K=8"
    inputs: tuple | Callable[[], tuple]
    kwargs: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    why: str = ""
    kind: str = "edge"  # "edge" | "real"
    _built: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def args(self) -> tuple:
        if not callable(self.inputs):
            return self.inputs
        if self._built is None:
            self._built = tuple(self.inputs())
        return self._built

    @args.setter
    def args(self, value: tuple) -> None:
        self.inputs, self._built = tuple(value), None

    def release(self) -> None:
        """Drop lazily built inputs (no-op for a plain tuple); `args` rebuilds them."""
        self._built = None
