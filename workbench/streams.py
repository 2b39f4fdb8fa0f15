"""Side streams forked from the current stream and joined back by stream waits (events), which
torch.cuda.graph captures as parallel branches of a graph. Shared by the model's shared-expert
and attention forks (workbench/dist/model.py) and by ops that split their own work
(kernels/int4_moe/cuda_v7.py), each under its own stream key.
"""

from __future__ import annotations

import torch

_STREAMS: dict[tuple[torch.device, str], torch.cuda.Stream] = {}


class Side:
    """A side stream forked from the current stream of `device` (one stream a (device, key),
    shared by every fork under that key: forks under one key must not overlap), or, when `on`
    is false or the device is not CUDA, nothing: `run` then calls on the current stream and
    `fork` / `join` do nothing. Fork / join are stream waits (events), which torch.cuda.graph
    captures. priority: the stream's, when this key's stream is first made (lower is higher;
    torch clamps it to the device's range)."""

    def __init__(self, device, on: bool, key: str = "model", priority: int = 0):
        device = torch.device(device)
        self.stream = None
        if on and device.type == "cuda":
            self.main = torch.cuda.current_stream(device)
            self.stream = _STREAMS.get((device, key))
            if self.stream is None:
                self.stream = _STREAMS[(device, key)] = torch.cuda.Stream(device, priority=priority)

    def fork(self, *inputs: torch.Tensor) -> None:
        """The side stream waits for what the current stream queued so far; `inputs` (made
        on the current stream) stay allocated until the side stream's work on them is done."""
        if self.stream is not None:
            self.stream.wait_stream(self.main)
            for t in inputs:
                t.record_stream(self.stream)

    def run(self, fn):
        """fn() on the side stream (or the current one)."""
        if self.stream is None:
            return fn()
        with torch.cuda.stream(self.stream):
            return fn()

    def join(self, *outputs: torch.Tensor) -> None:
        """The current stream waits for the side stream; `outputs` (made on the side stream)
        are used and freed on the current one."""
        if self.stream is not None:
            self.main.wait_stream(self.stream)
            for t in outputs:
                t.record_stream(self.main)
