"""Knob variants for the benchmark harness: `cuda_v28@TB1=4+PF1=2` is variant cuda_v28 called
with cfg={"TB1": 4, "PF1": 2}, timed and checked like any variant, in the same interleaved
rounds and on the same case inputs as the others and the peers.

Why: a kernel's own CLI (`python -m workbench.kernels.int4_moe.cuda_v28 --cfgs ...`) draws its
own routing, and a knob's effect can depend on the draw (session 49: uniform T 9, one draw
17 µs faster, three 5-13 µs slower), so a knob's A/B there does not say what the REAL bench's
case would show beside Humming. Only variants whose function takes a `cfg` keyword have knobs;
the op's own check of a knob's value runs at the call (int4_moe: `_common.with_cfg`).

    python -m workbench bench int4_moe --variants cuda_v28,cuda_v28@TB1=4 --peers humming
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

AT, PLUS = "@", "+"  # variant@knob=value+knob=value (commas separate the variants)


def _value(text: str, spec: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise ValueError(f"variants: expected knob values that are numbers in {spec!r}, got "
                     f"{text!r}")


def split(spec: str) -> tuple[str, dict]:
    """(variant, knobs) of `spec`: "cuda_v28" -> ("cuda_v28", {}), "cuda_v28@TB1=4+PF1=2" ->
    ("cuda_v28", {"TB1": 4, "PF1": 2}); a malformed knob list is refused by name."""
    name, at, rest = spec.partition(AT)
    if not at:
        return spec, {}
    knobs = {}
    for item in rest.split(PLUS):
        key, eq, text = item.partition("=")
        if not eq or not key or key in knobs:
            raise ValueError(f"variants: expected {name}{AT}KNOB=VALUE{PLUS}KNOB=VALUE (each "
                             f"knob once), got {spec!r}")
        knobs[key] = _value(text, spec)
    return name, knobs


def with_knobs(fn: Callable, knobs: dict, spec: str) -> Callable:
    """fn with `knobs` merged over any cfg the call passes; fn itself where there are none. A
    function without a `cfg` keyword has no knobs: refused by name."""
    if not knobs:
        return fn
    if "cfg" not in inspect.signature(fn).parameters:
        raise ValueError(f"variants: expected a variant whose function takes cfg= for "
                         f"{spec!r}, got {fn.__module__}.{fn.__name__} without one")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        cfg = {**(kwargs.pop("cfg", None) or {}), **knobs}
        return fn(*args, **kwargs, cfg=cfg)

    return call
