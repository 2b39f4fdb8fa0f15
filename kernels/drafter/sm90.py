"""Compile the drafter kernels for sm_90 on a CPU box: registers, spills, whether wgmma is used.

    python -m workbench.kernels.drafter.sm90      (TRITON_INTERPRET must be unset)

Signatures are those triton_v1's and materialize_v1's launchers pass at kimi-k2.6 drafter widths
(d 128, G 8, S 8, D 7168, F 18432); `ptxas -v` of the wheel (kernels/tree_build/sm90.py) reads
the resources.
"""

from __future__ import annotations

import os

from workbench.kernels._sm90 import ptxas_report


def _sig(names_types: str) -> dict:
    return dict(item.split(":") for item in names_types.split())


def kernels():
    """[(label, jit fn, signature, constexprs, num_warps)] at the REAL launch parameters."""
    from . import _attention as at
    from . import _fused as fu
    from . import _lm_head_topk as lh
    from . import materialize_v1 as mv

    i32 = "i32"
    attn_sig = _sig("q_ptr:*bf16 kb_ptr:*bf16 vb_ptr:*bf16 kc_ptr:*bf16 vc_ptr:*bf16 "
                    "start_ptr:*i32 o_ptr:*bf16 po_ptr:*fp32 pm_ptr:*fp32 pl_ptr:*fp32 "
                    + " ".join(f"{n}:{i32}" for n in (
                        "sq_b sq_s sq_h skb_b skb_s skb_h svb_b svb_s svb_h skc_b skc_t skc_h "
                        "svc_b svc_t svc_h so_b so_s so_h T W").split())
                    + " qk_scale:fp32 HKV:i32 NSPLIT:i32 chunk:i32")
    out = []
    for final in (True, False):
        const = dict(S=8, G=8, HEAD_D=128, BLOCK_Q=64, BLOCK_N=64, BLOCK_S=16, SLIDING=True,
                     CAUSAL_BLOCK=False, FINAL=final, DOT_BF16=True)
        out.append((f"attention FINAL={final}", at._attn_split_kernel,
                    {**attn_sig, **{k: "constexpr" for k in const}}, const, 8))
    comb = _sig("o_ptr:*bf16 po_ptr:*fp32 pm_ptr:*fp32 pl_ptr:*fp32 so_b:i32 so_s:i32 "
                "so_h:i32 HKV:i32 NSPLIT:i32")
    for rows, parts in ((64, 0), (16, 0), (2, 32), (8, 8)):  # v1, v2 / v5-v6's one-load
        const = dict(S=8, G=8, HEAD_D=128, BLOCK_Q=64, ROWS=rows, PARTS=parts)
        out.append((f"attention combine ROWS={rows} PARTS={parts}", at._combine_kernel,
                    {**comb, **{k: "constexpr" for k in const}}, const, 4))
    from . import _shard_topk as st  # triton_v6's vocab-parallel head (k 16: DDTree-16)

    sig = _sig("x_ptr:*fp32 m_ptr:*fp32 ls_ptr:*fp32 cand_ptr:*i64 V:i32 s_xr:i32 NCH:i32")
    const = dict(CHUNK=st.CHUNK, KP=16, PAD=st.INT64_MIN)
    out.append(("shard top-k chunks KP=16", st._chunk_topk_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    sig = _sig("cand_ptr:*i64 x_ptr:*fp32 m_ptr:*fp32 ls_ptr:*fp32 val_ptr:*fp32 "
               "idx_ptr:*i64 V:i32 s_xr:i32 NC:i32 K:i32")
    const = dict(NCP=512, PAD=st.INT64_MIN)
    out.append(("shard top-k merge NCP=512", st._merge_topk_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    from . import _head_v7 as hv  # triton_v7's whole head (w 8, k 16: DDTree-16 on EP8)

    out.append(("head stats", hv._stats_kernel, _sig("x_ptr:*fp32 out_ptr:*fp32 V:i32 s_xr:i32")
                | {"BLOCK": "constexpr"}, dict(BLOCK=hv.STATS_BLOCK), 8))
    sig = _sig("x_ptr:*fp32 ms_ptr:*fp32 cand_ptr:*i64 V:i32 s_xr:i32 NCH:i32 W:i32")
    const = dict(WP=8, CHUNK=st.CHUNK, KP=16, PAD=st.INT64_MIN)
    out.append(("head chunks KP=16", hv._chunk_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    sig = _sig("cand_ptr:*i64 x_ptr:*fp32 ms_ptr:*fp32 out_ptr:*fp64 V:i32 s_xr:i32 NC:i32 "
               "K:i32 vocab_start:i32 W:i32")
    const = dict(WP=8, NCP=512, PAD=st.INT64_MIN)
    out.append(("head candidates NCP=512", hv._cand_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    sig = _sig("allc_ptr:*fp64 val_ptr:*fp32 ids_ptr:*i64 N:i32 K:i32")
    const = dict(NP=128, PAD=st.INT64_MIN)
    out.append(("head final NP=128", hv._final_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    sig = _sig("z_ptr:*bf16 w_ptr:*bf16 key_ptr:*i64 pm_ptr:*fp32 ps_ptr:*fp32 M:i32 V:i32 "
               "D:i32 sz:i32 sw:i32 NVT:i32")
    for bm, bv, kc, warps in ((16, 128, 32, 8), (64, 128, 32, 8),  # triton_v1
                              (16, 64, 8, 4), (64, 64, 8, 4), (128, 64, 8, 4)):  # triton_v2
        const = dict(BLOCK_M=bm, BLOCK_V=bv, BLOCK_D=128, KC=kc, DOT_BF16=True, SORT=True)
        out.append((f"lm_head tile M{bm} V{bv} KC={kc} w{warps}", lh._lm_head_tile_kernel,
                    {**sig, **{k: "constexpr" for k in const}}, const, warps))
    sig = _sig("src_ptr:*i64 dst_ptr:*i64 C:i32 NG:i32")
    const = dict(GN=2048, KP=32, SORT=True)
    out.append(("top-k merge GN=2048 KP=32", lh._merge_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 8))
    sig = _sig("key_ptr:*i64 pm_ptr:*fp32 ps_ptr:*fp32 lp_ptr:*fp32 id_ptr:*i64 NVT:i32 k:i32")
    const = dict(KP=32, BLOCK_T=1024, SORT=True)
    out.append(("top-k final KP=32", lh._final_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    sig = _sig("x_ptr:*bf16 w_ptr:*bf16 y_ptr:*bf16 D:i32 sx:i32 sy:i32 eps:fp32")
    out.append(("rmsnorm D=7168", fu._rmsnorm_kernel, {**sig, "BLOCK_D": "constexpr"},
                dict(BLOCK_D=8192), 8))
    sig = _sig("qkv_ptr:*bf16 out_ptr:*bf16 qw_ptr:*bf16 kw_ptr:*bf16 cos_ptr:*fp32 "
               "sin_ptr:*fp32 s_row:i32 so_row:i32 HQ:i32 eps:fp32")
    out.append(("q/k norm + rope", fu._qk_norm_rope_kernel,
                {**sig, "HALF": "constexpr", "ROUND": "constexpr"}, dict(HALF=64, ROUND=True), 1))
    sig = _sig("g_ptr:*bf16 u_ptr:*bf16 h_ptr:*bf16 F:i32 s_g:i32 s_u:i32 s_h:i32")
    out.append(("silu * up", fu._silu_mul_kernel, {**sig, "BLOCK": "constexpr"},
                dict(BLOCK=2048), 4))
    # cache strides per layer / request exceed 2^31 elements at bs 64 x 32k: i64 there
    sig = _sig("kv_ptr:*bf16 kw_ptr:*bf16 cos_ptr:*fp32 sin_ptr:*fp32 pos_ptr:*i64 "
               "cnt_ptr:*i64 ck_ptr:*bf16 cv_ptr:*bf16 N:i32 T:i32 HKV:i32 s_kv:i32 sk_l:i64 "
               "sk_b:i64 sk_t:i32 sk_h:i32 sv_l:i64 sv_b:i64 sv_t:i32 sv_h:i32 eps:fp32")
    const = dict(BLOCK_H=8, HALF=64, RNE_BITS=False)
    out.append(("materialize k-norm+RoPE+scatter", mv._kv_scatter_kernel,
                {**sig, **{k: "constexpr" for k in const}}, const, 4))
    return out


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: sm_90 compilation needs JIT kernels")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    print(f"{'kernel':<34} {'registers / spills (sm_90a)':<30} wgmma  mma.sync")
    for label, fn, sig, const, warps in kernels():
        ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps, "num_stages": 3})
        ptx = ck.asm["ptx"]
        print(f"{label:<34} {ptxas_report(ptx):<30} {ptx.count('wgmma.mma_async'):>5} "
              f"{ptx.count('mma.sync'):>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
