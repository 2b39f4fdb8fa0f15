"""Peers: external implementations timed in the same table as our variants (DESIGN.md §6).

    Peer(name, op, load, prepare): load() -> callable (imports lazily), prepare(case) -> args

A peer whose package or hardware is missing reports "not installed: <why>" instead of failing;
one that loads but computes something else is still timed, flagged ok=False, and never sets
the "x best peer" bar. Peers see the same Case as the variants; `prepare` converts its inputs
to the peer's layout (dequantised weights, dense masks, routing metadata ...) outside the
timed region, and each peer's description says what that leaves out of its time.

Adapters: int4_moe: humming (humming-kernels W4A16, indexed MoE), grouped_mm_bf16;
tree_mla: sdpa_dense, flex_attention; tree_build: cpu_heapq.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# comparisons (also the bench's fallback checker while workbench.check is absent)


def leaves(obj):
    """Tensors reachable from obj, in order (tuples, lists, dicts, dataclasses)."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):  # a peer's prepared layer: its weights count
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from leaves(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from leaves(getattr(obj, f.name))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64 over entries finite in both (inf if the patterns differ)."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if o.shape != r.shape or not torch.equal(torch.isfinite(o), torch.isfinite(r)):
        return math.inf
    both = torch.isfinite(o)
    diff, norm = (o - r)[both].norm().item(), r[both].norm().item()
    return diff / norm if norm > 0 else diff


def generic_compare(out, ref, tol: float | None = None) -> tuple[bool, str]:
    """Discrete tensors bitwise; floating ones by NaN/inf pattern and global relative error
    (bf16/fp16: 1e-2; fp32: 1e-3, which tf32 dots stay under, METHOD.md)."""
    outs, refs = list(leaves(out)), list(leaves(ref))
    if len(outs) != len(refs):
        return False, f"expected {len(refs)} output tensors, got {len(outs)}"
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if o.shape != r.shape:
            return False, f"output {i}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
        if not (o.is_floating_point() or r.is_floating_point()):
            if not torch.equal(o.cpu(), r.cpu()):
                return False, f"output {i}: discrete values differ from the reference"
            continue
        err = rel_err(o, r)
        limit = tol if tol is not None else (
            1e-2 if o.dtype in (torch.bfloat16, torch.float16) else 1e-3)
        if not err <= limit:
            return False, f"output {i}: rel err {err:.2e} > {limit:.0e}"
    return True, ""


def compare_first(out, ref, case=None, tol: float = 2e-2) -> tuple[bool, str]:
    """Peers return only the main output: compare it with the reference's first tensor.
    2e-2 because peers legitimately round differently (bf16 weights, bf16 softmax)."""
    o, r = next(leaves(out), None), next(leaves(ref), None)
    if o is None or r is None:
        return False, "no tensor output to compare"
    err = rel_err(o, r)
    return err <= tol, f"rel err {err:.1e}" + ("" if err <= tol else f" > {tol:.0e}")


# --------------------------------------------------------------------------------------------
# the interface


@dataclass
class Peer:
    name: str
    op: str
    load: Callable[[], Callable]  # imports lazily, returns fn(*args)
    prepare: Callable  # (case) -> tuple of positional args for fn, built outside the timing
    needs: tuple[str, ...] = ()  # "cuda" or importable module names
    description: str = ""
    compare: Callable = compare_first  # (out, ref_out, case) -> (ok, note)
    _fn: Callable | None = field(default=None, repr=False)

    def unavailable_reason(self) -> str | None:
        """None when the peer can run here, else why (the registry's variant rules)."""
        from workbench.ops.registry import unavailable_reason

        return unavailable_reason(self.needs)

    def loaded(self) -> Callable:
        if self._fn is None:
            self._fn = self.load()
        return self._fn


_PEERS: dict[str, dict[str, Peer]] = {}
_CACHES: dict[str, dict] = {}  # per op: converted weights etc., dropped by clear_caches


def register_peer(peer: Peer) -> Peer:
    _PEERS.setdefault(peer.op, {})[peer.name] = peer
    return peer


def peer_names(op: str) -> list[str]:
    return list(_PEERS.get(op, {}))


def get_peer(op: str, name: str) -> Peer:
    if name not in _PEERS.get(op, {}):
        raise KeyError(f"op {op!r} has no peer {name!r}; known: {peer_names(op)}")
    return _PEERS[op][name]


def clear_caches(op: str) -> None:
    """Drop converted weights (GBs at REAL shapes) once an op's benchmark is done."""
    _CACHES.pop(op, None)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _cache(op: str, key, build: Callable):
    c = _CACHES.setdefault(op, {})
    if key not in c:
        c[key] = build()
    return c[key]


def positional(fn: Callable, case) -> tuple:
    """case.args + case.kwargs bound to fn's signature (defaults filled), all positional."""
    bound = inspect.signature(fn).bind(*case.args, **case.kwargs)
    bound.apply_defaults()
    return bound.args


def _key(t: torch.Tensor):
    return (t.data_ptr(), tuple(t.shape), str(t.device))


def _ref(op: str) -> Callable:
    from workbench import ops

    return ops.op_spec(op).variant("reference").load()


# --------------------------------------------------------------------------------------------
# int4_moe: humming-kernels W4A16, indexed layout (what vLLM/SGLang run on SM90)
#
# UNTESTED ON A GPU as of writing: the calls follow humming-kernels 0.1.20's HummingLayer /
# HummingMethod API and SGLang's humming runner (w13 = [gate; up] fused, indexed gemm with
# sorted ids from the w13 tuning config's block size, w2 with top_k=1). Our packing is
# compressed-tensors `pack-quantized` (int4 + 8, lowest nibble first, bf16 group-32 scales),
# which humming converts itself. Routing metadata (humming ships no align kernel; its test
# helper loops over experts in Python) is built in prepare, so this row's time EXCLUDES it;
# SiLU*mul and the weighted top-k combine are plain torch ops and included.

_CT_INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "type": "int",
            "num_bits": 4, "strategy": "group", "group_size": 32, "symmetric": True}
_INDEXED = '{"gemm_type": "indexed", "use_f16_accum": false}'


def _humming_layers(ex):
    from humming.layer import HummingLayer

    E, inter, d = ex.gate_packed.shape[0], ex.gate_packed.shape[1], ex.down_packed.shape[1]

    def layer(packed, scale, n, k):
        lay = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(_CT_INT4), num_experts=E,
                           torch_dtype=torch.bfloat16).cuda()
        shape = torch.tensor([n, k], dtype=torch.int64).expand(E, 2).contiguous()
        lay.load_from_tensors({"weight_packed": packed, "weight_scale": scale,
                               "weight_shape": shape})
        lay.transform()
        return lay

    w13 = layer(torch.cat([ex.gate_packed, ex.up_packed], 1),
                torch.cat([ex.gate_scale, ex.up_scale], 1), 2 * inter, d)
    return w13, layer(ex.down_packed, ex.down_scale, d, inter)


def moe_align(ids: torch.Tensor, num_experts: int, block: int):
    """Indexed-MoE routing metadata (vLLM's moe_align_block_size, as humming's test helper
    builds it): the T*K slot ids grouped by expert, each expert padded to a multiple of
    `block` with the out-of-range id T*K; one expert id per block; the padded total."""
    flat = ids.reshape(-1).long()
    counts = torch.bincount(flat, minlength=num_experts)
    blocks = (counts + block - 1) // block
    padded = blocks * block
    order = torch.argsort(flat, stable=True)  # slot ids, grouped by expert
    e = flat[order]
    within = torch.arange(flat.numel(), device=ids.device) - (torch.cumsum(counts, 0) - counts)[e]
    total = int(padded.sum())
    sorted_ids = torch.full((total,), flat.numel(), dtype=torch.int32, device=ids.device)
    sorted_ids[(torch.cumsum(padded, 0) - padded)[e] + within] = order.int()
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, device=ids.device), blocks)
    return sorted_ids, expert_ids.int(), torch.tensor(total, dtype=torch.int32, device=ids.device)


def _humming_prepare(case):
    import json

    from humming.layer import HummingMethod

    x, ids, w, ex = positional(_ref("int4_moe"), case)
    w13, w2 = _cache("int4_moe", ("humming", _key(ex.gate_packed)), lambda: _humming_layers(ex))
    m = ids.numel()  # T*K rows of the indexed layout
    cfg13 = HummingMethod.get_default_tuning_configs(w13, gemm_type="indexed")
    cfg2 = HummingMethod.get_default_tuning_configs(w2, gemm_type="indexed")
    block = next(c["block_shape"][0] for lo, hi, c in cfg13 if lo < m <= hi)
    sorted_ids, expert_ids, padded = moe_align(ids, ex.gate_packed.shape[0], block)
    moe = {"sorted_ids": sorted_ids, "expert_ids": expert_ids, "num_tokens_padded": padded,
           "valid_shape_m": m, "compute_config": _INDEXED}
    return x, ids, w, (w13, w2, moe, json.dumps(cfg13), json.dumps(cfg2))


def _humming_moe(x, ids, w, state):
    w13, w2, moe, cfg13, cfg2 = state
    T, K = ids.shape
    inter = w2.shape_k
    gu = torch.empty(T * K, 2 * inter, dtype=torch.bfloat16, device=x.device)
    w13(x, outputs=gu, top_k=K, tuning_config=cfg13, **moe)  # rows t*K + j
    act = (F.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(torch.bfloat16)
    down = torch.empty(T * K, x.shape[1], dtype=torch.bfloat16, device=x.device)
    w2(act, outputs=down, top_k=1, tuning_config=cfg2, **moe)
    return (down.view(T, K, -1).float() * w.float().unsqueeze(-1)).sum(1).to(x.dtype)


def _humming_load():
    import humming.layer  # noqa: F401  (fails here, not mid-timing, when the wheel is broken)

    return _humming_moe


register_peer(Peer("humming", "int4_moe", _humming_load, _humming_prepare,
                   needs=("cuda", "humming"),
                   description="humming-kernels W4A16 indexed MoE (vLLM's SM90 default); "
                   "routing metadata excluded"))


# --------------------------------------------------------------------------------------------
# int4_moe: bf16 torch._grouped_mm on dequantised weights, same routing, metadata included.
# An upper bound on what "just use bf16 weights" buys: 3.56x the weight bytes of INT4.


def _dequant_experts(packed, scale):
    from workbench.reference.int4 import dequant_int4_g32

    E, O, words = packed.shape
    out = torch.empty(E, O, words * 8, dtype=torch.bfloat16, device=packed.device)
    for e in range(E):  # per expert: the int64 unpack temporaries of all 384 would be ~45 GB
        out[e] = dequant_int4_g32(packed[e], scale[e])
    return out


def _grouped_prepare(case):
    x, ids, w, ex = positional(_ref("int4_moe"), case)

    def build():
        w13 = torch.cat([_dequant_experts(ex.gate_packed, ex.gate_scale),
                         _dequant_experts(ex.up_packed, ex.up_scale)], 1)  # [E, 2I, D]
        return w13, _dequant_experts(ex.down_packed, ex.down_scale)  # [E, D, I]

    w13, w2 = _cache("int4_moe", ("bf16", _key(ex.gate_packed)), build)
    return x, ids, w, w13, w2


def grouped_mm_moe(x, ids, w, w13, w2):
    """x [T, D], ids/w [T, K], w13 [E, 2I, D], w2 [E, D, I] bf16 -> [T, D]."""
    T, K = ids.shape
    E, inter = w13.shape[0], w2.shape[2]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # rows grouped by expert
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    xs = x[order // K]  # [T*K, D]
    # B operands as transposed views of [E, N, K]-contiguous weights: the layout
    # _grouped_mm's SM90 path wants.
    h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)  # [T*K, 2I]
    act = (F.silu(h[:, :inter].float()) * h[:, inter:].float()).to(torch.bfloat16)
    y = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs)  # [T*K, D]
    out = torch.empty_like(y)
    out[order] = y
    return (out.view(T, K, -1).float() * w.float().unsqueeze(-1)).sum(1).to(x.dtype)


register_peer(Peer("grouped_mm_bf16", "int4_moe", lambda: grouped_mm_moe, _grouped_prepare,
                   description="bf16 torch._grouped_mm, dequantised weights, same routing"))


# --------------------------------------------------------------------------------------------
# tree_mla: SDPA with the tree as a dense [B, 1, N, T] mask; FlexAttention with it as mask_mod


def _mla_common(case):
    """(q [B,H,N,C+R], k [B,1,T,C+R], v [B,1,T,C], P, anc, scale, N, T) from a tree_mla case."""
    q, kv, P, anc, scale, C = positional(_ref("tree_mla"), case)
    B, N = q.shape[:2]
    t_used = int((P + N).max())
    live = torch.arange(t_used, device=kv.device).view(1, -1) < (P.view(-1, 1) + N)
    kv = kv[:, :t_used].masked_fill(~live.unsqueeze(-1), 0.0)  # rows past P_b+N may be NaN
    k = kv.unsqueeze(1).contiguous()
    v = kv[..., :C].unsqueeze(1).contiguous()
    return q.transpose(1, 2).contiguous(), k, v, P, anc, scale, N, t_used


def _sdpa_prepare(case):
    from workbench.reference.tree_mla import visible_mask

    qh, k, v, P, anc, scale, N, t_used = _mla_common(case)
    return qh, k, v, visible_mask(P, anc, N, t_used).unsqueeze(1), scale


def sdpa_tree(qh, k, v, mask, scale):
    o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return o.transpose(1, 2)  # [B, N, H, C]


register_peer(Peer("sdpa_dense", "tree_mla", lambda: sdpa_tree, _sdpa_prepare,
                   description="F.scaled_dot_product_attention, dense bool tree mask (built in "
                   "prepare)"))

_FLEX: dict = {}


def _flex_prepare(case):
    from torch.nn.attention.flex_attention import create_block_mask

    qh, k, v, P, anc, scale, N, t_used = _mla_common(case)

    def tree_mask(b, h, q_idx, kv_idx):  # committed prefix, or an ancestor-or-self tree slot
        rel = kv_idx - P[b]
        relc = rel.clamp(0, N - 1)
        bit = (anc[b, q_idx, relc // 64] >> (relc % 64)) & 1
        return (kv_idx < P[b]) | ((rel >= 0) & (rel < N) & (bit == 1))

    bm = create_block_mask(tree_mask, qh.shape[0], None, N, t_used, device=qh.device)
    return qh, k, v, bm, scale


_FLEX_OPTS = [None, {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1},
              {"BLOCK_M": 16, "BLOCK_N": 16, "num_stages": 1, "num_warps": 4}]


def flex_tree(qh, k, v, block_mask, scale):
    # 576/512 head dims overflow shared memory with the default blocks for most shapes (torch
    # 2.11 on the H200: "out of resource"; DESIGN.md §6): try smaller blocks, starting from
    # the options that worked last, and remember the winner.
    from torch.nn.attention.flex_attention import flex_attention

    # default dynamic=None: the second shape recompiles once with dynamic sizes, not per case
    fn = _FLEX.setdefault("fn", torch.compile(flex_attention))
    last = _FLEX.get("opts", None)
    errors = []
    for opts in [last] + [o for o in _FLEX_OPTS if o != last]:
        try:
            o = fn(qh, k, v, block_mask=block_mask, scale=scale, enable_gqa=True,
                   kernel_options=opts)
        except Exception as e:
            errors.append(f"{opts}: {type(e).__name__}")
            continue
        _FLEX["opts"] = opts
        return o.transpose(1, 2)
    raise RuntimeError("flex_attention failed with every kernel_options tried: " +
                       "; ".join(errors))


register_peer(Peer("flex_attention", "tree_mla", lambda: flex_tree, _flex_prepare,
                   needs=("cuda",),
                   description="FlexAttention, tree as mask_mod over the ancestor bits "
                   "(block mask built in prepare)"))


# --------------------------------------------------------------------------------------------
# tree_build: the CPU heapq reference with its device sync and copies (GPU -> CPU -> GPU)


def _heapq_load():
    from workbench.reference.tree_build import build_ddtree

    return build_ddtree


register_peer(Peer("cpu_heapq", "tree_build", _heapq_load,
                   lambda case: positional(_heapq_load(), case),
                   compare=lambda out, ref, case: generic_compare(out, ref),
                   description="Python heapq on the host; the timed region includes the "
                   "device->host copy, the sync and the host->device copy of the tree"))


# --------------------------------------------------------------------------------------------
# peers written in a kernel folder (kernels/<op>/peers.py calls register_peer at import)


def _import_folder_peers() -> None:
    import importlib
    import importlib.util

    from workbench.kernels import FOLDERS

    for folder in FOLDERS:
        name = f"workbench.kernels.{folder}.peers"
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


_import_folder_peers()
