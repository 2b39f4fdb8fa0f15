"""The op registry: one entry per op, its reference, named variants and the current selection.

The model never calls a kernel directly. It calls `ops.get("int4_moe")(...)`, and what that
resolves to is chosen with `ops.use(int4_moe="triton_v1")` (a context manager) or the
`kernels=` argument of `generate`. Variants are loaded lazily: a CUDA-only kernel is listed on a
CPU box but reports why it cannot run instead of failing at import.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

REFERENCE = "reference"


class UnknownOpError(KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class VariantUnavailable(RuntimeError):
    """The variant exists but cannot run here (no GPU, missing package, ...)."""


@dataclass
class Variant:
    """One implementation of an op. `target` is "module:function", imported on first use."""

    name: str
    target: str | Callable
    needs: tuple[str, ...] = ()  # "cuda", "triton", "numba", "cupy", or a package name
    description: str = ""
    _fn: Callable | None = field(default=None, repr=False)

    def unavailable_reason(self) -> str | None:
        """None when the variant can run here, else a one-line reason."""
        return unavailable_reason(self.needs)

    def load(self) -> Callable:
        if self._fn is None:
            reason = self.unavailable_reason()
            if reason:
                raise VariantUnavailable(f"variant {self.name!r} cannot run here: {reason}")
            if callable(self.target):
                self._fn = self.target
            else:
                mod, _, attr = self.target.partition(":")
                self._fn = getattr(importlib.import_module(mod), attr)
        return self._fn


@dataclass
class OpSpec:
    """Everything the harness needs to know about one op."""

    name: str
    doc: str
    variants: dict[str, Variant] = field(default_factory=dict)
    # harness hooks (filled by the op's registration; None where not yet provided)
    make_inputs: Callable | None = None  # (shapes: "edge"|"real", seed, cfg) -> list of cases
    compare: Callable | None = None  # (ref_out, out, case) -> report
    roofline: Callable | None = None  # (case) -> {"bytes": int, "flops": int}

    def add(self, variant: Variant) -> Variant:
        if variant.name in self.variants:
            raise ValueError(f"op {self.name!r} already has a variant {variant.name!r}")
        self.variants[variant.name] = variant
        return variant

    def variant(self, name: str) -> Variant:
        if name not in self.variants:
            raise UnknownOpError(
                f"op {self.name!r} has no variant {name!r}; known: {sorted(self.variants)}"
            )
        return self.variants[name]


_OPS: dict[str, OpSpec] = {}
_SELECTION: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "workbench_op_selection", default=types.MappingProxyType({})  # read-only default
)
# (op name, selected callable) -> the callable `get` returns; None = the callable itself.
# workbench.shadow sets it to compare an op's calls in the real loop with the reference.
_WRAP: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("workbench_op_wrap",
                                                                       default=None)


@contextlib.contextmanager
def wrapping(wrap: Callable) -> Iterator[None]:
    """While active, `get` returns wrap(name, fn) for every op (workbench.shadow compares calls
    with the reference, workbench.route_trace records them). An outer wrapper stays in force:
    the inner one sees the outer's result as its fn."""
    outer = _WRAP.get()
    token = _WRAP.set(wrap if outer is None else (lambda name, fn: wrap(name, outer(name, fn))))
    try:
        yield
    finally:
        _WRAP.reset(token)


def register_op(name: str, doc: str, reference: str | Callable, **hooks) -> OpSpec:
    if name in _OPS:
        raise ValueError(f"op {name!r} is already registered")
    spec = OpSpec(name=name, doc=doc, **hooks)
    spec.add(Variant(REFERENCE, reference, description="plain PyTorch, float64-accumulated"))
    _OPS[name] = spec
    return spec


def op_spec(name: str) -> OpSpec:
    if name not in _OPS:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {sorted(_OPS)}")
    return _OPS[name]


def list_ops() -> list[str]:
    return sorted(_OPS)


def selected(name: str) -> str:
    """The variant name currently selected for `name` (reference unless `use` says otherwise)."""
    op_spec(name)
    return _SELECTION.get().get(name, REFERENCE)


def get(name: str) -> Callable:
    """The callable currently selected for op `name` (wrapped while a shadow is active)."""
    fn = op_spec(name).variant(selected(name)).load()
    wrap = _WRAP.get()
    return fn if wrap is None else wrap(name, fn)


def _normalize(selection: Mapping[str, str] | str | None) -> dict[str, str]:
    if selection is None:
        return {}
    if isinstance(selection, str):
        # "reference" or a preset name such as "optimized" (registered by kernel issues)
        if selection == REFERENCE:
            return {op: REFERENCE for op in _OPS}
        if selection not in PRESETS:
            raise UnknownOpError(
                f"kernels: expected a mapping op -> variant or one of "
                f"{sorted([REFERENCE, *PRESETS])}, got {selection!r}"
            )
        return resolve_preset(PRESETS[selection])
    out = {}
    for op, variant in selection.items():
        op_spec(op).variant(variant)  # raises with the known names
        out[op] = variant
    return out


def resolve_selection(selection: Mapping[str, str] | str | None) -> dict[str, str]:
    """A selection as `use` takes it (a preset name, "reference", op -> variant) as the op ->
    variant mapping it selects on this machine (presets resolved through PORTABLE); unknown
    names fail as in `use`. For code that acts on the choice before the ops run (the
    emulation's load step)."""
    return _normalize(selection)


@contextlib.contextmanager
def use(selection: Mapping[str, str] | str | None = None, /, **kw: str) -> Iterator[dict]:
    """Select variants for the duration of a `with` block: `use(int4_moe="triton_v1")`.

    Unknown ops or variants fail at once with the known names. Selecting a variant that cannot
    run here (e.g. a CUDA kernel on a CPU box) fails at once too, naming the reason.
    """
    chosen = {**_normalize(selection), **_normalize(kw)}
    for op, variant in chosen.items():
        reason = op_spec(op).variant(variant).unavailable_reason()
        if reason:
            raise VariantUnavailable(f"{op}={variant} cannot run here: {reason}")
    merged = {**_SELECTION.get(), **chosen}
    token = _SELECTION.set(merged)
    try:
        yield merged
    finally:
        _SELECTION.reset(token)


# named selections, e.g. PRESETS["optimized"] = {"int4_moe": "triton_v2", ...}
PRESETS: dict[str, dict[str, str]] = {}
# op -> the version a preset selects where the one it names cannot run here: a kernel folder
# whose BEST needs hardware the interpreter does not emulate (tree_mla's Gluon kernel: sm_90)
# names its best version that runs everywhere (PORTABLE, e.g. on the CPU under the interpreter)
PORTABLE: dict[str, str] = {}


def resolve_preset(preset: Mapping[str, str]) -> dict[str, str]:
    """A preset's selection for this machine: each op's named version, or PORTABLE[op] where
    that version cannot run here (its needs, e.g. an sm_90 GPU, are unmet). Only presets are
    resolved: an explicit op=variant that cannot run still fails in `use`, naming the reason."""
    out = dict(preset)
    for op, variant in out.items():
        if op in PORTABLE and op_spec(op).variant(variant).unavailable_reason():
            out[op] = PORTABLE[op]
    return out


def unavailable_reason(needs) -> str | None:
    """The first unmet need of a variant or a peer ("cuda", "sm90", "nvcc", "triton", a package),
    or None."""
    for need in needs:
        reason = _check_need(need)
        if reason:
            return reason
    return None


def _check_need(need: str) -> str | None:
    if need == "cuda":
        import torch

        return None if torch.cuda.is_available() else "needs a CUDA GPU (none found)"
    if need == "sm90":
        import torch

        if not torch.cuda.is_available():
            return "needs an sm_90 GPU (no CUDA GPU found)"
        cc = torch.cuda.get_device_capability()
        return None if cc == (9, 0) else f"needs sm_90, this GPU is sm_{cc[0]}{cc[1]}"
    if need == "nvcc":  # kernels built for sm_90a at first use (int4_moe cuda_v19: wgmma)
        from workbench.kernels._sm90 import nvcc_path

        return None if nvcc_path() else (
            "needs nvcc (on PATH or in $CUDA_HOME/bin) to build for sm_90a")
    if need == "triton":
        # Triton kernels run on CUDA, or on CPU tensors through the interpreter, which must be
        # switched on before any kernel module is imported (the CLI and tests/conftest do it)
        import torch

        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            return "no CUDA GPU and TRITON_INTERPRET=1 not set (the interpreter runs it on CPU)"
    try:
        importlib.import_module(need)
    except Exception as e:  # ImportError, or a package that fails at import without a GPU
        return f"package {need!r} not importable ({type(e).__name__}: {e})"
    return None
