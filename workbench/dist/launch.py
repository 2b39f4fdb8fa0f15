"""Starting ranks: from a notebook or a test (`run_distributed`) and under torchrun.

run_distributed(fn, world_size, ...) spawns one process per rank with torch.multiprocessing,
initialises the process group (gloo on CPU, NCCL on GPUs), calls fn(rank, world, *args) on each
and returns rank 0's result. It never hangs:
  * init and every collective carry `collective_timeout_s` (gloo and NCCL raise after it);
  * the parent is a watchdog: the first rank that raises or dies ends all ranks at once, and
    the error names that rank, its exception and traceback; past `timeout_s` all ranks are
    ended and DistributedTimeout names those still running;
  * each rank also arms faulthandler, so it dumps its stack and exits if orphaned.
Start method: fork by default on gloo (0.3 s for 8 ranks, ecosystem.md §6; fn may be defined
in a notebook), spawn with NCCL (fork after CUDA initialisation is unsafe; fn must then be
importable, i.e. defined in a module).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import socket
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Shared multi-GPU test machines keep NVLink multicast (NVLS) off (DESIGN.md §9); the users'
# own boxes may turn it on (SGLang measured +5% on B300): a setting, default off.
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


class DistributedError(RuntimeError):
    """A rank raised or died; `.rank` is the first one, `.errors` all (rank, message, tb)."""

    def __init__(self, message: str, rank: int | None = None, errors=()):
        super().__init__(message)
        self.rank, self.errors = rank, list(errors)


class DistributedTimeout(DistributedError):
    """The run outlived its timeout; `.ranks` are those still running."""


def apply_nccl_env(multicast: bool = False) -> None:
    """NVLink multicast off (default) or on, for NCCL, symmetric memory and NVSHMEM."""
    for k, v in NVLS_OFF.items():
        if multicast:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def rank_device(backend: str, local_rank: int) -> torch.device:
    return torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")


def init_rank(rank: int, world: int, backend: str, init_method: str = "env://",
              timeout_s: float = 60.0, local_rank: int | None = None) -> torch.device:
    """init_process_group with a timeout on init and on every collective; returns the device."""
    device = rank_device(backend, rank if local_rank is None else local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    return device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _arm_watchdog(seconds: float) -> None:
    """Dump every thread's stack and exit after `seconds`: a rank never outlives its run, even
    orphaned. Writes to the real stderr (a notebook's or pytest's replacement has no fd)."""
    import sys

    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__)


def _worker(rank, world, fn, args, kwargs, q, init_method, backend, coll_timeout, threads,
            env, watchdog_s):
    os.environ.update({**env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "WORLD_SIZE": str(world)})
    torch.set_num_threads(threads)  # ranks share the cores; threaded small GEMMs spin
    try:
        _arm_watchdog(watchdog_s)
        init_rank(rank, world, backend, init_method, coll_timeout)
        out = fn(rank, world, *args, **kwargs)
        # plain pickle: torch's queue pickler would pass tensors as shared-memory handles that
        # vanish when this process exits, before the parent reads them
        q.put(("ok", rank, pickle.dumps(out if rank == 0 else None), ""))
    except BaseException as e:  # noqa: B036 - report everything, the parent decides
        q.put(("err", rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, backend: str = "gloo",
                    start_method: str | None = None, timeout_s: float = 300.0,
                    collective_timeout_s: float | None = None, threads: int = 1,
                    multicast: bool = False, **kwargs):
    """Run fn(rank, world, *args, **kwargs) on `world_size` ranks; return rank 0's result.

    Raises DistributedError (naming the failing rank, its exception and traceback) when any
    rank raises or dies, DistributedTimeout when the whole run passes `timeout_s`.
    collective_timeout_s (default min(timeout_s, 60)) bounds init and each collective.
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend nccl: expected {world_size} GPUs, found "
                         f"{torch.cuda.device_count()}")
    start_method = start_method or ("spawn" if backend == "nccl" else "fork")
    coll = min(timeout_s, 60.0) if collective_timeout_s is None else collective_timeout_s
    env = {"MASTER_ADDR": "127.0.0.1"}
    if backend == "nccl":
        env |= {} if multicast else NVLS_OFF
    ctx = mp.get_context(start_method)
    q = ctx.SimpleQueue()
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_worker, name=f"rank{r}", daemon=True, args=(
        r, world_size, fn, args, kwargs, q, init, backend, coll, threads, env, timeout_s + 30))
        for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        return _supervise(procs, q, time.monotonic() + timeout_s, timeout_s)
    finally:
        for p in procs:  # never leave a rank behind, whatever happened
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()


def _supervise(procs, q, deadline, timeout_s):
    world = len(procs)
    done, errors, result = set(), [], None

    def drain():
        nonlocal result
        while not q.empty():
            kind, rank, payload, tb = q.get()
            if kind == "ok":
                done.add(rank)
                result = pickle.loads(payload) if rank == 0 else result
            else:
                errors.append((rank, payload, tb))

    def silent_deaths():
        """Ranks gone without a message (os._exit, a signal, a native crash): their death is
        what the peers' 'connection reset' errors report, so they go first."""
        drain()  # a last message may have landed after the previous drain
        told = done | {e[0] for e in errors}
        return [(r, f"exited with code {p.exitcode} without reporting (killed, or crashed in "
                    "native code)", "") for r, p in enumerate(procs)
                if r not in told and not p.is_alive()]

    while len(done) < world:
        wait([q._reader] + [p.sentinel for p in procs], timeout=0.05)
        drain()
        if not errors:  # (not +=: silent_deaths' own drain may append a peer's error first)
            errors[:0] = silent_deaths()
        if errors:
            time.sleep(0.3)  # let peers' follow-on errors arrive, then report the first
            errors[:0] = silent_deaths()
            r, msg, tb = errors[0]
            also = "".join(f"\n  (then rank {e[0]}: {e[1].splitlines()[0][:200]})"
                           for e in errors[1:])
            raise DistributedError(f"rank {r} of {world} failed: {msg}{also}\n"
                                   f"--- rank {r} traceback ---\n{tb}", r, errors)
        if time.monotonic() > deadline:
            running = [r for r in range(world) if r not in done]
            err = DistributedTimeout(f"timed out after {timeout_s:.0f} s: ranks {running} of "
                                     f"{world} still running (a hung collective or a rank "
                                     "stuck outside one); all ranks ended")
            err.ranks = running
            raise err
    return result
