"""int4_moe cuda_v19: cuda_v18 with the hot gate/up launch's MMAs on wgmma (sm_90a): a k16 step's
dequantised A fragments serve a whole pass of slots in one instruction a tile.

Why (session 45, `python3 scripts/hot_issue_model.py`, README "What limits skewed T 128 / 512"):
cuda_v10's hot loop (every later version's hot launch) issues 442 SASS a 4096-weight step at
32-slot passes, 277 of them dequant and 64 HMMA, and dequantises an expert's weights again every
pass: at perfect issue its passes take 103-116 µs at skewed T 128 against their bytes' 110-116
µs at copy speed, 455-479 against 336-373 at skewed T 512 (H100 figures), and ncu measured the
launch issue-bound (session 34). Here the same dequant feeds wgmma m64nNk16 (N = the pass's
8-slot n-tiles x 8), so the HMMAs and the activation LDS of every n-tile go (B is read by
descriptor from shared memory).

What: cuda_v18's op, dispatch and tiles, with `launch_bands_wg` as the hot hook: at WG 1 (the
default) one permute launch writes the call's activations in logical-k order (`xperm`: the
order wgmma reads B's k in, matched to the repacked A fragments, mma_layout.logical_k_perm),
then cuda_v12's bands run cuda_v19.cu's kernel in place of cuda_v10.cu's (the same work list,
CTA shape, weight ring, knobs and epilogue). WG 0: cuda_v18's launches and bits. Built by nvcc
for sm_90a (`-gencode=arch=compute_90a,code=sm_90a`: wgmma needs the 'a' target; NVRTC through
cupy builds plain sm_90), cached by source hash under WORKBENCH_KERNEL_CACHE (default
~/.cache/workbench/kernels).
Numerics: cuda_v10's dequant (W = bf16((q - 8) s)) and fp32 sums, but inside a wgmma whose
k16 association PTX does not promise to be mma.sync's: the reference's tolerance, not
cuda_v18's bits, on calls with hot experts; calls without are cuda_v18's launches. Graph-safe:
xp is allocated from shapes and held until the hot launches are joined. GPU only (cupy, nvcc).
Dimension legend: cuda_v1.cu's, cuda_v10.cu's and cuda_v19.cu's.

Measured (session 46, traces/gpu/session46): GPU tests and the shared suites pass (H100); the
hot launch 286.1 µs against cuda_v18's 324.8 at skewed T 128 (H200, `--by-kernel`), but the op
within the rounds of cuda_v18 (H100: skewed T 65 / 128 / 512 1419.4 / 1966.8 / 3774.4 vs 1416.9
/ 1971.1 / 3813.7 µs; uniform T 128 / 512 1-2 % slower): the hot launch runs beside the ~1020 µs
cold launch (WS 1), which with the down GEMM makes the op. Not BEST.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile

import torch
from torch import Tensor

from .._sm90 import nvcc_path
from . import cuda_v1, cuda_v10, cuda_v12, cuda_v17, cuda_v18, mma_layout
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

WG_DEFAULTS = {"WG": 1}
_SRC = os.path.join(os.path.dirname(__file__), "cuda_v19.cu")
ARCH = ("-gencode=arch=compute_90a,code=sm_90a",)
SMEM_PAD = 1024  # the activation ring's swizzle atoms start 1024-byte aligned
HOT_ARGS = ("u64 w_ptr, u64 s_ptr, u64 x_ptr, u64 slots_ptr, u64 act_e_ptr, u64 act_start_ptr, "
            "u64 act_cnt_ptr, u64 n_act_ptr, u64 h_ptr, int topk, int NU, int C, int ldx, "
            "int k_real, int ldo, int ht, int hi, int max_items")


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v18's tiles and WG_DEFAULTS."""
    return cuda_v18.tiles(T, K, E, D, I, slots) | WG_DEFAULTS


def kernel_name(wu: int, nt: int, st: int, mb: int, prefix: str = "int4_moe_hot_wg") -> str:
    return f"{prefix}_{wu}_{nt}_{st}_{mb}"


def source(configs=(), *, files=(), body: str = "hot_wg_body", threads_a_unit: int = 32,
           prefix: str = "int4_moe_hot_wg") -> str:
    """cuda_v1.cu + cuda_v10.cu + cuda_v19.cu (+ a later version's `files`) and one extern "C"
    kernel a (WU, NT, ST, MB) of `configs`: __launch_bounds__(threads_a_unit WU, MB) around
    `body`<WU, NT, ST> with int4_moe_hot's arguments."""
    code = "".join(open(p).read() + "\n" for p in (cuda_v1._SRC, cuda_v10._SRC, _SRC, *files))
    for wu, nt, st, mb in configs:
        code += (f'extern "C" __global__ void __launch_bounds__({threads_a_unit * wu}, {mb}) '
                 f"{kernel_name(wu, nt, st, mb, prefix)}({HOT_ARGS}) {{\n"
                 f"  {body}<{wu}, {nt}, {st}>(w_ptr, s_ptr, x_ptr, slots_ptr, act_e_ptr, "
                 "act_start_ptr, act_cnt_ptr, n_act_ptr, h_ptr, topk, NU, C, ldx, k_real, ldo, "
                 "ht, hi, max_items);\n}\n")
    return code


def nvcc() -> str:
    """The nvcc to build with (`_sm90.nvcc_path`; a clear error where there is none)."""
    path = nvcc_path()
    if path is None:
        raise RuntimeError("int4_moe cuda_v19: expected nvcc (CUDA 12.0+, sm_90a) on PATH or in "
                           f"$CUDA_HOME/bin ({os.environ.get('CUDA_HOME', '/usr/local/cuda')}), "
                           "got none")
    return path


def build_cubin(code: str, extra: tuple[str, ...] = ()) -> tuple[str, str]:
    """(path of the sm_90a cubin of `code`, ptxas' log): cached by a hash of the source, the
    flags and nvcc's version; written to a temporary name, then renamed (concurrent builds)."""
    exe = nvcc()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    flags = ("-cubin", "-std=c++17", "-O3", *ARCH, "-Xptxas", "-v", *extra)
    key = hashlib.sha256("\0".join((code, version, *flags)).encode()).hexdigest()[:24]
    root = os.environ.get("WORKBENCH_KERNEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "workbench", "kernels")
    os.makedirs(root, exist_ok=True)
    out, log_path = os.path.join(root, f"int4_moe_v19_{key}.cubin"), os.path.join(
        root, f"int4_moe_v19_{key}.log")
    if os.path.exists(out) and os.path.exists(log_path):
        return out, open(log_path).read()
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        src = os.path.join(tmp, "k.cu")
        with open(src, "w") as f:
            f.write(code)
        r = subprocess.run([exe, *flags, "-o", os.path.join(tmp, "k.cubin"), src],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"int4_moe cuda_v19: nvcc failed ({' '.join(flags)}):\n"
                               f"{r.stderr[-4000:]}")
        with open(os.path.join(tmp, "k.log"), "w") as f:
            f.write(r.stderr)
        os.replace(os.path.join(tmp, "k.log"), log_path)
        os.replace(os.path.join(tmp, "k.cubin"), out)
    return out, r.stderr


@functools.cache
def module(code: str):
    """The loaded cupy module of `code`'s sm_90a build (one a source: cuda_v19's and cuda_v20's
    configurations and the permute kernel)."""
    import cupy

    return cupy.RawModule(path=build_cubin(code)[0])


@functools.cache
def _kernel_wg(kpad: int, wu: int, nt: int, st: int, mb: int):
    """cuda_v10's `_kernel` signature (KPAD unused: xp holds zeros past k_real; both
    KPAD values' wrappers are one CUfunction, whose shared-memory limit cuda_v1.opt_in keys by
    its handle)."""
    return module(source(((wu, nt, st, mb),))).get_function(kernel_name(wu, nt, st, mb))


@functools.cache
def _xperm_kernel():
    return module(source()).get_function("int4_moe_xperm")


def xperm_reference(x: Tensor, k_real: int, KP: int) -> Tensor:
    """The CPU twin of `int4_moe_xperm`: x [T, >= k_real] -> xp [T, KP] = x[:, perm] with zeros
    past k_real (perm: mma_layout.logical_k_perm)."""
    xz = torch.nn.functional.pad(x[:, :k_real], (0, KP - k_real))
    return xz[:, mma_layout.logical_k_perm(KP, x.device)].contiguous()


def check_rows16(xq: Tensor) -> None:
    """x as the permute kernels read it (cuda_v19's xperm, cuda_v24's xgather), else an error
    naming it: bf16 rows, unit stride, a row stride a multiple of 8, 16-byte aligned."""
    _require(xq.dtype == torch.bfloat16 and xq.stride(1) == 1 and xq.stride(0) % 8 == 0
             and xq.data_ptr() % 16 == 0, "x", "bf16 rows with unit stride, a row stride a "
             "multiple of 8 and a 16-byte aligned start (16-byte loads)",
             (xq.dtype, xq.stride(), xq.data_ptr() % 16))


def xperm(xq: Tensor, k_real: int, KP: int) -> Tensor:
    """xp [T, KP] bf16: xq's rows in logical-k order, zeros past k_real (cuda_v19.cu's
    int4_moe_xperm, on the current stream)."""
    T = xq.shape[0]
    check_rows16(xq)
    xp = torch.empty(T, KP, dtype=torch.bfloat16, device=xq.device)
    n = T * (KP // 32)
    if n:
        fn = _xperm_kernel()
        args = cuda_v1.kernel_args((xq, xp, T, xq.stride(0), k_real, KP))
        cuda_v1.run_kernel(fn, (-(-n // 256),), (256,), args, 0)
    return xp


def launch_hot_wg(c: dict, p, xp: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                  h: Tensor) -> tuple:
    """cuda_v10's `launch_hot` on cuda_v19.cu's kernel (x = xp, ldx = KP)."""
    return cuda_v10.launch_hot(c, p, xp, w1, s1, NU1, C1, h, kernel=_kernel_wg,
                               smem_pad=SMEM_PAD)


def launch_bands_wg(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                    h: Tensor, *, launch=None) -> tuple:
    """cuda_v4's `hot` hook: at WG 0, or where no expert can be hot, cuda_v12's
    `launch_bands`; else xp = `xperm`(xq) on the current stream, then cuda_v12's bands on
    cuda_v19.cu's kernel (or a later version's `launch`, `launch_hot_wg`'s signature: cuda_v20);
    the join returned also releases xp (after the hot launches)."""
    wg = c.get("WG", 1)
    _require(wg in (0, 1), "cfg['WG']", "0 or 1", wg)
    if not wg or not c["WIDE"] or p.S <= c["WT"]:
        return cuda_v12.launch_bands(c, p, xq, w1, s1, NU1, C1, h)
    xp = xperm(xq, p.D, C1 * mma_layout.CHUNK)
    ht, join = cuda_v12.launch_bands(c, p, xp, w1, s1, NU1, C1, h,
                                     launch=launch or launch_hot_wg)
    held = [xp]

    def join_wg():
        if join is not None:
            join()
        held.clear()  # the side stream is joined: xp's memory may be reused from here

    return ht, join_wg


# the op and its CLI: cuda_v18's dispatch and tiles, the hot launches on wgmma
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v18;base", hot_for=launch_bands_wg)


if __name__ == "__main__":
    raise SystemExit(_main())
