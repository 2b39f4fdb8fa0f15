"""One CUDA graph per decode step: `GraphedStep` captures a step function once and replays it.

The decode loop (workbench/generate.py) splits each step into a device part with fixed shapes
for a given (batch, budget) — draft, build, verify, walk, KV commit (and the drafter's context
materialisation when a `drafter_materialize` kernel is selected) — and the host part (emit
tokens, stop rules; the reference materialisation). `GraphedStep(fn)` turns the device part into a
graph:

    first call   copy the inputs into static buffers, run fn eagerly on a side stream (Triton
                 compiles, cuBLAS workspaces, allocator warm-up), capture fn into a graph;
    every call   copy the inputs into the static buffers, replay, return the static outputs.

Eager warm-up runs the step on the live state once more than the eager loop would. That is
safe because a step is idempotent for fixed inputs: it reads the committed cache [0, P) and
rewrites the slots it owns ([P, P + N) of the target cache, the drafter's block slots), so
running it twice leaves what running it once leaves. The outputs live in the graph's memory
pool and are overwritten by the next replay: the caller copies out what it keeps.

Needs: every op the step calls is capture-safe (no host sync, no data-dependent shapes, no CPU
tensors): the optimized kernels are; the float64 references are not (they read lengths on the
host). Capture errors name the op that broke it as far as PyTorch says.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class GraphCaptureError(RuntimeError):
    """The step could not be captured (an op synchronised with the host, or similar)."""


def copy_out(obj):
    """A tree of tensors (tuples, lists, dicts, dataclasses) with every tensor cloned."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: copy_out(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(copy_out(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: copy_out(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj)})
    return obj



class GraphedStep:
    """fn(*tensors) -> outputs, replayed from one CUDA graph (see the module docstring).

    The input tensors' shapes, dtypes and device are fixed at the first call; later calls
    with other shapes raise (one GraphedStep per (batch, budget) bucket).
    """

    def __init__(self, fn: Callable, warmup: int = 1, name: str = "step"):
        if not torch.cuda.is_available():
            raise GraphCaptureError(f"{name}: CUDA graphs need a CUDA device (none found)")
        self.fn, self.warmup, self.name = fn, warmup, name
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: list[torch.Tensor] = []
        self.static_out = None
        self.replays = 0

    def _check(self, inputs) -> None:
        for i, (x, s) in enumerate(zip(inputs, self.static_in, strict=True)):
            if x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
                raise ValueError(
                    f"{self.name} input {i}: expected {tuple(s.shape)} {s.dtype} on {s.device} "
                    f"(the captured bucket), got {tuple(x.shape)} {x.dtype} on {x.device}")

    def _capture(self, inputs) -> None:
        bad = [i for i, x in enumerate(inputs) if not x.is_cuda]
        if bad:
            raise ValueError(f"{self.name}: inputs {bad} are not CUDA tensors")
        self.static_in = [x.clone() for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.static_out = self.fn(*self.static_in)
        except Exception as e:  # noqa: BLE001 - re-raised with the step's name
            raise GraphCaptureError(
                f"{self.name}: CUDA-graph capture failed ({type(e).__name__}: {e}); every op "
                "in the step must be capture-safe (select the optimized kernels)") from e
        self.graph = graph

    def __call__(self, *inputs: torch.Tensor):
        if self.graph is None:
            self._capture(inputs)
        else:
            self._check(inputs)
            for s, x in zip(self.static_in, inputs, strict=True):
                s.copy_(x)
        self.graph.replay()
        self.replays += 1
        return self.static_out
