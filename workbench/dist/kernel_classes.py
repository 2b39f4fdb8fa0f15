"""Where an emulated step's GPU time goes: the kernel table (`emulate --kernel-table`) grouped
into classes by kernel name.

Names are what torch.profiler reports: our Triton kernels by their function name, cuBLAS by
nvjet / cutlass / splitKreduce names, torch's own by at::native templates. Some names are
shared between ops (`_combine_kernel`: tree_mla's LSE merge and int4_moe's slot combine;
cuBLAS GEMMs: the target's projections and the drafter's), so a class is a kind of work, not
one op.
"""

from __future__ import annotations

import re

import pandas as pd

# (class, pattern on the kernel name), first match wins
CLASSES = (
    ("int4 MoE GEMMs", r"^_gemm_kernel$"),
    ("int4 MoE routing", r"^_(route|permute|silu)_kernel$|^_route_"),
    ("attention (tree_mla, drafter)", r"^_(attn|attn_split|combine)_kernel$"),
    ("dense GEMMs (cuBLAS)", r"nvjet|cutlass|cublas|gemv|splitKreduce|sm90_xmma"),
    ("our small kernels", r"^_\w+_kernel$"),
    ("torch glue (copies, casts, cats, gathers, fills, sorts)", r".*"),
)


def kernel_class(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name):
            return label
    raise AssertionError("the last class matches everything")


def by_class(table: pd.DataFrame) -> pd.DataFrame:
    """Kernel-table rows (layout, C, mode, kernel, calls, us) -> ms and calls per
    (layout, C, mode, class), largest first within a configuration."""
    t = table.assign(cls=table.kernel.map(kernel_class))
    out = t.groupby(["layout", "C", "mode", "cls"], as_index=False).agg(
        ms=("us", lambda u: u.sum() / 1e3), calls=("calls", "sum"))
    return out.sort_values(["layout", "C", "mode", "ms"], ascending=[True, True, True, False],
                           ignore_index=True)
