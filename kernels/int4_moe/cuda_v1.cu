// int4_moe cuda_v1: the W4A16 expert GEMMs as warp-level mma.sync (m16n8k16, bf16 -> fp32)
// with the weights streamed in the fragment order (layout: mma_layout.py), through registers
// (U 1-2) or a per-warp cp.async shared-memory ring (U >= 3, the default).
//
// Legend: E experts, NU row units an expert (32 output rows: gate/up = 16 gate + the same 16
// up rows, down = two 16-row tiles), C 64-deep K chunks, KW warps splitting one unit's K,
// RW units a CTA, NN 8-slot n-tiles a pass, U chunk pairs loaded ahead. A lane is (g, t) =
// (lane / 4, lane % 4), the mma fragment coordinates.
//
// One warp, one unit, one K part: per chunk it loads one 16-byte word block a tile (the 32
// int4 weights its A fragments need for 4 mma steps), dequantises them with the bf16x2 magic
// (lop3 | 0x4300 -> 128 + q, - 136, * scale: bf16((q - 8) s) exactly, reference/int4.py) and
// issues NN mmas a step (down: twice, hi and lo halves of h). No CTA barrier on the K path: a
// lane reads back from the ring only the words it copied. K parts meet in shared memory at the
// end, summed in part order (deterministic), then the epilogue: gate/up -> h = silu(g) * u in
// fp32 as bf16 hi + lo (triton_v3's split), down -> y[slot] fp32 rows for the combine.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  // weights: read once, keep them out of L1 (the activations live there)
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ uint4 ld_act(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// nibbles (0, 4) of q -> bf16x2 ((n0 - 8) s, (n4 - 8) s), both roundings exact but the last
__device__ __forceinline__ u32 dq(u32 q, u32 s2) {
  u32 t;
  asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(t) : "r"(q));
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(t) : "r"(t), "r"(0x43084308u));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(t) : "r"(t), "r"(s2));
  return t;
}

// nibbles (0, 4) of q -> bf16x2 (128 + n0, 128 + n4), the stored values as they are (cuda_v2)
__device__ __forceinline__ u32 raw(u32 q) {
  u32 t;
  asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(t) : "r"(q));
  return t;
}

__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_cd(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1,
                                       float c0, float c1, float c2, float c3) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
}

__device__ __forceinline__ u16 to_bf16(float f) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ float from_bf16(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u32 word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is unrolled: no local memory
}

// One 16-row tile's A fragments for scale group G (= 2 chunk + half) of a chunk pair, exactly
// dequantised (POST 0): [k16 step of the group][A register]. w: the tile's 16-byte word of the
// group's chunk (its words 2 (G & 1), + 1 are the group's two k16 steps), s: the tile's scales
// (word G: rows g, g + 8 of the group). The hot kernels' K loops (cuda_v10.cu, cuda_v19.cu,
// cuda_v20.cu) share it; unit_block keeps its own for POST's raw nibbles.
__device__ __forceinline__ void dq_group(const uint4& w, const uint4& s, int G, u32 (&af)[2][4]) {
  const u32 sw = word(s, G);
  const u32 sg = __byte_perm(sw, 0, 0x1010), sg8 = __byte_perm(sw, 0, 0x3232);
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const u32 q = word(w, 2 * (G & 1) + jj);
    af[jj][0] = dq(q, sg), af[jj][1] = dq(q >> 4, sg8);
    af[jj][2] = dq(q >> 8, sg), af[jj][3] = dq(q >> 12, sg8);
  }
}

// one chunk pair's loads: weights [chunk][tile], scales [tile] (both chunks), activations
// [n-tile][chunk][half][group half] (NH = 2 halves for down: hi, lo), 8 inputs a lane, group
struct WS {  // a chunk pair's weights [chunk][tile] and scales [tile]
  uint4 w[2][2];
  uint4 s[2];
};
template <int NN, int NH>
struct XS {  // its activations [n-tile][chunk][half][group half]
  uint4 x[NN][2][NH][2];
};

template <int N>
__device__ __forceinline__ void zero_acc(float (&acc)[2][N][4]) {  // [tile][n-tile][mma quad]
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int q = 0; q < N; ++q)
#pragma unroll
      for (int m = 0; m < 4; ++m) acc[i][q][m] = 0.f;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
__device__ __forceinline__ void prefetch_l2(const void* p, u32 bytes) {
  // one instruction asks the memory system for a whole range (16-byte aligned and sized): the
  // bytes a warp will stream arrive in L2 without a register or a shared-memory slot held
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
}
// This CTA's share (1 / gridDim.x, in 16-byte multiples) of the range [base, base + bytes)
// (16-byte aligned and sized), asked of L2 in PIECE-byte prefetches spread over the threads.
// cuda_v6's gate/up GEMM calls it for the down GEMM's weights: on an EP rank's decode the
// gate/up stream leaves DRAM idle (~1.3 of 4.1 TB/s at one expert), and the down GEMM then
// reads its ~8 MB from L2 instead of starting a cold stream after the gate/up drains.
__device__ __forceinline__ void l2_share(const char* base, u64 bytes) {
  constexpr u64 PIECE = 16384;
  const u64 chunk = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const u64 lo = blockIdx.x * chunk, hi = min(lo + chunk, bytes);
  for (u64 off = lo + threadIdx.x * PIECE; off < hi; off += blockDim.x * PIECE)
    prefetch_l2(base + off, (u32)min(PIECE, hi - off));
}
// mbarriers and TMA bulk copies (cp.async.bulk): cuda_v8's rings (its phase 1's GB form, the
// down partial's bulk forms)
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_inval(u32 bar) {  // before the word is initialised again
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {  // release: this thread's reads before it
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {  // acquire
  asm volatile("{\n\t.reg .pred p;\n"
               "MBAR_WAIT:\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
               "@!p bra MBAR_WAIT;\n}" :: "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s_hint(u32 dst, const void* src, u32 bytes, u32 bar,
                                              u64 pol) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
               " [%0], [%1], %2, [%3], %4;"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
}
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];" :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ uint4 lds(u32 a) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(a));
  return r;
}

// A lane's chunk pair from its cp.async ring stage at src (the lane's own words: 4 weight
// blocks 512 bytes apart, then 2 scale words), as cuda_v1's ring and cuda_v10's stages lay it out
__device__ __forceinline__ WS lds_pair(u32 src) {
  WS b;
#pragma unroll
  for (int ch = 0; ch < 2; ++ch)
#pragma unroll
    for (int t2 = 0; t2 < 2; ++t2) b.w[ch][t2] = lds(src + (ch * 2 + t2) * 512);
#pragma unroll
  for (int t2 = 0; t2 < 2; ++t2) b.s[t2] = lds(src + (4 + t2) * 512);
  return b;
}

// HOUT 1's epilogue for one 8-slot n-tile of unit u (gate accumulators ga, up ua; slot columns
// col0 .. col0 + 7 of an expert with cnt slots at sorted positions start..): h = silu(g) u in
// fp32 as bf16 hi + lo into triton_v5's rows [S, 2, ldo]. The unit's 16 inputs land as four
// runs of 4 columns (run j holds inputs j, j + 4, j + 8, j + 12 of the unit at 64 j + 2 w0 +
// 0..3). Lane g < 4 takes lane g + 4's values (lane ^ 16) and stores its run as one 8-byte
// word, hi and lo: 4 stores of 16 sectors a pair of slots instead of 8 scattered 2-byte stores
// of 32. Rows past the matrix are the repack's padding (q = 0, scale 0): h = 0 there, stored
// as is. Every lane of the warp calls it (shuffles).
__device__ __forceinline__ void store_h_rows(const float* ga, const float* ua, int u, int col0,
                                             int cnt, int start, u64 out_ptr, int ldo) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int i0 = u * 16, o_run = (i0 & ~255) + 64 * (g & 3) + 2 * ((i0 & 255) >> 3);
#pragma unroll
  for (int mm = 0; mm < 2; ++mm) {
    u32 hi2 = 0, lo2 = 0;  // (row g, row g + 8) of slot column 2 t + mm
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const float gt = ga[2 * r8 + mm], up = ua[2 * r8 + mm];
      const float hv = gt / (1.f + expf(-gt)) * up;  // fp32 silu(g) * u
      const u16 hi = to_bf16(hv);
      const u16 lo = to_bf16(hv - from_bf16(hi));
      hi2 |= (u32)hi << (16 * r8);
      lo2 |= (u32)lo << (16 * r8);
    }
    const u32 ohi = __shfl_xor_sync(0xFFFFFFFFu, hi2, 16);  // lane g + 4's rows
    const u32 olo = __shfl_xor_sync(0xFFFFFFFFu, lo2, 16);
    const int col = col0 + 2 * t + mm;  // slot within the expert
    if (g < 4 && col < cnt) {
      // run j = g: inputs j (mine, row g), j + 4 (lane g + 4's row), j + 8, j + 12
      const uint2 vh = make_uint2((hi2 & 0xFFFFu) | (ohi << 16), (hi2 >> 16) | (ohi & 0xFFFF0000u));
      const uint2 vl = make_uint2((lo2 & 0xFFFFu) | (olo << 16), (lo2 >> 16) | (olo & 0xFFFF0000u));
      u16* row = (u16*)out_ptr + (size_t)(start + col) * 2 * ldo + o_run;
      *(uint2*)row = vh;
      *(uint2*)(row + ldo) = vl;
    }
  }
}

// MODE 0: gate/up (act = x [T, ld], rows by token = slot / TOPK; out h hi / lo [S, ldo] bf16)
// MODE 1: down    (act = h hi / lo [S, ld], rows by sorted position; out y [S, ldo] fp32)
// POST 0 (cuda_v1): A = bf16((q - 8) s) dequantised, as the reference rounds it.
// POST 1 (cuda_v2): A = 128 + q' (q' = q + 8, the stored nibble: one lop3), a group's two mma
//   steps accumulate onto -136 sum(x) of the group (two mmas with a constant A, shared by
//   both tiles), and the group's fp32 partial sum_k (q - 8) x_k is scaled once: acc += s p.
// KPAD: inputs past k_real exist (the last chunk pair is partly padding): mask their loads.
// U 1-2: the weights of U chunk pairs in flight in registers (U + 1 buffers); U >= 3: a ring
//   of U chunk pairs in shared memory a warp, filled by cp.async (U - 1 in flight; each lane
//   reads back only the 16-byte words it copied: no barrier), the activations one pair ahead
//   in registers.
// XB: activation buffers of the ring path: 2 (the next pair's loaded while one is computed) or
//   1 (loaded right before its mma steps, from L1: 32 fewer registers a thread for down's hi +
//   lo, so it fits 128 and 16 warps an SM).
// HOUT (gate/up only): where h goes. 0: hi and lo as two [S, ldo] planes, inputs in order
//   (this file's down GEMM reads them). 1: triton_v5's [S, 2, ldo] rows (hi, then lo), each
//   256-input tile permuted as triton_v5's `_src` (input 8 w + j + 4 h of a tile at 64 j +
//   2 w + h), so triton_v34's down GEMM reads them as its own SiLU wrote them (cuda_v4).
//   2: fp32 h, one value an input, at out_ptr[pos ldo + input] (cuda_v8: its CTA's shared
//   memory, read back by the same CTA's down partial).
template <int MODE, int U, int XB = 2, int NN = 1>
struct Occupancy {  // the CTAs an SM __launch_bounds__ asks registers for, as warps an SM
  // (gate/up at NN 2 spills 260 B at 128 registers: 12 warps, as down)
  static constexpr int warps =
      U >= 3 ? ((MODE == 0 && NN == 1) || XB == 1 ? 16 : 12) : (MODE == 0 ? 14 : 12);
};

struct GemmArgs {  // one GEMM's operands: weights, scales, activations (hi, lo), outputs
  u64 w_ptr, s_ptr, act_ptr, act_lo_ptr, out_ptr, out_lo_ptr;
  int NU, C, ld, k_real, n_real, ldo;
  int pf0, pf;  // L2 prefetch of a warp's slice: its first pf0 chunk pairs at the start, then
                // pair p + pf while pair p is computed (0, 0: none)
  u32 bars;     // BK > 0 (unit_block): the shared address of the warps' ring barriers, BK each
  u32 corr;     // CORR (unit_block): the shared address of 2 C float4s, each group's correction
};

__device__ __forceinline__ uint4 ld_cg(const uint4* p) {
  // activations another CTA of this launch wrote (cuda_v3's h): from L2, never a stale L1 line
  uint4 r;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// One CTA work item: the RW units ublk * RW .. of expert e, whose cnt slots sit at sorted
// positions start.. (slots: sorted position -> slot id, in global or shared memory). Every
// warp of the CTA calls it (the K-part reduction has CTA barriers). CG: activations by ld.cg
// (written earlier in this launch); ready(): called by each warp that has a unit, after its
// first weight pairs are issued and before its first activation load (cuda_v3's wait for h).
// CORR (POST 1, MODE 0, NN 1, one slot, BK > 0: cuda_v8's GB 2): every 32-input group's
// correction -136 sum(x) is the same in every warp of the CTA (one token: all eight columns read
// the same row), so the CTA's warps compute each group's once, with the same two mmas, into
// A.corr (2 C float4s, group 2 chunk + half: lane 0's four accumulators, all the same value)
// before their first pair, and compute reads a group's there (one LDS.128, the mma's C quad as
// it is: no moves) instead of issuing 8 of a pair's 24 mmas (session 32 call 2: phase 1 alone
// 35.5 vs 35.0 µs, slower; the tensor pipe is not what binds it).
// INV (BK > 0): the warp's barriers are invalidated after its last pair, so that a later pass
// or work item may initialise them again (int4_moe_mma's BK form; cuda_v8's CTA calls this
// once, its BK barriers are never reused).
template <int MODE, int POST, int KPAD, int KW, int RW, int NN, int U, int CG, int XB,
          int HOUT = 0, int BK = 0, int CORR = 0, int INV = 0, class Ready>
__device__ __forceinline__ void unit_block(const GemmArgs& A, const int* slots, int topk, int e,
                                           int start, int cnt, int ublk, float* red, uint4* dsm,
                                           Ready ready) {
  constexpr int NH = MODE == 0 ? 1 : 2;
  const int NU = A.NU, C = A.C, ld = A.ld, k_real = A.k_real, n_real = A.n_real, ldo = A.ldo;
  const u64 w_ptr = A.w_ptr, s_ptr = A.s_ptr, act_ptr = A.act_ptr, act_lo_ptr = A.act_lo_ptr;
  const u64 out_ptr = A.out_ptr, out_lo_ptr = A.out_lo_ptr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int kw = warp % KW, rw = warp / KW;
  const int u = ublk * RW + rw;  // this warp's row unit
  const bool unit_ok = u < NU;
  const int CW = C / KW, c0 = kw * CW, NP = CW / 2;  // chunks and chunk pairs of this K part
  const size_t unit = (size_t)e * NU + (unit_ok ? u : 0);
  for (int p0 = 0; p0 < cnt; p0 += 8 * NN) {
    // this lane's B column, slot g of each n-tile: its activation row; a column past the
    // expert's slots reads the first slot's row (its outputs are never stored, and the mma
    // keeps columns apart, so whatever it holds stays in its own column)
    const uint4* xq[NN][NH];
#pragma unroll
    for (int q = 0; q < NN; ++q) {
      const int col = p0 + q * 8 + g;
      const int pos = start + (col < cnt ? col : 0);
      const int row = MODE == 0 ? slots[pos] / topk : pos;
      const size_t off = (size_t)row * (ld / 8) + 8 * c0 + t;
      xq[q][0] = (const uint4*)act_ptr + off;
      if (NH == 2) xq[q][NH - 1] = (const uint4*)act_lo_ptr + off;
    }
    const uint4* wq = (const uint4*)w_ptr + (unit * C + c0) * 64 + lane;
    const uint4* sq = (const uint4*)s_ptr + (unit * (C / 2) + c0 / 2) * 16 + g;
    float acc[2][NN][4];
    zero_acc(acc);

    int kin = 64 * c0 + 8 * t;  // KPAD: this lane's first input of the next pair to load
    auto loadw = [&](WS& b) {
#pragma unroll
      for (int ch = 0; ch < 2; ++ch)
#pragma unroll
        for (int i = 0; i < 2; ++i) b.w[ch][i] = ld_stream(wq + ch * 64 + i * 32);
#pragma unroll
      for (int i = 0; i < 2; ++i) b.s[i] = ld_act(sq + i * 8);
      wq += 128;
      sq += 16;
    };
    auto loadx = [&](XS<NN, NH>& b) {
#pragma unroll
      for (int q = 0; q < NN; ++q)
#pragma unroll
        for (int ch = 0; ch < 2; ++ch)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const bool ok = !KPAD || kin + 64 * ch + 32 * hf < k_real;  // 8 inputs, all or none
#pragma unroll
            for (int h = 0; h < NH; ++h)
              b.x[q][ch][h][hf] = !ok ? make_uint4(0, 0, 0, 0)
                  : CG ? ld_cg(xq[q][h] + ch * 8 + hf * 4) : ld_act(xq[q][h] + ch * 8 + hf * 4);
          }
      kin += 128;
#pragma unroll
      for (int q = 0; q < NN; ++q)
#pragma unroll
        for (int h = 0; h < NH; ++h) xq[q][h] += 16;
    };
    static_assert(!CORR || (POST && MODE == 0 && NN == 1 && BK > 0), "CORR: T 1's gate/up ring");
    u32 cpair = 0;  // CORR: the shared address of the pair's four groups' corrections
    auto compute = [&](const WS& b, const XS<NN, NH>& bx) {
#pragma unroll
      for (int ch = 0; ch < 2; ++ch)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {  // scale group 2 ch + hf of the pair: mma steps 2 hf, 2 hf + 1
          float corr[NN][4];  // POST: -136 sum(x) over the group's inputs (hi and lo), a column
          if (CORR) {
            const uint4 cv = lds(cpair + 16 * (2 * ch + hf));
            corr[0][0] = __uint_as_float(cv.x), corr[0][1] = __uint_as_float(cv.y);
            corr[0][2] = __uint_as_float(cv.z), corr[0][3] = __uint_as_float(cv.w);
          } else if (POST) {
            const u32 m136 = 0xC308C308u;  // bf16x2 (-136, -136)
#pragma unroll
            for (int n = 0; n < NN; ++n)
#pragma unroll
              for (int h = 0; h < NH; ++h) {
                const uint4& xv = bx.x[n][ch][h][hf];
                if (h == 0) mma_cd(corr[n], m136, m136, m136, m136, xv.x, xv.y, 0.f, 0.f, 0.f, 0.f);
                else mma(corr[n], m136, m136, m136, m136, xv.x, xv.y);
                mma(corr[n], m136, m136, m136, m136, xv.z, xv.w);
              }
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const u32 sw = word(b.s[i], 2 * ch + hf);  // (row g, row g + 8) of the group
            float part[NN][4];  // POST: the group's fp32 partial, a column
            const u32 sg = __byte_perm(sw, 0, 0x1010), sg8 = __byte_perm(sw, 0, 0x3232);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              const u32 q = word(b.w[ch][i], 2 * hf + jj);
              u32 a0, a1, a2, a3;
              if (POST) {
                a0 = raw(q), a1 = raw(q >> 4), a2 = raw(q >> 8), a3 = raw(q >> 12);
              } else {
                a0 = dq(q, sg), a1 = dq(q >> 4, sg8), a2 = dq(q >> 8, sg), a3 = dq(q >> 12, sg8);
              }
#pragma unroll
              for (int n = 0; n < NN; ++n)
#pragma unroll
                for (int h = 0; h < NH; ++h) {
                  const uint4& xv = bx.x[n][ch][h][hf];
                  const u32 b0 = jj ? xv.z : xv.x, b1 = jj ? xv.w : xv.y;
                  if (POST) {
                    if (h == 0 && jj == 0)  // the group's partial starts from its correction
                      mma_cd(part[n], a0, a1, a2, a3, b0, b1, corr[n][0], corr[n][1], corr[n][2], corr[n][3]);
                    else
                      mma(part[n], a0, a1, a2, a3, b0, b1);
                  } else {
                    mma(acc[i][n], a0, a1, a2, a3, b0, b1);
                  }
                }
            }
            if (POST) {
              const float s_g = __uint_as_float(sw << 16), s_g8 = __uint_as_float(sw & 0xFFFF0000u);
#pragma unroll
              for (int n = 0; n < NN; ++n) {
                acc[i][n][0] = fmaf(s_g, part[n][0], acc[i][n][0]);
                acc[i][n][1] = fmaf(s_g, part[n][1], acc[i][n][1]);
                acc[i][n][2] = fmaf(s_g8, part[n][2], acc[i][n][2]);
                acc[i][n][3] = fmaf(s_g8, part[n][3], acc[i][n][3]);
              }
            }
          }
        }
    };

    if (unit_ok && U < 3) {  // U pairs in flight while one is computed: U + 1 buffers in turn
      WS bw[U + 1];
      XS<NN, NH> bx[U + 1];
      ready();
#pragma unroll
      for (int i = 0; i < U; ++i)
        if (i < NP) loadw(bw[i]), loadx(bx[i]);
      for (int pr = 0; pr < NP; pr += U + 1) {
#pragma unroll
        for (int i = 0; i <= U; ++i) {
          if (pr + i < NP) {
            if (pr + i + U < NP) loadw(bw[(i + U) % (U + 1)]), loadx(bx[(i + U) % (U + 1)]);
            compute(bw[i], bx[i]);
          }
        }
      }
    } else if (unit_ok && BK > 0) {
      // BK: the ring filled by TMA bulk copies (cuda_v8's GB 1), BK stages a warp, each a
      // pair's 2 KB of words (as the cp.async ring lays them out: lane l's 16 bytes of block b
      // at b 512 + 16 l) then its 256 bytes of scales (16 a row g), one full mbarrier a stage;
      // lane 0 issues a pair's two copies (one instruction each instead of every lane's six
      // cp.async: BK - 1 pairs in flight at a fraction of the issue and LSU cost)
      constexpr int STG = 2048 + 256;
      const u32 ring = (u32)__cvta_generic_to_shared(dsm) + warp * BK * STG;
      const u32 bar = A.bars + warp * BK * 8;
      const char* wsrc = (const char*)(wq - lane);  // the warp's K part: pair p at 2048 p
      const char* ssrc = (const char*)(sq - g);     // and its scales at 256 p
      auto issue = [&](int p) {  // lane 0
        const u32 dst = ring + (p % BK) * STG, b = bar + 8 * (p % BK);
        mbar_expect_tx(b, STG);
        bulk_g2s(dst, wsrc + (size_t)p * 2048, 2048, b);
        bulk_g2s(dst + 2048, ssrc + (size_t)p * 256, 256, b);
      };
      if (lane == 0) {
        for (int st = 0; st < BK; ++st) mbar_init(bar + 8 * st, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int p = 0; p < BK - 1 && p < NP; ++p) issue(p);
      }
      __syncwarp();  // the barriers are initialised before any lane waits on them
      if (CORR) {  // the groups warp, warp + nw, ... of the whole K while the first pairs land
        const int nw = KW * min(RW, NU - ublk * RW);  // the warps with a unit: 0 .. nw - 1
        const uint4* x0 = xq[0][0] - 8 * c0;          // this lane's 8 inputs of chunk 0
        const u32 m136 = 0xC308C308u;                  // bf16x2 (-136, -136), as compute's
        for (int G0 = warp; G0 < 2 * C; G0 += 4 * nw) {
          uint4 xv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // four groups' loads in flight, then their mmas
            const int G = G0 + i * nw, c = G >> 1, hf = G & 1;
            const bool ok = G < 2 * C && (!KPAD || 64 * c + 32 * hf + 8 * t < k_real);
            xv[i] = !ok ? make_uint4(0, 0, 0, 0) : CG ? ld_cg(x0 + 8 * c + 4 * hf)
                                                      : ld_act(x0 + 8 * c + 4 * hf);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int G = G0 + i * nw;
            float cr[4];
            mma_cd(cr, m136, m136, m136, m136, xv[i].x, xv[i].y, 0.f, 0.f, 0.f, 0.f);
            mma(cr, m136, m136, m136, m136, xv[i].z, xv[i].w);
            if (lane == 0 && G < 2 * C)
              asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(A.corr + 16 * G),
                           "f"(cr[0]), "f"(cr[1]), "f"(cr[2]), "f"(cr[3]) : "memory");
          }
        }
        // every warp with a unit: the table complete (named barrier 1; the warps without a
        // unit never come here)
        asm volatile("bar.sync 1, %0;" :: "r"(32 * nw) : "memory");
      }
      XS<NN, NH> bx[XB];
      ready();
      if (XB == 2) loadx(bx[0]);
      for (int pr = 0; pr < NP; pr += 2) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int p = pr + i;
          if (p < NP) {
            mbar_wait(bar + 8 * (p % BK), (p / BK) & 1);  // pair p has landed
            const u32 src = ring + (p % BK) * STG;
            WS cur;
#pragma unroll
            for (int ch = 0; ch < 2; ++ch)
#pragma unroll
              for (int t2 = 0; t2 < 2; ++t2) cur.w[ch][t2] = lds(src + (ch * 2 + t2) * 512 + lane * 16);
#pragma unroll
            for (int t2 = 0; t2 < 2; ++t2) cur.s[t2] = lds(src + 2048 + (t2 * 8 + g) * 16);
            if (CORR) cpair = A.corr + 16 * (2 * c0 + 4 * p);  // groups 2 (c0 + 2 p) .. + 3
            __syncwarp();  // every lane has read pair p - 1's stage, the one refilled now
            if (lane == 0 && p + BK - 1 < NP) issue(p + BK - 1);
            if (XB == 2) {
              if (p + 1 < NP) loadx(bx[(i ^ 1) % XB]);
              compute(cur, bx[i % XB]);
            } else {
              loadx(bx[0]);
              compute(cur, bx[0]);
            }
          }
        }
      }
      if (INV) {  // a later pass (or expert) of this warp initialises the barriers again
        __syncwarp();  // every lane's last wait is done: no phase is pending
        if (lane == 0)
          for (int st = 0; st < BK; ++st) mbar_inval(bar + 8 * st);
      }
    } else if (unit_ok) {  // the shared-memory ring
      constexpr int NS = U >= 3 ? U : 3;
      const u32 ring = (u32)__cvta_generic_to_shared(dsm) + (warp * NS * 6 * 32 + lane) * 16;
      auto issue = [&](int stage) {
        const u32 dst = ring + stage * (6 * 32 * 16);
#pragma unroll
        for (int ch = 0; ch < 2; ++ch)
#pragma unroll
          for (int i = 0; i < 2; ++i) cp_async16(dst + (ch * 2 + i) * 512, wq + ch * 64 + i * 32);
#pragma unroll
        for (int i = 0; i < 2; ++i) cp_async16(dst + (4 + i) * 512, sq + i * 8);
        wq += 128;
        sq += 16;
      };
      const char* wslice = (const char*)wq;  // this warp's K part: NP pairs of 2 KB weights
      const char* sslice = (const char*)sq;  // and of 256 B scales (lane 0's, g = 0: the start)
      auto prefetch = [&](int p, int n) {  // pairs [p, p + n) of the slice into L2, one lane
        n = min(n, NP - p);
        if (lane == 0 && n > 0) {
          prefetch_l2(wslice + (size_t)p * 2048, n * 2048);
          prefetch_l2(sslice + (size_t)p * 256, n * 256);
        }
      };
      if (A.pf0 > NS - 1) prefetch(NS - 1, A.pf0 - (NS - 1));  // past what the ring issues
#pragma unroll
      for (int i = 0; i < NS - 1; ++i) {
        if (i < NP) issue(i);
        cp_commit();  // empty groups past the end keep the count uniform
      }
      XS<NN, NH> bx[XB];
      ready();  // the first pairs' weights are in flight already
      if (XB == 2) loadx(bx[0]);
      for (int pr = 0; pr < NP; pr += 2) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int p = pr + i;
          if (p < NP) {
            cp_wait<NS - 2>();  // pair p has landed
            const u32 src = ring + (p % NS) * (6 * 32 * 16);
            const WS cur = lds_pair(src);
            if (A.pf > 0 && p + A.pf >= max(A.pf0, NS - 1)) prefetch(p + A.pf, 1);
            if (p + NS - 1 < NP) issue((p + NS - 1) % NS);  // the stage read one pair ago
            cp_commit();
            if (XB == 2) {
              if (p + 1 < NP) loadx(bx[(i ^ 1) % XB]);
              compute(cur, bx[i % XB]);
            } else {
              loadx(bx[0]);
              compute(cur, bx[0]);
            }
          }
        }
      }
    }

    // K parts -> part 0's warp, summed in part order
    if (KW > 1) {
      float* mine = red + ((size_t)(kw * RW + rw) * 2 * NN) * 128 + lane * 4;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int q = 0; q < NN; ++q)
#pragma unroll
          for (int m = 0; m < 4; ++m) mine[(i * NN + q) * 128 + m] = acc[i][q][m];
      __syncthreads();
      if (kw == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int q = 0; q < NN; ++q)
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              float s = 0.f;
              for (int k2 = 0; k2 < KW; ++k2)
                s += red[((size_t)(k2 * RW + rw) * 2 * NN + i * NN + q) * 128 + lane * 4 + m];
              acc[i][q][m] = s;
            }
      }
      __syncthreads();  // red is reused by the next pass
    }
    if (kw == 0 && unit_ok && MODE == 0 && HOUT == 1) {
#pragma unroll
      for (int q = 0; q < NN; ++q) store_h_rows(acc[0][q], acc[1][q], u, p0 + q * 8, cnt, start, out_ptr, ldo);
    } else if (kw == 0 && unit_ok) {
#pragma unroll
      for (int q = 0; q < NN; ++q)
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int col = p0 + q * 8 + 2 * t + (m & 1);  // slot within the expert
          if (col >= cnt) continue;
          const int pos = start + col;
          if (MODE == 0) {
            const int i_row = u * 16 + g + 8 * (m >> 1);
            if (i_row >= n_real) continue;
            const float gt = acc[0][q][m], up = acc[1][q][m];
            const float hv = gt / (1.f + expf(-gt)) * up;  // fp32 silu(g) * u
            if (HOUT == 2) {  // cuda_v8: fp32 h where out_ptr points (its shared memory)
              ((float*)out_ptr)[(size_t)pos * ldo + i_row] = hv;
              continue;
            }
            const u16 hi = to_bf16(hv);
            const u16 lo = to_bf16(hv - from_bf16(hi));
            ((u16*)out_ptr)[(size_t)pos * ldo + i_row] = hi;
            ((u16*)out_lo_ptr)[(size_t)pos * ldo + i_row] = lo;
          } else {
            const int slot = slots[pos];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int r = u * 32 + i * 16 + g + 8 * (m >> 1);
              if (r < n_real) ((float*)out_ptr)[(size_t)slot * ldo + r] = acc[i][q][m];
            }
          }
        }
    }
  }
}

// ITEMS 0: CTA column y takes the active experts y, y + G, ..., all of an expert's 8 NN-slot
//   passes in turn. ITEMS 1 (cuda_v4): the work items are (expert, pass), expert-major, and
//   column y takes items y, y + G, ...: a hot expert's passes run side by side in
//   neighbouring columns (the second read of its weights can come from L2) instead of in one
//   column after another (session 26: skewed routing, REAL T 33 834 vs v34's 763 µs). Every
//   CTA walks the counts once from shared memory (up to ITEM_SMEM experts; past them from
//   global memory). Measured slower everywhere (session 26 call 4: uniform T 33 1868 vs
//   1374 µs, skewed T 33 974 vs 727): the grid's ~10^4 short CTAs each walk every count.
//   A knob (cuda_v4's IT1), off; an item list built once by the router is the untried form.
constexpr int ITEM_SMEM = 512;

// SKIP > 0 (cuda_v10, ITEMS 0 only): the experts with more than SKIP slots are left to another
//   launch (cuda_v10.cu's wide n-tiles); this one takes the others.
// BK > 0 (cuda_v21; needs U >= 3, whose branch unit_block takes first below 3): each warp's
//   weight ring is BK stages filled by TMA bulk copies (unit_block's BK, cuda_v8's GB 1 form:
//   lane 0 issues a pair's 2 KB of words and 256 B of scales, one mbarrier a stage) instead of
//   U cp.async stages; dynamic shared memory KW RW BK (2304 + 8) bytes (ring, then barriers).
//   The L2 prefetch (pf0 / pf) is the cp.async ring's only: the launcher refuses it with BK.
template <int MODE, int POST, int KPAD, int KW, int RW, int NN, int U, int XB = 2, int HOUT = 0,
          int ITEMS = 0, int SKIP = 0, int BK = 0>
__global__ void __launch_bounds__(32 * KW * RW, Occupancy<MODE, U, XB, NN>::warps / (KW * RW) > 0 ? Occupancy<MODE, U, XB, NN>::warps / (KW * RW) : 1)
int4_moe_mma(u64 w_ptr, u64 s_ptr, u64 act_ptr, u64 act_lo_ptr, u64 slots_ptr, u64 act_e_ptr,
             u64 act_start_ptr, u64 act_cnt_ptr, u64 n_act_ptr, u64 out_ptr, u64 out_lo_ptr,
             int topk, int NU, int C, int ld, int k_real, int n_real, int ldo, int pf0,
             int pf, u64 l2_w, u64 l2_s, u64 l2_wb, u64 l2_sb) {
  __shared__ float red[KW > 1 ? KW * RW * 2 * NN * 32 * 4 : 1];
  __shared__ int s_cnt[ITEMS ? ITEM_SMEM : 1];
  // U >= 3: [warp][stage][6 words][32 lanes]; BK: [warp][stage][2304 B], then the barriers
  // [warp][stage] (8 B each; in dynamic memory, so the BK 0 instances are unchanged)
  extern __shared__ uint4 dsm[];
  const GemmArgs A{w_ptr, s_ptr, act_ptr, act_lo_ptr, out_ptr, out_lo_ptr, NU, C, ld, k_real,
                   n_real, ldo, pf0, pf,
                   BK > 0 ? (u32)__cvta_generic_to_shared(dsm) + KW * RW * BK * 2304 : 0u};
  const int n_act = *(const int*)n_act_ptr;
  const int *act_e = (const int*)act_e_ptr, *act_start = (const int*)act_start_ptr;
  const int* act_cnt = (const int*)act_cnt_ptr;
  if (!ITEMS) {
    if (l2_w)  // cuda_v6: the next GEMM's weights of this CTA row's experts, asked of L2 now
      for (int a = blockIdx.y; a < n_act; a += gridDim.y) {
        const u64 e = act_e[a];
        l2_share((const char*)l2_w + e * l2_wb, l2_wb);
        l2_share((const char*)l2_s + e * l2_sb, l2_sb);
      }
    for (int a = blockIdx.y; a < n_act; a += gridDim.y) {  // CTA-uniform (barriers inside)
      const int cnt = act_cnt[a];
      if (SKIP > 0 && cnt > SKIP) continue;
      unit_block<MODE, POST, KPAD, KW, RW, NN, U, 0, XB, HOUT, BK, 0, (BK > 0)>(
          A, (const int*)slots_ptr, topk, act_e[a], act_start[a], cnt, blockIdx.x, red, dsm,
          [] {});
    }
    return;
  }
  for (int a = threadIdx.x; a < min(n_act, ITEM_SMEM); a += blockDim.x) s_cnt[a] = act_cnt[a];
  __syncthreads();
  constexpr int P = 8 * NN;  // slots a pass
  const int G = gridDim.y, y = blockIdx.y;
  int i = 0;  // items of the experts before a
  for (int a = 0; a < n_act; ++a) {  // CTA-uniform: every thread walks the same counts
    const int cnt = a < ITEM_SMEM ? s_cnt[a] : act_cnt[a];
    const int np = (cnt + P - 1) / P;
    for (int j = i + ((y - i) % G + G) % G; j < i + np; j += G) {
      const int p0 = (j - i) * P;
      unit_block<MODE, POST, KPAD, KW, RW, NN, U, 0, XB, HOUT, BK, 0, (BK > 0)>(
          A, (const int*)slots_ptr, topk, act_e[a], act_start[a] + p0, min(P, cnt - p0),
          blockIdx.x, red, dsm, [] {});
    }
    i += np;
  }
}
