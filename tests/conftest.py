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


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(scope="session")
def tiny_target():
    """The tiny preset's target with seed-0 synthetic weights (shared: tests must not mutate)."""
    import workbench

    return workbench.build_model("tiny", seed=0)
