// int4_moe cuda_v8: a one-token call (decode) as one GEMM launch whose CTAs never wait on
// each other, then a combine (compiled after cuda_v1.cu, whose unit_block it runs: cuda_v8.py
// hands NVRTC the two files as one source).
//
// Legend: cuda_v1.cu's, plus NSL intermediate slices an expert (I / SLICE), SLICE = 16 RW
// intermediate inputs a CTA (four 32-input scale groups), k the token's slot.
//
// Why: at T 1 on 384 experts cuda_v5 runs four launches, 73.7 µs (the #6 bar: 60): routing
// 2.8 + gate/up 38.0 (85 % of copy) + down 25.0 (64 %) + combine 1.8 + ~6 µs between them.
// The down GEMM cannot start before the gate/up GEMM of its expert has finished all of h, and
// its own ramp and tail stand alone. But the down GEMM is linear in h: with h cut into slices
// along I, y = sum over slices of W_down[:, slice] h[slice], and the CTA that computed
// h[slice] can take that slice's partial itself. So CTA (slice, k):
//   1. reads the token's expert e = ids[0, k] (no routing launch: one token's ids are its
//      experts; -1 or an id outside [0, E) is skipped here, the combine flags the token);
//   2. runs cuda_v1's gate/up unit_block on the RW units of its slice (cuda_v2's dequant,
//      POST 1, KW K parts summed in part order), the epilogue writing fp32 h = silu(g) u into
//      shared memory (HOUT 2) instead of hi | lo bf16 planes in global memory;
//   3. computes part[slice, k, :] = W_down[e][:, slice] h[slice] on the CUDA cores, reading
//      the checkpoint layout as it is (a row's slice is 64 contiguous bytes of words and 8 of
//      scales): a lane owns one scale group of 32 inputs (its 32 h values stay in registers
//      for all D rows), four lanes a row, the dequant as cuda_v2's (128 + q by the bf16 magic,
//      -136 sum(h) once a group, times the group's scale), the quad summed by two shuffles
//      (the DN / CL forms below stream the rows other ways; the default, DN 0, loads 8 rows a
//      lane into registers, then does their math).
// The combine sums, per output column, w[k] * sum over slices of part[slice, k] in (k, slice)
// order (fp32, no atomics: deterministic), NaN for a token with an id outside [-1, E) or an
// expert twice (the router's rule, `_common._route_bad`), -1 slots adding nothing.
// Traffic: the experts' bytes once, plus part: NSL K D fp32 written and read (T 1, Kimi: 16 x
// 8 x 7168 x 4 = 3.7 MB, 1.9 % of the 198 MB of weights).

constexpr int V8_KW = 2, V8_RW = 8;                  // gate/up K parts x units a CTA: 16 warps
constexpr int V8_THREADS = 32 * V8_KW * V8_RW;       // 512: one CTA an SM at 128 registers
constexpr int V8_SLICE = 16 * V8_RW;                 // intermediate inputs a CTA (128)
constexpr int V8_QUADS = V8_THREADS / 4;             // down rows in flight a pass (one a quad)
// DN 1: the down partial's ring, in the gate/up ring's shared memory (free once h is done): a
// stage holds one row a lane, its 16 bytes of words and the 4 bytes of its scale pair;
// V8_ST2 - 1 rows in flight a lane
constexpr int V8_BATCH = 8;                          // DN 0: rows a lane loads, then computes
constexpr int V8_B5 = 4;                             // DN 5: rows a register buffer (two)
constexpr int V8_STAGE2 = V8_THREADS * (16 + 4);     // bytes a stage (10 KB)
constexpr int V8_ST2 = 14;                           // stages (140 KB of the 144 KB ring)
static_assert(V8_ST2 * V8_STAGE2 <= V8_KW * V8_RW * 3 * 6 * 32 * 16, "the gate/up ring holds it");
// DN 2: the down partial on the tensor cores, a warp a 16-row tile at a time (rows g, g + 8 of
// lane (g, t)), the tile's 16 x 64 bytes of words and 16 x 8 of scales brought into a per-warp
// ring of V8_ST3 stages by cp.async (each lane copies distinct 16 / 8 bytes; __syncwarp
// publishes them)
constexpr int V8_TILE3 = 16 * 64 + 16 * 8;           // bytes a stage: words, then scales
constexpr int V8_ST3 = 8;                            // stages a warp (9216 B: the gate/up ring's)
static_assert(V8_THREADS / 32 * V8_ST3 * V8_TILE3 <= V8_KW * V8_RW * 3 * 6 * 32 * 16, "fits");

__device__ __forceinline__ long long v8_id(u64 ids_ptr, int ids64, int s_ik, int k) {
  return ids64 ? ((const long long*)ids_ptr)[(size_t)k * s_ik]
               : (long long)((const int*)ids_ptr)[(size_t)k * s_ik];
}

__device__ __forceinline__ uint4 ld_row(const uint4* p) {
  // a row's 64-byte slice: read once, no L1 line, no L2 prefetch of the other slices' bytes
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
// EF 1 (opts & 16): the down weights' copies into shared memory with an L2 evict-first policy,
// so that the 66 MB stream does not push part (written meanwhile, read by the combine) out of
// L2 (session 30 call 7: the combine after the cp.async / bulk forms 4.5-4.8 µs, after DN 0's
// ld.global.nc loads 3.3)
__device__ __forceinline__ u64 evict_first_policy() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_async16_hint(u32 dst, const void* src, u64 pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "l"(pol));
}
__device__ __forceinline__ void cp_async8_hint(u32 dst, const void* src, u64 pol) {
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2;"
               :: "r"(dst), "l"(src), "l"(pol));
}
__device__ __forceinline__ void cp_async8(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ uint2 lds64(u32 a) {
  uint2 r;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(a));
  return r;
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {  // bf16x2, lo in the low half
  return (u32)to_bf16(lo) | (u32)to_bf16(hi) << 16;
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ u32 lds32(u32 a) {
  u32 r;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a));
  return r;
}

// The combine's pieces (its launch and FC's tail): the token's ids into shared memory and the
// router's rule (an id outside [-1, E) or one expert twice: bad; -1 may repeat), one slot a
// thread against the ones before it
constexpr int V8_CK = 8;
constexpr int V8_CORR = 512;  // GB 2's groups a CTA (2 C: D <= 16384; cuda_v8.py's CORR_GROUPS)
constexpr int V8_KMAX = 256;  // slots a token the combine reads its ids of (cuda_v8.py's rule)
template <class Id>  // the rule on ids already in shared memory (*bad zeroed and published)
__device__ __forceinline__ void flag_bad_ids(const Id* ids, int K, int E, int* bad) {
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const long long e = ids[i];
    bool b = e < -1 || e >= E;
    for (int i2 = 0; i2 < i && e != -1; ++i2) b |= ids[i2] == e;
    if (b) *bad = 1;
  }
}
__device__ __forceinline__ void combine_ids(u64 ids_ptr, int ids64, int s_ik, int K, int E,
                                            long long* ids, int* bad) {
  for (int i = threadIdx.x; i < K; i += blockDim.x) ids[i] = v8_id(ids_ptr, ids64, s_ik, i);
  if (threadIdx.x == 0) *bad = 0;
  __syncthreads();
  flag_bad_ids(ids, K, E, bad);
}
// Columns n0 + 4 c .. + 3 by thread (c, j) = (tid % NC, tid / NC), j < V8_CK (one 16-byte load
// a part row; D a multiple of 4): the slots k = j, j + V8_CK, ..., each w[k] sum_s part[s, k, n],
// then out[0, n] = bf16 of the sum over j in order (for K <= V8_CK: slot order), NaN for a bad
// token. CG: part read from L2 (FC's tail: other CTAs of this launch wrote it), else streamed.
template <int NC, bool CG, class Id>
__device__ __forceinline__ void combine_cols(const float* part, int NSL, const Id* ids,
                                             const int* bad, const float* wts, int s_wk, int K,
                                             int E, int D, u64 out_ptr, int n0,
                                             float4 (*acc_j)[NC]) {
  const int c = threadIdx.x % NC, j = threadIdx.x / NC;
  const int n = n0 + 4 * c;
  if (j < V8_CK) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = j; k < K && n < D; k += V8_CK) {
      const long long e = ids[k];
      if (e < 0 || e >= E) continue;  // -1 adds nothing; outside [0, E): NaN below
      const float4* P = (const float4*)(part + (size_t)k * D + n);
      const size_t step = (size_t)K * D / 4;  // one slice to the next, in float4
      float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16
      for (int s = 0; s < NSL; ++s) {  // 16 loads in flight (Kimi's NSL): one L2 round trip
        const float4 v = CG ? __ldcg(P + s * step) : __ldcs(P + s * step);  // read once
        y.x += v.x, y.y += v.y, y.z += v.z, y.w += v.w;
      }
      const float wk = wts[(size_t)k * s_wk];
      acc.x = fmaf(wk, y.x, acc.x), acc.y = fmaf(wk, y.y, acc.y);
      acc.z = fmaf(wk, y.z, acc.z), acc.w = fmaf(wk, y.w, acc.w);
    }
    acc_j[j][c] = acc;
  }
  __syncthreads();  // acc_j and bad complete
  if (j == 0 && n < D) {
    float4 sum = acc_j[0][c];
#pragma unroll
    for (int i = 1; i < V8_CK; ++i) {
      const float4 v = acc_j[i][c];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const u32 nan2 = 0x7FC07FC0u;
    const uint2 o = make_uint2(*bad ? nan2 : (u32)to_bf16(sum.x) | (u32)to_bf16(sum.y) << 16,
                               *bad ? nan2 : (u32)to_bf16(sum.z) | (u32)to_bf16(sum.w) << 16);
    *(uint2*)((u16*)out_ptr + n) = o;
  }
  __syncthreads();  // acc_j free for the next block
}

// sum_j (128 + q_j) h_j over one word's 8 inputs (input 8 w + j at bits 4 j, reference/int4.py)
__device__ __forceinline__ float dot8(u32 q, const float* h, float acc) {
#pragma unroll
  for (int sh = 0; sh < 4; ++sh) {  // nibbles (sh, sh + 4) as bf16 (128 + q): exact in fp32
    const u32 t = raw(q >> (4 * sh));
    acc = fmaf(__uint_as_float(t << 16), h[sh], acc);
    acc = fmaf(__uint_as_float(t & 0xFFFF0000u), h[sh + 4], acc);
  }
  return acc;
}

// Phase 1, both kernels: hs[0, SLICE) = h for inputs SLICE xs .. of expert e (fp32), through
// cuda_v1's gate/up unit_block (cuda_v2's dequant, KW K parts summed in part order, HOUT 2),
// its weight ring GU stages a warp filled by cp.async (GB 0) or by TMA bulk copies (GB 1,
// unit_block's BK, the warps' barriers at gbars; GB 2: those, and each 32-input group's
// correction once a CTA into the 2 C float4s at corr, unit_block's CORR)
template <int KPAD, int GU = 3, int GB = 0>
__device__ __forceinline__ void h_slice(u64 w1, u64 s1, u64 x_ptr, int e, int NU, int C, int ld,
                                        int D, int I, int xs, float* red, float* hs, int* zero,
                                        uint4* dsm, u32 gbars = 0, u32 corr = 0) {
  if (threadIdx.x < V8_SLICE) hs[threadIdx.x] = 0.f;  // inputs past I (padding) read as 0
  if (threadIdx.x == 0) *zero = 0;  // the slot table unit_block reads: row 0 / 1 = the token
  __syncthreads();
  // h's input i lands at hs[i - SLICE xs]: out_ptr is hs's generic address shifted back by
  // the slice's first input, and ldo 0 (one slot)
  const u64 h_at = (u64)(hs) - sizeof(float) * (u64)(V8_SLICE * xs);
  const GemmArgs A{w1, s1, x_ptr, x_ptr, h_at, h_at, NU, C, ld, D, I, 0, 0, 0, gbars, corr};
  unit_block<0, 1, KPAD, V8_KW, V8_RW, 1, GU, 0, 2, 2, GB ? GU : 0, GB == 2>(
      A, zero, 1, e, 0, 1, xs, red, dsm, [] {});
  __syncthreads();  // hs complete
}

// The tensor-core down forms' h (DN 2 / 4 / 6): B fragments of h as bf16 hi + lo at the permuted
// inputs (below) and each group's -136 sum(hi + lo) (cuda_v2's association), the same in every
// row and column
struct DownFrags {
  u32 bh[4][2][2], bl[4][2][2];  // [group][k16 step][b0, b1]
  float corr[4];
};
__device__ __forceinline__ void down_frags(const float* hs, DownFrags& F) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int grp = 0; grp < 4; ++grp) {
    float cc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int st = 0; st < 2; ++st)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int i = 32 * grp + 16 * st + 8 * b + t;  // inputs i, i + 4
        const float h0 = hs[i], h1 = hs[i + 4];
        const float h0h = from_bf16(to_bf16(h0)), h1h = from_bf16(to_bf16(h1));
        F.bh[grp][st][b] = pack_bf16(h0, h1);
        F.bl[grp][st][b] = pack_bf16(h0 - h0h, h1 - h1h);
      }
    const u32 m136 = 0xC308C308u;  // bf16x2 (-136, -136)
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      mma(cc, m136, m136, m136, m136, F.bh[grp][st][0], F.bh[grp][st][1]);
      mma(cc, m136, m136, m136, m136, F.bl[grp][st][0], F.bl[grp][st][1]);
    }
    F.corr[grp] = cc[0];
  }
}

// One group of a 16-row tile (both tensor-core tile forms): the four mmas of its two k16 steps
// (A fragments a0..a3, then b0..b3, rows g / g + 8) starting from its corr, then the rows' group
// scales from the bf16 pairs `scales()` returns (loaded after the mmas are issued) into acc0 /
// acc8 (column 0, lanes t 0, is the token's)
template <class Scales>
__device__ __forceinline__ void group_mma(const DownFrags& F, int grp, u32 a0, u32 a1, u32 a2,
                                          u32 a3, u32 b0, u32 b1, u32 b2, u32 b3, Scales scales,
                                          float& acc0, float& acc8) {
  float c[4] = {F.corr[grp], F.corr[grp], F.corr[grp], F.corr[grp]};
  mma(c, a0, a1, a2, a3, F.bh[grp][0][0], F.bh[grp][0][1]);
  mma(c, a0, a1, a2, a3, F.bl[grp][0][0], F.bl[grp][0][1]);
  mma(c, b0, b1, b2, b3, F.bh[grp][1][0], F.bh[grp][1][1]);
  mma(c, b0, b1, b2, b3, F.bl[grp][1][0], F.bl[grp][1][1]);
  const uint2 w = scales();  // the scale pairs holding this group's, rows g and g + 8
  const float s0 = __uint_as_float(grp & 1 ? w.x & 0xFFFF0000u : w.x << 16);
  const float s8 = __uint_as_float(grp & 1 ? w.y & 0xFFFF0000u : w.y << 16);
  acc0 = fmaf(s0, c[0], acc0);
  acc8 = fmaf(s8, c[2], acc8);
}

// One 16-row tile of the down partial in shared memory (words: 64 bytes a row from sw; scales:
// 8 bytes a row from ss): rows g, g + 8 of lane (g, t) into acc0 / acc8. The mma's K order is
// permuted so that the bf16 magic's nibble pairs (j, j + 4) of a word are A's column pairs
// (2 t, 2 t + 1): lane t takes nibbles (t, t + 4) of words 0 / 2 and (8 + t, 12 + t) of words
// 1 / 3 of a group's 16 bytes; a group's partial starts from its corr and is scaled once by the
// row's group scale.
// swz (LY 2): a row's four 16-byte groups stored at positions grp ^ ((row >> 1) & 3)
// (`by_slice(ly=2)`; tiles start at rows multiple of 16, so rows g and g + 8 share it): the
// eight rows g of one group then fall in distinct banks (session 30 call 9: 4-way conflicts,
// 1.1 M a call, at 64 bytes a row)
__device__ __forceinline__ void tile_mma(const DownFrags& F, u32 sw, u32 ss, float& acc0,
                                         float& acc8, bool swz = false) {
  const int lane = threadIdx.x & 31, g = lane >> 2, sh = 4 * (lane & 3);
  const int sx = swz ? (g >> 1) & 3 : 0;
  acc0 = 0.f, acc8 = 0.f;
#pragma unroll
  for (int grp = 0; grp < 4; ++grp) {
    const int at = (grp ^ sx) * 16;
    const uint4 wg = lds(sw + g * 64 + at), wg8 = lds(sw + (g + 8) * 64 + at);
    group_mma(F, grp, raw(wg.x >> sh), raw(wg8.x >> sh), raw(wg.y >> sh), raw(wg8.y >> sh),
              raw(wg.z >> sh), raw(wg8.z >> sh), raw(wg.w >> sh), raw(wg8.w >> sh), [&] {
                return make_uint2(lds32(ss + g * 8 + grp / 2 * 4),
                                  lds32(ss + (g + 8) * 8 + grp / 2 * 4));
              }, acc0, acc8);
  }
}

// DN 8's tile on the lane-major copy (LY 3, cuda_v8.py's `_lanes`): row n's 64 bytes are four
// 16-byte pieces, piece t lane t's: its u32 c holds, for word j of group c (j = 0..3), nibble t
// at bits 4 j and nibble t + 4 at bits 16 + 4 j, i.e. exactly the pairs `tile_mma`'s lane t
// extracts from that group's 16 bytes (raw(word >> 4 t)). One LDS.128 a row a lane instead of
// four (the eight rows g of a warp read 512 contiguous bytes: no bank conflict), raw(u >> 4 j)
// three shifts a group instead of four, the row's four scales one LDS.64; the arithmetic (and
// so the bits) is tile_mma's.
__device__ __forceinline__ void tile_mma_lanes(const DownFrags& F, u32 sw, u32 ss, float& acc0,
                                               float& acc8) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint4 ug = lds(sw + g * 64 + t * 16), ug8 = lds(sw + (g + 8) * 64 + t * 16);
  const uint2 sg = lds64(ss + g * 8), sg8 = lds64(ss + (g + 8) * 8);
  const u32 U[4] = {ug.x, ug.y, ug.z, ug.w}, U8[4] = {ug8.x, ug8.y, ug8.z, ug8.w};
  const u32 S[2] = {sg.x, sg.y}, S8[2] = {sg8.x, sg8.y};
  acc0 = 0.f, acc8 = 0.f;
#pragma unroll
  for (int grp = 0; grp < 4; ++grp) {
    const u32 u = U[grp], u8 = U8[grp];
    group_mma(F, grp, raw(u), raw(u8), raw(u >> 4), raw(u8 >> 4), raw(u >> 8), raw(u8 >> 8),
              raw(u >> 12), raw(u8 >> 12),
              [&] { return make_uint2(S[grp / 2], S8[grp / 2]); }, acc0, acc8);
  }
}

// DN 2's down partial: out[n] = sum over the slice of W[e][n, :] h for n in [0, D), a warp
// taking the 16-row tiles warp, warp + W, ..., each tile's 16 x 64 bytes of words and 16 x 8
// of scales brought into a per-warp cp.async ring, then `tile_mma`
__device__ __forceinline__ void down_mma(const float* hs, u64 wd, u64 sd, long long e,
                                         long long se_w, int sn_w, long long se_s, int sn_s,
                                         long long sx_w, long long sx_s, int xs, int D,
                                         float* out, uint4* dsm, bool ef, bool swz) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  constexpr int NW = V8_THREADS / 32;
  const u64 pol = ef ? evict_first_policy() : 0;
  DownFrags F;
  down_frags(hs, F);
  const int tiles = (D + 15) / 16, mine = (tiles - warp + NW - 1) / NW;  // warp-uniform
  const int* wbase = (const int*)wd + (size_t)e * se_w + (size_t)xs * sx_w;
  const u16* sbase = (const u16*)sd + (size_t)e * se_s + (size_t)xs * sx_s;
  const u32 ring = (u32)__cvta_generic_to_shared(dsm) + warp * (V8_ST3 * V8_TILE3);
  // this lane's pieces of a tile: 16-byte pieces lane and lane + 32 of the 64 (row c / 4, piece
  // c % 4), and lane < 16 the 8 bytes of row lane's scales; issued tile after tile in order,
  // so one running pointer each, a tile (16 NW rows) further every call
  const int r0 = lane / 4, r1 = r0 + 8, rs = lane & 15;
  const int* wp0 = wbase + (size_t)(16 * warp + r0) * sn_w + 4 * (lane % 4);
  const int* wp1 = wp0 + (size_t)8 * sn_w;
  const u16* sp = sbase + (size_t)(16 * warp + rs) * sn_s;
  const size_t wstep = (size_t)16 * NW * sn_w, sstep = (size_t)16 * NW * sn_s;
  int nn = 16 * warp;  // the next tile's first row
  auto issue = [&](int stage) {  // the next tile into stage
    const u32 dst = ring + stage * V8_TILE3;
    if (ef) {
      if (nn + r0 < D) cp_async16_hint(dst + lane * 16, wp0, pol);
      if (nn + r1 < D) cp_async16_hint(dst + (lane + 32) * 16, wp1, pol);
      if (lane < 16 && nn + rs < D) cp_async8_hint(dst + 1024 + lane * 8, sp, pol);
    } else {
      if (nn + r0 < D) cp_async16(dst + lane * 16, wp0);
      if (nn + r1 < D) cp_async16(dst + (lane + 32) * 16, wp1);
      if (lane < 16 && nn + rs < D) cp_async8(dst + 1024 + lane * 8, sp);
    }
    wp0 += wstep, wp1 += wstep, sp += sstep, nn += 16 * NW;
  };
#pragma unroll
  for (int r = 0; r < V8_ST3 - 1; ++r) {
    if (r < mine) issue(r);
    cp_commit();
  }
  static_assert((V8_ST3 & (V8_ST3 - 1)) == 0, "stages: a power of two");
  for (int r = 0; r < mine; ++r) {
    cp_wait<V8_ST3 - 2>();
    __syncwarp();  // every lane's pieces of tile r landed; every lane done with the stage refilled
    const u32 src = ring + (r & (V8_ST3 - 1)) * V8_TILE3;
    if (r + V8_ST3 - 1 < mine) issue((r + V8_ST3 - 1) & (V8_ST3 - 1));  // read one tile ago
    cp_commit();
    float acc0, acc8;
    tile_mma(F, src, src + 1024, acc0, acc8, swz);
    const int n0 = 16 * (warp + NW * r);
    if (t == 0 && n0 + g < D) out[n0 + g] = acc0;
    if (t == 0 && n0 + g + 8 < D) out[n0 + g + 8] = acc8;
  }
}

// DN 3 / 4 / 6 / 7: the down rows by TMA bulk copies (cp.async.bulk, one thread issues them)
// into a CTA ring of BulkRing<DN>::ST stages, each stage ROWS consecutive rows of the
// slice-major copy (LY 1: a stage is one contiguous block of words and one of scales), a full
// mbarrier a stage (the copies' bytes) and an empty one (the 16 warps' arrivals). DN 3 / 4: the
// ring past the gate/up ring, its ST stages asked for before phase 1, so the down stream is
// already landing while the gate/up phase runs (session 30 call 2: slower, the extra shared
// memory takes L1 from phase 1); DN 6 / 7: the ring in the gate/up ring's shared memory, asked
// for once phase 1 is done (no more shared memory than DN 0, more stages). DN 3 / 7: a row a
// quad (DN 0's math on the CUDA cores); DN 4 / 6: a 16-row tile a warp (DN 2's tensor cores).
template <int DN>
struct BulkRing {
  static constexpr bool TC = DN == 4 || DN == 6 || DN >= 8, LATE = DN >= 6;
  static constexpr int ROWS = TC ? 16 * (V8_THREADS / 32) : V8_QUADS;  // 256 / 128
  static constexpr int STAGE = ROWS * (64 + 8);                         // words, then scales
  static constexpr int RING = V8_KW * V8_RW * 3 * 6 * 32 * 16;          // the gate/up ring
  // what the shared memory holds; DN 9: 6 stages, phase 1's bulk ring's 108 KB (GB 1 / 2)
  static constexpr int ST = DN == 9 ? 6 : LATE ? RING / STAGE : TC ? 3 : 7;
  static constexpr int BYTES = LATE ? 0 : ST * STAGE;  // past the gate/up ring: 54 / 63 KB
};
constexpr int V8_RING = BulkRing<3>::RING;  // cuda_v8.py's RING
constexpr int V8_BARS = 16;                 // stages a bulk ring at most (DN 7)
static_assert(BulkRing<6>::ST <= V8_BARS && BulkRing<7>::ST <= V8_BARS &&
              BulkRing<8>::ST <= V8_BARS, "the barriers");
static_assert(V8_RING + BulkRing<3>::BYTES + 17 * 1024 <= 227 * 1024, "one CTA's shared memory");
static_assert(V8_RING + BulkRing<4>::BYTES + 17 * 1024 <= 227 * 1024, "one CTA's shared memory");

template <int DN>
struct BulkStream {  // the ring's addresses and the issuing thread's copies
  using R = BulkRing<DN>;
  u32 ring, full, empty;  // shared addresses: stage 0, full[0], empty[0] (8 bytes a barrier)
  const char* w;          // this CTA's slice of its expert: row n's words at w + 64 n
  const char* s;          // and its scales at s + 8 n
  int D, blocks;
  bool ef;                // EF 1: the copies evict-first in L2
  int rot = 0;            // EA 1: stage st's bytes at physical slot (st + rot) % ST
  __device__ __forceinline__ u32 at(int st) const { return ring + (st + rot) % R::ST * R::STAGE; }
  __device__ __forceinline__ void issue(int b) const {  // block b (rows ROWS b ..) into its stage
    const int st = b % R::ST, rows = min(R::ROWS, D - R::ROWS * b);
    const u32 dst = at(st), bar = full + 8 * st;
    mbar_expect_tx(bar, rows * 72);
    if (ef) {
      const u64 pol = evict_first_policy();
      bulk_g2s_hint(dst, w + (size_t)R::ROWS * b * 64, rows * 64, bar, pol);
      bulk_g2s_hint(dst + R::ROWS * 64, s + (size_t)R::ROWS * b * 8, rows * 8, bar, pol);
    } else {
      bulk_g2s(dst, w + (size_t)R::ROWS * b * 64, rows * 64, bar);
      bulk_g2s(dst + R::ROWS * 64, s + (size_t)R::ROWS * b * 8, rows * 8, bar);
    }
  }
  // every warp at block b: wait for it to land; after the warp's reads, its arrival; thread 0
  // then refills the stage of block b - 1 (all 16 warps' arrivals for it: no warp waits on a
  // block not yet asked for, so no deadlock)
  __device__ __forceinline__ u32 wait(int b) const {
    mbar_wait(full + 8 * (b % R::ST), (b / R::ST) & 1);
    return at(b % R::ST);
  }
  __device__ __forceinline__ void release(int b) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(empty + 8 * (b % R::ST));
    if (threadIdx.x == 0 && b >= 1 && b - 1 + R::ST < blocks) {
      mbar_wait(empty + 8 * ((b - 1) % R::ST), ((b - 1) / R::ST) & 1);
      issue(b - 1 + R::ST);
    }
  }
};

// grid (NSL, K), V8_THREADS threads; dynamic shared memory: the gate/up ring (16 warps x 3
// stages x 6 x 32 x 16 B). w1 / s1: gate/up repacked (mma_layout), x [1, ld] bf16, ids / wts
// [1, K], wd / sd: down words int32 / scales bf16, expert e's row n of slice s at
// e se + s sx + n sn (elements; the checkpoint layout [E, D, I / 8] / [E, D, I / 32]: sx
// SLICE / 8 / SLICE / 32, sn I / 8 / I / 32; cuda_v8.py's slice-major copy [E, NSL, D, 16] /
// [E, NSL, D, 4]: sx 16 D / 4 D, sn 16 / 4), part [NSL, K, D] fp32.
// DN: how the down partial streams its rows. 0: V8_BATCH rows a lane loaded into registers,
// then their math, in turn (session 28 call 3: the kernel 65.8 µs at T 1); 1: a per-lane
// cp.async ring of V8_ST2 rows in the gate/up ring's shared memory (call 4: 68.5, slower: the
// phase is bound by its instructions, ~110 a row a lane, not by loads in flight); 2: the tensor
// cores (down_mma: ~115 warp instructions a 16-row tile instead of ~220); 3 / 4: DN 0's / DN
// 2's math on rows brought by TMA bulk copies from the slice-major copy (LY 1) into a CTA ring
// whose first stages are asked for before phase 1 (BulkRing; dynamic shared memory V8_RING +
// BulkRing<DN>::BYTES); 5: DN 0's math with the next batch's loads issued before each batch's
// math (two register buffers); 6 / 7: DN 4's / DN 3's math with the bulk ring in the gate/up
// ring's shared memory, asked for once phase 1 is done (session 30: none beat DN 0 by more
// than ~1 µs; traces/gpu/session30/README.md); 8: DN 6 on the lane-major copy (LY 3,
// tile_mma_lanes; session 31 call 1: the op 67.8 µs against cuda_v5's 73.9); 9: DN 8 with a
// 6-stage ring (108 KB), so that with phase 1's bulk ring (GB 1 / 2, 108 KB) the CTA asks for
// 36 KB less shared memory (session 32 call 1: 528 bytes more than GB 1 + DN 8's 164992 and
// phase 1 alone took 40 µs instead of 35; call 3: 36 KB less buys nothing, 62.0 vs 62.2 µs).
// GU / GB: phase 1's weight ring, GU stages a warp filled by cp.async (GB 0: 3 KB a stage, the
// default GU 3 is the 144 KB the later rings reuse) or by TMA bulk copies (GB 1: 2.25 KB a
// stage, unit_block's BK; session 31 call 2: phase 1 alone 38.9 -> 35.2 µs, issue-bound on its
// mmas); GB 2: GB 1 with each group's correction computed once a CTA (unit_block's CORR: 16 of
// a pair's 24 mmas left, the same bits), its V8_CORR float4s past the ring; dynamic shared
// memory max(V8_RING, that ring (+ 16 V8_CORR for GB 2)) (+ BYTES for DN 3 / 4)
template <int KPAD, int DN, int GU, int GB>
__device__ __forceinline__ void decode_cta(u64 w1, u64 s1, u64 x_ptr, u64 ids_ptr, int ids64,
                                           int s_ik, int E, int NU, int C, int ld, int D, int I,
                                           u64 wd, u64 sd, long long se_w, int sn_w,
                                           long long se_s, int sn_s, u64 part, int opts,
                                           long long sx_w, long long sx_s, float* red,
                                           float* hs, int& zero, uint4* dsm,
                                           unsigned long long* bars, unsigned long long* gbars) {
  const int xs = blockIdx.x, k = blockIdx.y;
  const long long e = v8_id(ids_ptr, ids64, s_ik, k);
  if (e < 0 || e >= E) return;  // -1: not routed here; outside [0, E): the combine's NaN
  // opts & 3, an ablation for timing only (the output is garbage): 1 phase 1 alone, 2 phase 2
  // alone (h = 0), 3 phase 2's loads alone (DN 0 / 3 / 7: the rows xor-folded, no math);
  // opts & 4 (DN 0): each slice's CTA sweeps the rows from its own offset, so that an expert's
  // 16 CTAs read 16 regions of it at a time instead of one
  const int ablate = opts & 3;
  constexpr bool BULK = DN == 3 || DN == 4 || DN >= 6;
  using R = BulkRing<BULK ? DN : 3>;
  BulkStream<BULK ? DN : 3> bs;
  // EA 1 (opts & 128; DN 8 on GB 1's 3-stage ring): phase 1's bulk ring takes 108 of the 144
  // KB the down ring reuses, so the down ring's first EARLY stages, placed in the top 36 KB
  // (bs.rot), are asked for at the CTA's start: the down stream does not restart cold once
  // phase 1 is done
  constexpr int EARLY = DN == 8 && GB == 1 && GU == 3
                            ? (V8_RING - V8_THREADS / 32 * GU * 2304) / R::STAGE : 0;
  const int early = EARLY && (opts & 128) && ablate != 1 ? EARLY : 0;
  if (BULK) {  // the slice-major copy (cuda_v8.py checks sn_w 16, sn_s 4: rows back to back)
    bs.ring = (u32)__cvta_generic_to_shared(dsm) + (R::LATE ? 0 : V8_RING);
    bs.full = (u32)__cvta_generic_to_shared(bars), bs.empty = bs.full + 8 * V8_BARS;
    bs.w = (const char*)((const int*)wd + (size_t)e * se_w + (size_t)xs * sx_w);
    bs.s = (const char*)((const u16*)sd + (size_t)e * se_s + (size_t)xs * sx_s);
    bs.D = D, bs.blocks = (D + R::ROWS - 1) / R::ROWS, bs.ef = opts & 16;
    bs.rot = early ? R::ST - early : 0;
    if (threadIdx.x == 0) {
      for (int st = 0; st < R::ST; ++st) {
        mbar_init(bs.full + 8 * st, 1);
        mbar_init(bs.empty + 8 * st, V8_THREADS / 32);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      // not under AB 1, which exits after phase 1: no copy may be in flight at the exit
      for (int b = 0; b < R::ST && b < bs.blocks && ablate != 1 && !R::LATE; ++b) bs.issue(b);
      for (int b = 0; b < early && b < bs.blocks; ++b) bs.issue(b);  // EA 1: the free top
    }
    // h_slice's (or AB 2's) first __syncthreads publishes the initialised barriers
  }
  if (ablate < 2)
    h_slice<KPAD, GU, GB>(w1, s1, x_ptr, (int)e, NU, C, ld, D, I, xs, red, hs, &zero, dsm,
                          (u32)__cvta_generic_to_shared(gbars),
                          // GB 2's corrections past phase 1's ring (the down ring's later)
                          (u32)__cvta_generic_to_shared(dsm) + V8_THREADS / 32 * GU * 2304);
  if (ablate == 1) return;
  if (ablate >= 2) {
    if (threadIdx.x < V8_SLICE) hs[threadIdx.x] = 0.f;
    __syncthreads();
  }
  if (BULK && R::LATE && threadIdx.x == 0) {
    // the gate/up ring is free (h_slice's last __syncthreads: every warp's cp.async copies
    // landed and were read); its bytes were the generic proxy's, the copies are the async one's
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (int b = early; b < R::ST && b < bs.blocks; ++b) bs.issue(b);
  }
  float* const out_part = (float*)part + ((size_t)xs * gridDim.y + k) * D;
  if (DN == 2) {
    down_mma(hs, wd, sd, e, se_w, sn_w, se_s, sn_s, sx_w, sx_s, xs, D, out_part, dsm, opts & 16,
             opts & 32);
    return;
  }
  if (DN == 4 || DN == 6 || DN >= 8) {  // warp w: rows 16 w .. + 15 of each 256-row block
    DownFrags F;
    down_frags(hs, F);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    for (int b = 0; b < bs.blocks; ++b) {
      const u32 src = bs.wait(b);
      float acc0, acc8;
      if (DN >= 8)
        tile_mma_lanes(F, src + warp * 16 * 64, src + R::ROWS * 64 + warp * 16 * 8, acc0, acc8);
      else
        tile_mma(F, src + warp * 16 * 64, src + R::ROWS * 64 + warp * 16 * 8, acc0, acc8,
                 opts & 32);
      bs.release(b);
      const int n0 = R::ROWS * b + 16 * warp;
      if ((lane & 3) == 0 && n0 + g < D) out_part[n0 + g] = acc0;
      if ((lane & 3) == 0 && n0 + g + 8 < D) out_part[n0 + g + 8] = acc8;
    }
    return;
  }
  const int q = threadIdx.x & 3, quad = threadIdx.x >> 2;
  float h[32];  // this lane's scale group: inputs SLICE xs + 32 q ..
  float hsum = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    h[i] = hs[32 * q + i];
    hsum += h[i];
  }
  const float corr = -136.f * hsum;
  const int i0 = V8_SLICE * xs + 32 * q;
  // row n's words for this lane's group, and the 4-byte pair of scales that holds its scale
  const int* wrow = (const int*)wd + (size_t)e * se_w + (size_t)xs * sx_w + 4 * q;
  const u16* srow = (const u16*)sd + (size_t)e * se_s + (size_t)xs * sx_s + (q & ~1);
  float* const out = out_part;
  const int rows = (D + V8_QUADS - 1) / V8_QUADS;  // warp-uniform (the quad shuffles)
  // opts & 8 (IL 1): the group's four words summed as four independent FMA chains, added in a
  // tree at the end, instead of one 32-FMA chain (the hypothesis: at 4 warps a scheduler the
  // chain bounds the math; session 30 call 4: no change, 72.8 vs 72.7 µs)
  const bool ilp = opts & 8;
  auto row_out = [&](const uint4& w, float scale, int r) {  // row quad + QUADS r's partial
    float acc;
    if (ilp) {
      const float a0 = dot8(w.x, h, corr), a1 = dot8(w.y, h + 8, 0.f);
      const float a2 = dot8(w.z, h + 16, 0.f), a3 = dot8(w.w, h + 24, 0.f);
      acc = (a0 + a1) + (a2 + a3);
    } else {
      acc = dot8(w.x, h, corr);
      acc = dot8(w.y, h + 8, acc);
      acc = dot8(w.z, h + 16, acc);
      acc = dot8(w.w, h + 24, acc);
    }
    acc *= scale;  // the group's (q - 8) h sum, scaled once
    acc += __shfl_xor_sync(0xFFFFFFFFu, acc, 1);
    acc += __shfl_xor_sync(0xFFFFFFFFu, acc, 2);
    const int n = quad + r * V8_QUADS;
    if (q == 0 && n < D) out[n] = acc;
  };
  if (DN == 0) {
    const int off = opts & 4 ? xs * rows / (int)gridDim.x : 0;
    u32 fold = 0;  // AB 3
    for (int r0 = 0; r0 < rows; r0 += V8_BATCH) {
      uint4 w[V8_BATCH];
      u16 sc[V8_BATCH];
#pragma unroll
      for (int b = 0; b < V8_BATCH; ++b) {
        const int rr = r0 + b + off - (r0 + b + off >= rows ? rows : 0);
        const int n = quad + rr * V8_QUADS;
        if (r0 + b < rows && n < D) {
          w[b] = ld_row((const uint4*)(wrow + (size_t)n * sn_w));
          sc[b] = __ldg(srow + (size_t)n * sn_s + (q & 1));
        }
      }
#pragma unroll
      for (int b = 0; b < V8_BATCH; ++b)
        if (ablate == 3 && r0 + b < rows)
          fold ^= w[b].x ^ w[b].y ^ w[b].z ^ w[b].w ^ sc[b];
        else if (r0 + b < rows)
          row_out(w[b], from_bf16(sc[b]), r0 + b + off - (r0 + b + off >= rows ? rows : 0));
    }
    if (ablate == 3 && fold == 0x9E3779B9u) out[quad] = 1.f;  // keeps the loads
    return;
  }
  if (DN == 5) {  // DN 0's math, each batch's loads issued before the batch before it is done
    // why (session 30 call 3): DN 0's loads alone (AB 3) take 16.8 µs, its loads and math 28.7;
    // a warp there waits for its batch, then computes it with nothing in flight. Two register
    // buffers of V8_B5 rows: batch i + 1 is loading while batch i's math runs.
    uint4 wa[V8_B5], wb[V8_B5];
    u16 sa[V8_B5], sb[V8_B5];
    auto load = [&](uint4 (&w)[V8_B5], u16 (&sc)[V8_B5], int r0) {
#pragma unroll
      for (int b = 0; b < V8_B5; ++b) {
        const int n = quad + (r0 + b) * V8_QUADS;
        if (r0 + b < rows && n < D) {
          w[b] = ld_row((const uint4*)(wrow + (size_t)n * sn_w));
          sc[b] = __ldg(srow + (size_t)n * sn_s + (q & 1));
        }
      }
    };
    auto math = [&](const uint4 (&w)[V8_B5], const u16 (&sc)[V8_B5], int r0) {
#pragma unroll
      for (int b = 0; b < V8_B5; ++b)
        if (r0 + b < rows) row_out(w[b], from_bf16(sc[b]), r0 + b);  // warp-uniform
    };
    load(wa, sa, 0);
    for (int r0 = 0; r0 < rows; r0 += 2 * V8_B5) {
      load(wb, sb, r0 + V8_B5);
      math(wa, sa, r0);
      load(wa, sa, r0 + 2 * V8_B5);
      math(wb, sb, r0 + V8_B5);
    }
    return;
  }
  if (DN == 3 || DN == 7) {  // quad c: row c of each 128-row block, lane q its 16 bytes and scale
    u32 fold = 0;  // AB 3
    for (int b = 0; b < bs.blocks; ++b) {
      const u32 src = bs.wait(b);
      const uint4 w = lds(src + quad * 64 + q * 16);
      const u32 s2 = lds32(src + R::ROWS * 64 + quad * 8 + (q >> 1) * 4);
      bs.release(b);
      if (ablate == 3)
        fold ^= w.x ^ w.y ^ w.z ^ w.w ^ s2;
      else
        row_out(w, __uint_as_float(q & 1 ? s2 & 0xFFFF0000u : s2 << 16), b);
    }
    if (ablate == 3 && fold == 0x9E3779B9u) out[quad] = 1.f;  // keeps the loads
    return;
  }
  const u32 ring = (u32)__cvta_generic_to_shared(dsm);
  const u32 my_w = ring + threadIdx.x * 16, my_s = ring + V8_THREADS * 16 + threadIdx.x * 4;
  auto issue = [&](int r) {  // row quad + QUADS r into stage r % ST2
    const int n = quad + r * V8_QUADS;
    const u32 st = (u32)(r % V8_ST2) * V8_STAGE2;
    if (n < D) {
      cp_async16(my_w + st, wrow + (size_t)n * sn_w);
      cp_async4(my_s + st, srow + (size_t)n * sn_s);
    }
  };
#pragma unroll
  for (int r = 0; r < V8_ST2 - 1; ++r) {
    if (r < rows) issue(r);
    cp_commit();  // empty groups past the end keep the count uniform
  }
  for (int r = 0; r < rows; ++r) {
    cp_wait<V8_ST2 - 2>();  // row r has landed (this lane's own copies: no barrier)
    const u32 st = (u32)(r % V8_ST2) * V8_STAGE2;
    const uint4 w = lds(my_w + st);
    const u32 s2 = lds32(my_s + st);
    if (r + V8_ST2 - 1 < rows) issue(r + V8_ST2 - 1);  // into the stage read one row ago
    cp_commit();
    row_out(w, __uint_as_float(q & 1 ? s2 & 0xFFFF0000u : s2 << 16), r);
  }
}

// FC 1 (opts & 64): the combine in this launch's tail, so that no second launch (3.3 µs and
// its gap) follows. Every CTA, once its part is stored, takes a ticket t = atom.inc(cnt, G - 1)
// (G CTAs; the counter wraps to 0 at the last one, ready for the next launch); the last
// min(G, NB) tickets (NB combine blocks of 64 columns) are the combiners: each waits until the
// last arrival bumps the generation word gen (read at this CTA's start: it can only move once
// every CTA, this one included, has arrived), then combines blocks t - (G - NC), + NC, ...
// with the combine's arithmetic (the same bits as its launch). No CTA waits on a CTA that is not
// running unless all SM slots hold waiters: the rule (cuda_v8.py) keeps the combiners fewer
// than the SMs. sync: u32 words, cnt at 0 and gen at V8_GEN (their own 128-byte lines: the
// spins on gen do not queue behind the tickets), zero before a stream's first launch
// (cuda_v8.py: one set a stream).
// The tail is a latency chain (session 31 call 3: ~3.2 µs, what the combine launch took), so
// it overlaps what it can: gen is read at the CTA's start, the token's ids and weights are
// loaded while thread 0 takes the ticket (one acq_rel atomic, no separate fence), and a
// combiner's 16 slice loads a column are in flight at once (combine_cols). Nothing is kept in
// static shared memory (session 32 call 1: 528 more bytes of it, phase 1 alone 35 -> 40 µs).
__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
constexpr int V8_FC = 16;   // the tail's column threads a combine block (4 columns each: 64)
constexpr int V8_GEN = 32;  // gen's word in the sync words
__device__ __forceinline__ u32 fc_gen(u64 sync_ptr) {  // gen at the CTA's start (thread 0's)
  return *(volatile const u32*)((const u32*)sync_ptr + V8_GEN);
}
__device__ __forceinline__ void combine_tail(u64 part, u64 ids_ptr, int ids64, int s_ik,
                                             u64 w_ptr, int s_wk, int E, int D, u64 out_ptr,
                                             u64 sync_ptr, float* red, u32 g0) {
  u32* cnt = (u32*)sync_ptr;
  u32* gen = cnt + V8_GEN;
  const int K = gridDim.y, NSL = gridDim.x;
  const u32 G = gridDim.x * gridDim.y;
  const int NB = (D + 4 * V8_FC - 1) / (4 * V8_FC), NCB = min((int)G, NB);  // blocks, combiners
  // red (phase 1's) is free: the combine's [V8_CK][V8_FC] float4, then [V8_KMAX] ids (an id
  // outside [-1, E) as -2: skipped, and bad), [V8_KMAX] weights, bad, the ticket
  float4(*acc_j)[V8_FC] = (float4(*)[V8_FC])red;
  int* ids = (int*)(red + 4 * V8_CK * V8_FC);
  float* wts = (float*)(ids + V8_KMAX);
  int* sh = (int*)(wts + V8_KMAX);
  __syncthreads();  // every thread's part stores issued, every read of red done
  if (threadIdx.x == 0) {
    u32 t;  // acq_rel: this CTA's part (ordered before by the barrier) released with the ticket
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;"
                 : "=r"(t) : "l"(cnt), "r"(G - 1) : "memory");
    if (t == G - 1)  // every part is stored (the tickets' release sequence): publish it
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(gen) : "memory");
    else if (t >= G - NCB)
      while (ld_acquire_gpu(gen) == g0) {
      }
    sh[1] = (int)t;
  } else if (threadIdx.x >= 32) {  // meanwhile the token's ids and weights
    if (threadIdx.x == 32) sh[0] = 0;
    for (int i = threadIdx.x - 32; i < K; i += blockDim.x - 32) {
      const long long e = v8_id(ids_ptr, ids64, s_ik, i);
      ids[i] = e < -1 || e >= (long long)E ? -2 : (int)e;
      wts[i] = ((const float*)w_ptr)[(size_t)i * s_wk];
    }
  }
  __syncthreads();
  const int t = sh[1];
  if (t < (int)G - NCB) return;
  // the router's rule (an id outside [-1, E) is -2 here); combine_cols' first barrier
  // publishes bad
  flag_bad_ids(ids, K, E, sh);
  for (int b = t - ((int)G - NCB); b < NB; b += NCB)
    combine_cols<V8_FC, true>((const float*)part, NSL, ids, sh, wts, 1, K, E, D, out_ptr,
                              b * 4 * V8_FC, acc_j);
}

// grid (NSL, K), V8_THREADS threads (decode_cta's header above); FC 1 (opts & 64): the combine
// too (combine_tail), out [1, D] bf16 at out_ptr, w_ptr / s_wk the routing weights (fp32)
template <int KPAD, int DN, int GU = 3, int GB = 0>
__global__ void __launch_bounds__(V8_THREADS, 1)
int4_moe_decode(u64 w1, u64 s1, u64 x_ptr, u64 ids_ptr, int ids64, int s_ik, int E, int NU,
                int C, int ld, int D, int I, u64 wd, u64 sd, long long se_w, int sn_w,
                long long se_s, int sn_s, u64 part, int opts, long long sx_w,
                long long sx_s, u64 w_ptr, int s_wk, u64 out_ptr, u64 sync_ptr) {
  __shared__ __align__(16) float red[V8_KW * V8_RW * 2 * 32 * 4];
  __shared__ float hs[V8_SLICE];
  __shared__ int zero;
  extern __shared__ uint4 dsm[];
  __shared__ __align__(8) unsigned long long bars[2 * V8_BARS];  // bulk forms: full, empty
  __shared__ __align__(8) unsigned long long gbars[GB ? V8_THREADS / 32 * GU : 1];  // GB 1 / 2
  static_assert(GU >= 3 && (V8_THREADS / 32) * GU * (GB ? 2304 : 3072) + 16 * V8_CORR + 18 * 1024
                <= 227 * 1024,
                "the gate/up ring fits one CTA's shared memory");
  static_assert(V8_CK * V8_FC * 16 + V8_KMAX * 8 + 8 <= (int)sizeof(red), "the tail's arrays");
  const u32 g0 = (opts & 64) && threadIdx.x == 0 ? fc_gen(sync_ptr) : 0;
  decode_cta<KPAD, DN, GU, GB>(w1, s1, x_ptr, ids_ptr, ids64, s_ik, E, NU, C, ld, D, I, wd, sd,
                               se_w, sn_w, se_s, sn_s, part, opts, sx_w, sx_s, red, hs, zero,
                               dsm, bars, gbars);
  if (opts & 64)
    combine_tail(part, ids_ptr, ids64, s_ik, w_ptr, s_wk, E, D, out_ptr, sync_ptr, red, g0);
}

__device__ __forceinline__ void cluster_sync() {  // every thread of every CTA of the cluster
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}

// CL CTAs a cluster (along the slices: one expert, CL neighbouring slices): after phase 1 each
// CTA gathers the cluster's 128 CL inputs of h from its neighbours' shared memory (DSMEM) and
// takes every CL-th group of rows of the down partial over all of them, so a row's read is
// 64 CL contiguous bytes (the single-CTA forms read 64 bytes a row, 1 KB apart, 16 CTAs an
// expert each their own 64: session 28 call 5, the down phase ~28 µs for 66 MB whatever the
// form, DN 2's tensor cores included); part holds NSL / CL slices. 4 CL lanes a row (lane j of
// its group: inputs 32 j ..), 32 / (4 CL) rows a warp instruction, reduced by log2(4 CL)
// shuffles. All CTAs of a cluster share k, so a skipped slot skips the whole cluster.
template <int KPAD, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(V8_THREADS, 1)
int4_moe_decode_cl(u64 w1, u64 s1, u64 x_ptr, u64 ids_ptr, int ids64, int s_ik, int E, int NU,
                   int C, int ld, int D, int I, u64 wd, u64 sd, long long se_w, int sn_w,
                   long long se_s, int sn_s, u64 part) {
  constexpr int LPR = 4 * CL, RPW = 32 / LPR, NW = V8_THREADS / 32;
  constexpr int STEP = CL * NW * RPW;  // rows a pass of the cluster (128)
  __shared__ float red[V8_KW * V8_RW * 2 * 32 * 4];
  __shared__ float hs[V8_SLICE];
  __shared__ float h_all[LPR][33];  // the cluster's inputs, group j's 32 in row j (padded)
  __shared__ int zero;
  extern __shared__ uint4 dsm[];
  const int xs = blockIdx.x, k = blockIdx.y;
  const long long e = v8_id(ids_ptr, ids64, s_ik, k);
  if (e < 0 || e >= E) return;  // the whole cluster (one k): -1, or the combine's NaN
  h_slice<KPAD>(w1, s1, x_ptr, (int)e, NU, C, ld, D, I, xs, red, hs, &zero, dsm);
  cluster_sync();  // every CTA's hs complete
  for (int m = threadIdx.x; m < V8_SLICE * CL; m += V8_THREADS) {
    const u32 mine = (u32)__cvta_generic_to_shared(&hs[m % V8_SLICE]);
    u32 theirs;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(theirs) : "r"(mine), "r"(m / V8_SLICE));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(theirs) : "memory");
    h_all[m / 32][m % 32] = v;
  }
  cluster_sync();  // every CTA done reading the others' hs (they may exit); h_all complete
  u32 rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = lane % LPR, rho = lane / LPR;
  float h[32];
  float hsum = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    h[i] = h_all[j][i];
    hsum += h[i];
  }
  const float corr = -136.f * hsum;
  const int c = xs / CL, i0 = V8_SLICE * CL * c + 32 * j;
  const int* wrow = (const int*)wd + (size_t)e * se_w + i0 / 8;
  const u16* srow = (const u16*)sd + (size_t)e * se_s + i0 / 32;
  float* out = (float*)part + ((size_t)c * gridDim.y + k) * D;
  const int row0 = ((int)rank * NW + warp) * RPW + rho, iters = (D + STEP - 1) / STEP;
  for (int it0 = 0; it0 < iters; it0 += V8_BATCH) {  // warp-uniform (the group shuffles)
    uint4 w[V8_BATCH];
    u16 sc[V8_BATCH];
#pragma unroll
    for (int b = 0; b < V8_BATCH; ++b) {
      const int n = row0 + STEP * (it0 + b);
      if (it0 + b < iters && n < D) {
        w[b] = ld_row((const uint4*)(wrow + (size_t)n * sn_w));
        sc[b] = __ldg(srow + (size_t)n * sn_s);
      }
    }
#pragma unroll
    for (int b = 0; b < V8_BATCH; ++b) {
      if (it0 + b >= iters) break;
      float acc = dot8(w[b].x, h, corr);
      acc = dot8(w[b].y, h + 8, acc);
      acc = dot8(w[b].z, h + 16, acc);
      acc = dot8(w[b].w, h + 24, acc);
      acc *= from_bf16(sc[b]);
#pragma unroll
      for (int o = 1; o < LPR; o <<= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
      const int n = row0 + STEP * (it0 + b);
      if (j == 0 && n < D) out[n] = acc;
    }
  }
}

// grid ceil(D / 128), (32, V8_CK) threads: thread (c, j) takes columns 128 blockIdx.x + 4 c ..
// + 3 (one 16-byte load a part row; D a multiple of 4) and the slots k = j, j + V8_CK, ...,
// each w[k] sum_s part[s, k, n] (session 28 call 2: one thread a column walking all K NSL
// loads in turn took 8.9 µs at T 1; call 3, a thread a column and slot, 4.9; call 4, these
// loads with each thread checking the token's ids itself, K^2 dependent loads, 9.4: the ids now
// come into shared memory once, K <= V8_KMAX);
// out[0, n] = bf16 of the sum over j in order of those (for K <= V8_CK: slot order), NaN for a
// bad token (an id outside [-1, E) or one expert twice; -1 may repeat)
__global__ void __launch_bounds__(32 * V8_CK)
int4_moe_decode_combine(u64 part, int NSL, u64 ids_ptr, int ids64, int s_ik, u64 w_ptr,
                        int s_wk, int K, int E, int D, u64 out_ptr) {
  __shared__ float4 acc_j[V8_CK][32];
  __shared__ long long ids[V8_KMAX];
  __shared__ int bad;
  combine_ids(ids_ptr, ids64, s_ik, K, E, ids, &bad);
  combine_cols<32, false>((const float*)part, NSL, ids, &bad, (const float*)w_ptr, s_wk, K, E, D,
                          out_ptr, blockIdx.x * 128, acc_j);
}
