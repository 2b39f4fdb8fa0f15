"""tree_build triton_v9: v8's pop with a third of its per-pop instructions gone: node fields
written once, the bookkeeping of a pop done in its own iteration behind the next `redux`, and
static blocks of 32 pops.

Where v8's time goes (README.md, "v9"): its loop is bound by issue, not by one latency. Read
with the SASS control bits (`sass_model.py`: ptxas's stall counts, the scoreboards of REDUX /
SHFL / LDG / F2F), v8's common-path pop is 160 instructions whose stall counts alone sum to 324
cycles (ALU-pipe SELs issue every 2 cycles, ISETP -> BRA waits 13): the 273-cycle model of the
v8 note issued one instruction per cycle. Two thirds of them are the bookkeeping block: every
slot field (score bits, meta, two log-prob offsets, two rank-key words) selected into both
planes for the sibling's slot and the child's slot (28 SEL), the row tile (12 SEL over NR = 4
planes), and the meta / digit arithmetic; at budget 128 (SR = 4, NR = 8) it doubles (263
instructions): the superlinear budget-128 time.

v9 keeps v8's slots (one per node), level-1 key and tie branch, `shfl.idx` fetch, float64 in the
reference's order and end-of-kernel stores, and changes:

* Per-slot state is the entry's score bits, its key and one word r | d << 8 | prev << 13
  (rank, depth, previous sibling); the rank key lives per node, written once when the node is
  created (nk: 7-bit digits), and the tie branch rebuilds an entry's key as nk[slot] + r at
  digit d, exactly v8's key. The log-prob offsets are computed from (d, r) after the fetch
  (one IMAD with a unit K stride), not carried (a carried offset modelled 10-15 cycles
  slower: one more SHFL and three SELs for one IMAD). The node count is counted from the rows
  after the loop.
* Static blocks of 32 pops (`tl.static_range` over planes): block P creates nodes 32P..32P+31,
  so the node's fields, its row and its first child's key are written into plane P only (the
  plane test folds at compile time): one SEL per field instead of SR (slots) or NR (rows).
* No deferred bookkeeping: a pop fetches, computes the sibling / child scores and keys, writes
  the two keys, issues the next pop's two `redux`, then writes its other fields, in one block:
  ptxas interleaves those writes with the fetch / load / DADD stalls and after the `redux`.
  (v8's deferral needed the slots p_win / p_i patched into the fetch or a separate block; a
  v9 variant with the deferred block after the fetch modelled at 440 cycles, one with
  successor scores precomputed per slot at 384-443: more instructions, ptxas hoisting the
  tie test.)

Compiled for sm_90a (specialized as a launch of contiguous tensors) at L 7 x budget 64: the
common-path loop is 104 / 106 SASS instructions in the two 32-pop blocks (v8: 160), stall sum
196 / 217 (324), 2 `redux`, 5 `shfl`; the issue model gives 280 / 283 cycles per pop at a
`redux` latency of 48 (254-335 for 16..100; v8: 372 at any latency, measured 433: the model
misses ~60 cycles per pop, taken branches and latencies it does not see). At budget 128:
137-147 instructions (v8: 263). Not yet timed on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from workbench.tree import DDTree

from ._common import (
    _I32_MAX,
    _NEG_INF,
    _load_prefix_root,
    _max_combine,
    _min_combine,
    _prefetch_table,
    _store_info_rows,
    prepare_build,
)

_sum_combine = tl.standard._sum_combine  # (what tl.sum reduces with: see v1's pop)
_MAG32 = tl.constexpr(2**31 - 1)
_NEG_INF_BITS = tl.constexpr(-(2**52))  # 0xfff0000000000000 as int64: the bits of -inf


@triton.jit
def _tree_build_kernel(
    lp_ptr, ids_ptr, root_ptr, prefix_ptr,  # inputs
    tok_ptr, dep_ptr, par_ptr, sco_ptr, anc_ptr, pos_ptr, cnt_ptr, fc_ptr, ns_ptr,  # outputs
    budget, depth_count, k_used, n_rows, n_words,
    s_lb, s_ll, s_lk, s_ib, s_il, s_ik, s_root, s_prefix, pops,
    SR: tl.constexpr, NR: tl.constexpr, WP: tl.constexpr, KW: tl.constexpr,
    LP: tl.constexpr, KP: tl.constexpr,
    HAS_ROOT: tl.constexpr, HAS_PREFIX: tl.constexpr, PREFETCH: tl.constexpr,
    BLK: tl.constexpr, NB: tl.constexpr, HEND: tl.constexpr,
):
    SM: tl.constexpr = SR * 32 - 1  # the slot bits of a level-1 key
    HI: tl.constexpr = -SR * 32  # ~SM: its truncated-score bits
    NP: tl.constexpr = NR * 32
    b = tl.program_id(0).to(tl.int64)
    lp_b = lp_ptr + b * s_lb
    lp_m = lp_b - s_ll  # lp_m + d * s_ll: depth d's row (d = 1..L)
    ids_b = ids_ptr + b * s_ib
    row0 = b * n_rows  # outputs are contiguous [B, N] (anc: [B, N, W])

    if PREFETCH:  # touch the whole [L, K] table once: the pops' scalar loads then hit L1
        _prefetch_table(lp_b, sco_ptr, row0, depth_count, k_used, s_ll, s_lk, LP, KP)

    prefix, root = _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root, HAS_PREFIX,
                                     HAS_ROOT)

    lane = tl.arange(0, 32)[None, :]
    slot = tl.arange(0, SR)[:, None] * 32 + lane  # [SR, 32] slot index: plane * 32 + lane
    plane = tl.arange(0, SR)[:, None]
    rplane = tl.arange(0, NR)[:, None]
    rid = rplane * 32 + lane  # [NR, 32] node rows

    # slot 0 = the root's first child: rank 0 at depth 1; others empty
    s0 = tl.load(lp_b).to(tl.float64)
    sbits = tl.where(slot == 0, s0.to(tl.int64, bitcast=True), _NEG_INF_BITS)  # [SR, 32]
    h = (sbits >> 32).to(tl.int32)
    key = (((h ^ ((h >> 31) & _MAG32)) - (h >> 31)) & HI) | slot  # [SR, 32] level-1 keys
    # [SR, 32] the entry's rank r | depth d << 8 | prev << 13 (the node its slot's previous pop
    # created: the entry's previous sibling)
    rm = tl.where(slot == 0, 1 << 8, 0)
    # per node j, written once when node j is created: its own rank key (7-bit digits of
    # depths 1..4, 5..8, ...); the key of the entry in slot j is nk[j] plus r at digit d
    nk0 = tl.zeros([SR, 32], tl.int32)
    nk1 = tl.zeros([SR, 32], tl.int32)
    nk2 = tl.zeros([SR, 32], tl.int32)
    nk3 = tl.zeros([SR, 32], tl.int32)
    info = tl.full([NR, 32], -1, tl.int32)  # [NR, 32] parent | d << 8 | r << 13 | prev << 20
    scores = tl.where(rid == 0, 0.0, _NEG_INF).to(tl.float64)  # [NR, 32]

    # the first pop's level-1 reduction; then each pop reduces for the next one
    kmax = tl.reduce(tl.reduce(key, 0, _max_combine), 0, _max_combine)
    kflip = tl.reduce(tl.reduce(key ^ SM, 0, _max_combine), 0, _max_combine)

    # Pops in static blocks: with BLK = 32, block P's pops create nodes i = 32P .. 32P + 31,
    # whose node fields, row and first-child slot lie in plane P, known at compile time: one
    # SEL per field (not SR or NR). Block SR holds only node 32 SR (budget = 32 SR), whose
    # child slot does not exist.
    for P in tl.static_range(NB):  # (plane_blocks=False: one block, BLK = SR * 32 >= pops)
        for n in range(tl.maximum(P * BLK - 1, 0), tl.minimum(P * BLK + HEND, pops)):
            # ---- this pop's winner: kmax / kflip name one slot, or the reference's order
            # decides among those sharing the truncated score
            win = kmax
            valid = tl.full([], 1, tl.int32)
            if kflip != (kmax ^ SM):
                cand = (key & HI) == (kmax & HI)
                f = sbits.to(tl.float64, bitcast=True)
                fmax = tl.reduce(tl.reduce(tl.where(cand, f, _NEG_INF), 0, _max_combine), 0,
                                 _max_combine)
                cand = cand & (f == fmax)  # -0.0 == +0.0, as in Python
                # each entry's rank key: its parent node's key plus its rank at digit d
                ed = tl.minimum(tl.maximum((rm >> 8) & 31, 1), 16) - 1
                edig = (rm & 255) << (7 * (3 - ed % 4))
                ew = ed // 4
                k = nk0 + tl.where(ew == 0, edig, 0)
                w = tl.reduce(tl.reduce(tl.where(cand, k, _I32_MAX), 0, _min_combine), 0,
                              _min_combine)
                cand = cand & (k == w)
                if KW > 1:
                    k = nk1 + tl.where(ew == 1, edig, 0)
                    w = tl.reduce(tl.reduce(tl.where(cand, k, _I32_MAX), 0, _min_combine), 0,
                                  _min_combine)
                    cand = cand & (k == w)
                if KW > 2:
                    k = nk2 + tl.where(ew == 2, edig, 0)
                    w = tl.reduce(tl.reduce(tl.where(cand, k, _I32_MAX), 0, _min_combine), 0,
                                  _min_combine)
                    cand = cand & (k == w)
                if KW > 3:
                    k = nk3 + tl.where(ew == 3, edig, 0)
                    w = tl.reduce(tl.reduce(tl.where(cand, k, _I32_MAX), 0, _min_combine), 0,
                                  _min_combine)
                    cand = cand & (k == w)
                win = tl.reduce(tl.reduce(tl.where(cand, slot, -1), 0, _max_combine), 0,
                                _max_combine)
                valid = (fmax != _NEG_INF).to(tl.int32)  # else the heap is empty (-inf)
            win = win & SM

            # ---- its fields: every lane takes the winner's plane, then shfl.idx from its lane
            at = plane == (win >> 5)
            src = tl.zeros([1, 32], tl.int32) + (win & 31)
            s = tl.gather(tl.reduce(tl.where(at, sbits, 0), 0, _sum_combine, keep_dims=True),
                          src, 1).to(tl.float64, bitcast=True)  # [1, 32]
            mr = tl.gather(tl.reduce(tl.where(at, rm, 0), 0, _sum_combine, keep_dims=True),
                           src, 1)
            pw0 = tl.gather(tl.reduce(tl.where(at, nk0, 0), 0, _sum_combine, keep_dims=True),
                             src, 1)
            if KW > 1:
                pw1 = tl.gather(tl.reduce(tl.where(at, nk1, 0), 0, _sum_combine,
                                           keep_dims=True), src, 1)
            if KW > 2:
                pw2 = tl.gather(tl.reduce(tl.where(at, nk2, 0), 0, _sum_combine,
                                           keep_dims=True), src, 1)
            if KW > 3:
                pw3 = tl.gather(tl.reduce(tl.where(at, nk3, 0), 0, _sum_combine,
                                           keep_dims=True), src, 1)
            r = mr & 255
            d = (mr >> 8) & 31  # 1..L (0: a never-opened slot, popped only when empty)

            # ---- the next sibling and the first child, float64 in the reference's order
            lp_o = lp_m + (d * s_ll + r * s_lk)  # [1, 32] pointers to lp[d-1][r]
            a = tl.load(lp_o, mask=valid != 0, other=0.0).to(tl.float64)  # lp[d-1][r]
            nxt = tl.load(lp_o + s_lk, mask=(r + 1 < k_used) & (valid != 0),
                          other=_NEG_INF).to(tl.float64)  # lp[d-1][r+1]
            c = tl.load(lp_b + d * s_ll, mask=d < depth_count,
                        other=_NEG_INF).to(tl.float64)  # lp[d][0]
            sib = (s - a) + nxt  # -inf when there is no next rank (or the heap is empty)
            child = s + c  # -inf at depth L
            sib_bits = sib.to(tl.int64, bitcast=True)
            child_bits = child.to(tl.int64, bitcast=True)
            hs = (sib_bits >> 32).to(tl.int32)
            hc = (child_bits >> 32).to(tl.int32)
            i = tl.full([], 1, tl.int32) + n  # the new node's row (and its child's slot)
            key_sib = (((hs ^ ((hs >> 31) & _MAG32)) - (hs >> 31)) & HI) | win
            key_child = (((hc ^ ((hc >> 31) & _MAG32)) - (hc >> 31)) & HI) | i
            if NB > 1:  # node i = n + 1 is in plane P, lane n + 1 - 32P (the test folds)
                is_new = (plane == P) & (lane == i - P * 32)
                is_row = (rplane == P) & (lane == i - P * 32)
            else:
                is_new = slot == i  # (no slot when i == SR * 32: that child is never popped)
                is_row = rid == i
            is_sel = slot == win
            key = tl.where(is_sel, key_sib, tl.where(is_new, key_child, key))

            # ---- the next pop's level 1: its redux runs while this pop's other writes issue
            kmax = tl.reduce(tl.reduce(key, 0, _max_combine), 0, _max_combine)
            kflip = tl.reduce(tl.reduce(key ^ SM, 0, _max_combine), 0, _max_combine)

            # ---- slot win <- the next sibling, slot i <- the first child, node i's fields
            # (its rank key: the parent's plus digit d = rank r), row i
            sbits = tl.where(is_sel, sib_bits, tl.where(is_new, child_bits, sbits))
            rm = tl.where(is_sel, ((mr + 1) & 0x1FFF) | (i << 13),
                          tl.where(is_new, (d + 1) << 8, rm))
            dd = tl.minimum(tl.maximum(d, 1), 16) - 1
            digit = r << (7 * (3 - dd % 4))
            word = dd // 4
            nk0 = tl.where(is_new, pw0 + tl.where(word == 0, digit, 0), nk0)
            if KW > 1:
                nk1 = tl.where(is_new, pw1 + tl.where(word == 1, digit, 0), nk1)
            if KW > 2:
                nk2 = tl.where(is_new, pw2 + tl.where(word == 2, digit, 0), nk2)
            if KW > 3:
                nk3 = tl.where(is_new, pw3 + tl.where(word == 3, digit, 0), nk3)
            row = tl.where(valid != 0, win | (d << 8) | (r << 13) | ((mr >> 13) << 20), -1)
            info = tl.where(is_row, row, info)
            scores = tl.where(is_row, s, scores)  # -inf when empty = the padding score

    # ---- every row at once (v6's stores, on the rows as [NP] vectors)
    info = tl.reshape(info, [NP])
    scores = tl.reshape(scores, [NP])
    rows = tl.arange(0, NP)
    in_rows = rows < n_rows
    real = info >= 0  # rows 1..count
    tl.store(cnt_ptr + b, (tl.sum(real.to(tl.int32), 0) + 1).to(tl.int64))
    _store_info_rows(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, anc_ptr, ids_b,
                     row0, rows, in_rows, info, scores, root, prefix, depth_count, n_words,
                     s_il, s_ik, NP, WP)


def build_ddtree_triton(
    top_logprobs: Tensor,
    top_ids: Tensor,
    budget: int,
    root_tokens: Tensor | None = None,
    prefix_lens: Tensor | None = None,
    *,
    validate: bool = False,
    num_warps: int = 1,
    prefetch: bool | None = None,
    max_pops: int | None = None,
    plane_blocks: bool = True,
) -> DDTree:
    """Best-first DDTree on the GPU, bit-identical to `reference.tree_build.build_ddtree`.

    Same contract as `triton_v1.build_ddtree_triton` (shapes, dtypes, budget 1..128, L <= 16,
    one launch, no host sync; content checks only with validate=True). prefetch: load the
    log-prob table into L1 first (default: on CUDA; it only costs time in the interpreter).
    max_pops: run only that many pops, to time what lies outside the loop (a timing ablation:
    the tree is then not the reference's). plane_blocks=False: one loop over all pops, node
    and row writes selecting every plane (an ablation of the static 32-pop blocks; same tree).
    """
    tree, job = prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    if job is not None:
        # slots and rows as [SR, 32] / [NR, 32] tiles: one plane per register, one lane each;
        # NB static blocks of pops, block P creating nodes 32P .. min(32P + HEND, pops)
        _tree_build_kernel[job.grid](
            *job.args, budget if max_pops is None else max(0, min(budget, max_pops)),
            SR=max(job.SP, 32) // 32, NR=max(job.NP, 32) // 32, WP=job.WP,
            KW=-(-job.depth_count // 4), LP=job.LP, KP=job.KP,
            HAS_ROOT=job.HAS_ROOT, HAS_PREFIX=job.HAS_PREFIX, PREFETCH=job.on_cuda(prefetch),
            BLK=32 if plane_blocks else max(job.SP, 32),
            NB=max(job.SP, 32) // 32 + 1 if plane_blocks else 1,
            HEND=31 if plane_blocks else max(job.SP, 32), num_warps=num_warps,
        )
    return tree
