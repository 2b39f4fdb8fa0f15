"""CPU by default: Triton through its interpreter, numba through its simulator; `gpu` tests skip.

The environment variables must be set before any kernel module is imported (Triton reads
TRITON_INTERPRET when @triton.jit runs, numba reads NUMBA_ENABLE_CUDASIM at import).
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    # Toy shapes are latency-bound: threaded MKL small GEMMs spin on a 2-core box (~100x slower).
    torch.set_num_threads(1)


def _default_versions() -> dict[str, set[str]]:
    """{op: {BEST, PORTABLE, newest}}: the kernel versions whose CPU tests the default run keeps
    (PORTABLE: what the presets run where BEST cannot, e.g. tree_mla on a CPU box)."""
    import importlib
    import re

    from workbench.kernels import FOLDERS

    def number(name: str) -> int:
        m = re.fullmatch(r"triton_v(\d+)", name)
        return int(m.group(1)) if m else -1

    keep = {}
    for folder in FOLDERS:
        mod = importlib.import_module(f"workbench.kernels.{folder}")
        names = list(mod.VARIANTS.get(folder, {}))
        if getattr(mod, "BEST", None) and names:
            keep[folder] = {mod.BEST, getattr(mod, "PORTABLE", mod.BEST),
                            max(names, key=number)}
    return keep


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the `extended` marks below must exist
def pytest_collection_modifyitems(config, items):
    """GPU tests skip without CUDA. In tests/test_<op>_kernel.py, a CPU test parametrised by
    `version` is `extended` (opt-in: pytest -m extended) unless the version is the folder's
    BEST, PORTABLE or its newest: the interpreter is slow and every numbered version is kept."""
    keep = _default_versions()
    for item in items:
        if "gpu" in item.keywords:
            if not HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason="no CUDA device"))
            continue
        op = item.module.__name__.rpartition(".")[2].removeprefix("test_").removesuffix("_kernel")
        version = getattr(getattr(item, "callspec", None), "params", {}).get("version")
        if op in keep and isinstance(version, str):
            name = version if version.startswith("triton_") else f"triton_{version}"
            if name not in keep[op]:
                item.add_marker(pytest.mark.extended)
    # Longest first: the `slow` tests (20-100 s each in the interpreter) start before the
    # thousands of short ones, which then even out the workers' ends (pytest-xdist hands out
    # tests in this order; pytest_configure below makes it one at a time). Collected order
    # otherwise: a module's tests stay together, so its fixtures are built once a worker.
    items.sort(key=lambda item: "slow" not in item.keywords)


def pytest_configure(config):
    # pytest-xdist's load scheduling sends each worker a quarter of its share up front, so a
    # slow test collected late can run alone at the end on one worker (the CPU suite's wall
    # was ~200 s over its tests' sum / workers); one at a time (two queued) instead.
    if getattr(config.option, "maxschedchunk", "absent") is None:
        config.option.maxschedchunk = 1


@pytest.fixture(autouse=True)
def _seeded_global_rng(request):
    """Each test starts from its own fixed global RNG state (a hash of its id): tests that
    draw unseeded inputs (torch.randn without a generator) then see the same inputs whichever
    tests ran before them in the worker (pytest-xdist hands tests out as workers free up), so
    a result never depends on the schedule."""
    import random
    import zlib

    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    random.seed(seed)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(scope="session")
def tiny_target():
    """The tiny preset's target with seed-0 synthetic weights (shared: tests must not mutate)."""
    import workbench

    return workbench.build_model("tiny", seed=0)


@pytest.fixture(scope="module")
def real_experts():
    """One Kimi K2.6 MoE layer's routed experts on the GPU (checkpoint layout) and the config:
    the int4_moe CUDA suites' REAL shapes (tests/test_int4_moe_cuda*.py)."""
    from workbench.config import ModelConfig
    from workbench.ops.cases import _experts, _Rand

    cfg = ModelConfig.preset("kimi-k2.6")
    return _experts(_Rand(0, "cuda"), cfg.n_routed_experts, cfg.hidden_size,
                    cfg.moe_intermediate), cfg
