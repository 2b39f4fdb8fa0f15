"""Collectives behind one small interface, timed and byte-counted per phase.

The distributed model never calls torch.distributed itself: it calls `Comm.all_reduce`,
`all_gather_cat` and `all_to_all`. `TorchComm` runs them for real (gloo on CPU, NCCL on GPUs);
`workbench.dist.emulate.StandInComm` returns stand-in tensors of the right shapes and charges
modelled time, so ONE rank's real per-step work can run alone at full size.

Every call is logged under the phase the model is in (attention, moe, dense, lm_head, draft),
so a step splits into per-phase compute and per-phase communication.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist


class StepLog:
    """Inclusive seconds per phase, and (calls, bytes, seconds) per (phase, collective)."""

    def __init__(self, device=None):
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.phase = "other"
        self.phase_s: dict[str, float] = defaultdict(float)
        self.comm: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0, 0.0])

    def sync(self) -> None:
        if self.cuda:  # kernel launches are asynchronous: time what ran, not what was queued
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, phase: str):
        prev, self.phase = self.phase, phase
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.phase_s[phase] += time.perf_counter() - t0
            self.phase = prev

    def add_comm(self, kind: str, nbytes: int, seconds: float) -> None:
        c = self.comm[(self.phase, kind)]
        c[0] += 1
        c[1] += int(nbytes)
        c[2] += seconds

    def summary(self) -> dict:
        """{phase}_s (compute: inclusive minus its collectives), comm_s, comm_bytes, calls."""
        comm_in = defaultdict(float)
        for (phase, _), (_, _, s) in self.comm.items():
            comm_in[phase] += s
        out = {f"{p}_s": t - comm_in[p] for p, t in self.phase_s.items()}
        out["comm_s"] = sum(c[2] for c in self.comm.values())
        out["comm_bytes"] = sum(c[1] for c in self.comm.values())
        out["comm_calls"] = sum(c[0] for c in self.comm.values())
        return out

    def table(self) -> list[dict]:
        return [{"phase": p, "collective": k, "calls": c[0], "bytes": c[1], "seconds": c[2]}
                for (p, k), c in sorted(self.comm.items())]


class Comm:
    """Interface; world 1 makes every collective the identity (no process group needed)."""

    rank: int = 0
    world: int = 1

    def __init__(self, log: StepLog | None = None):
        self.log = log or StepLog()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (fp32 partials in, fp32 sums out)."""
        return t

    def all_gather_cat(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's `t` concatenated along `dim` in rank order."""
        return t

    def all_to_all(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                   standin=None) -> torch.Tensor:
        """Rows send[sum(send_splits[:r]):...] go to rank r; returns the rows received, by
        source rank. `standin()` builds what a stand-in comm returns (ignored here)."""
        return send


class TorchComm(Comm):
    """torch.distributed collectives on the default process group."""

    def __init__(self, log: StepLog | None = None, group=None, via_all_to_all: bool | None = None):
        super().__init__(log)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        # gloo on an oversubscribed CPU box is latency-bound: 8 ranks on 2 cores took 19 ms
        # per ring all_reduce and 11 ms per all_gather of 1 KB, but 4 ms per all_to_all_single.
        # So on gloo both run as ONE all-to-all of the whole tensor, summed in rank order on
        # every rank (fixed order, identical on all ranks whatever gloo's algorithm). NCCL
        # keeps its native collectives. Bytes are logged as the logical payload either way.
        if via_all_to_all is None:
            via_all_to_all = dist.get_backend(group) == "gloo"
        self.via_all_to_all = via_all_to_all

    def _replicate(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's t, [world, *t.shape], by one all_to_all_single."""
        send = t.reshape(1, -1).expand(self.world, -1).contiguous()
        out = torch.empty_like(send)
        dist.all_to_all_single(out, send, group=self.group)
        return out.view(self.world, *t.shape)

    def _timed(self, kind: str, nbytes: int, fn):
        self.log.sync()
        t0 = time.perf_counter()
        out = fn()
        self.log.sync()
        self.log.add_comm(kind, nbytes, time.perf_counter() - t0)
        return out

    def all_reduce(self, t):
        if self.world == 1:
            return t
        t = t.contiguous()
        if not self.via_all_to_all:
            self._timed("all_reduce", t.numel() * t.element_size(),
                        lambda: dist.all_reduce(t, group=self.group))
            return t
        parts = self._timed("all_reduce", t.numel() * t.element_size(),
                            lambda: self._replicate(t))
        out = parts[0].clone()
        for r in range(1, self.world):  # rank order
            out += parts[r]
        return out

    def all_gather_cat(self, t, dim):
        if self.world == 1:
            return t
        t = t.contiguous()
        if self.via_all_to_all:
            parts = self._timed("all_gather", t.numel() * t.element_size(),
                                lambda: self._replicate(t)).unbind(0)
        else:
            parts = [torch.empty_like(t) for _ in range(self.world)]
            self._timed("all_gather", t.numel() * t.element_size(),
                        lambda: dist.all_gather(parts, t, group=self.group))
        return torch.cat(parts, dim)

    def all_to_all(self, send, send_splits, recv_splits, standin=None):
        if self.world == 1:
            return send
        send = send.contiguous()
        out = send.new_empty((sum(recv_splits), *send.shape[1:]))
        row = send.shape[1:].numel() * send.element_size()  # bytes per row (0 rows is fine)
        remote = sum(n for r, n in enumerate(send_splits) if r != self.rank)
        self._timed("all_to_all", remote * row, lambda: dist.all_to_all_single(
            out, send, list(recv_splits), list(send_splits), group=self.group))
        return out
