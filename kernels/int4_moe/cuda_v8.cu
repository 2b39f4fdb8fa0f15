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
//      -136 sum(h) once a group, times the group's scale), the quad summed by two shuffles;
//      the rows stream through a per-lane cp.async ring in the gate/up ring's shared memory.
// The combine sums, per output column, w[k] * sum over slices of part[slice, k] in (k, slice)
// order (fp32, no atomics: deterministic), NaN for a token with an id outside [-1, E) or an
// expert twice (the router's rule, `_common._route_bad`), -1 slots adding nothing.
// Traffic: the experts' bytes once, plus part: NSL K D fp32 written and read (T 1, Kimi: 16 x
// 8 x 7168 x 4 = 3.7 MB, 1.9 % of the 198 MB of weights).

constexpr int V8_KW = 2, V8_RW = 8;                  // gate/up K parts x units a CTA: 16 warps
constexpr int V8_THREADS = 32 * V8_KW * V8_RW;       // 512: one CTA an SM at 128 registers
constexpr int V8_SLICE = 16 * V8_RW;                 // intermediate inputs a CTA (128)
constexpr int V8_QUADS = V8_THREADS / 4;             // down rows in flight a pass (one a quad)
// the down partial's ring, in the gate/up ring's shared memory (free once h is done): a stage
// holds one row a lane, its 16 bytes of words and the 4 bytes of its scale pair; V8_ST2 - 1
// rows in flight a lane (session 28 call 3: eight rows loaded, then their math, in turn, took
// the down phase ~27 µs for 66 MB at T 1, the gate/up phase 38 for 132)
constexpr int V8_STAGE2 = V8_THREADS * (16 + 4);     // bytes a stage (10 KB)
constexpr int V8_ST2 = 14;                           // stages (140 KB of the 144 KB ring)
static_assert(V8_ST2 * V8_STAGE2 <= V8_KW * V8_RW * 3 * 6 * 32 * 16, "the gate/up ring holds it");

__device__ __forceinline__ long long v8_id(u64 ids_ptr, int ids64, int s_ik, int k) {
  return ids64 ? ((const long long*)ids_ptr)[(size_t)k * s_ik]
               : (long long)((const int*)ids_ptr)[(size_t)k * s_ik];
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ u32 lds32(u32 a) {
  u32 r;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a));
  return r;
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

// grid (NSL, K), V8_THREADS threads; dynamic shared memory: the gate/up ring (16 warps x 3
// stages x 6 x 32 x 16 B). w1 / s1: gate/up repacked (mma_layout), x [1, ld] bf16, ids / wts
// [1, K], wd / sd: down in the checkpoint layout [E, D, I / 8] int32 / [E, D, I / 32] bf16 at
// expert strides se_w / se_s and row strides sn_w / sn_s (elements), part [NSL, K, D] fp32.
template <int KPAD>
__global__ void __launch_bounds__(V8_THREADS, 1)
int4_moe_decode(u64 w1, u64 s1, u64 x_ptr, u64 ids_ptr, int ids64, int s_ik, int E, int NU,
                int C, int ld, int D, int I, u64 wd, u64 sd, long long se_w, int sn_w,
                long long se_s, int sn_s, u64 part) {
  __shared__ float red[V8_KW * V8_RW * 2 * 32 * 4];
  __shared__ float hs[V8_SLICE];
  __shared__ int zero;
  extern __shared__ uint4 dsm[];
  const int xs = blockIdx.x, k = blockIdx.y;
  const long long e = v8_id(ids_ptr, ids64, s_ik, k);
  if (e < 0 || e >= E) return;  // -1: not routed here; outside [0, E): the combine's NaN
  if (threadIdx.x < V8_SLICE) hs[threadIdx.x] = 0.f;
  if (threadIdx.x == 0) zero = 0;  // the slot table unit_block reads: row 0 / 1 = the token
  __syncthreads();
  // h's input i lands at hs[i - SLICE xs]: out_ptr is hs's generic address shifted back by
  // the slice's first input, and ldo 0 (one slot)
  const u64 h_at = (u64)(hs) - sizeof(float) * (u64)(V8_SLICE * xs);
  const GemmArgs A{w1, s1, x_ptr, x_ptr, h_at, h_at, NU, C, ld, D, I, 0, 0, 0};
  unit_block<0, 1, KPAD, V8_KW, V8_RW, 1, 3, 0, 2, 2>(A, &zero, 1, (int)e, 0, 1, xs, red, dsm,
                                                     [] {});
  __syncthreads();  // hs complete

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
  const int* wrow = (const int*)wd + (size_t)e * se_w + i0 / 8;
  const u16* srow = (const u16*)sd + (size_t)e * se_s + (i0 / 32 & ~1);
  float* out = (float*)part + ((size_t)xs * gridDim.y + k) * D;
  const u32 ring = (u32)__cvta_generic_to_shared(dsm);
  const u32 my_w = ring + threadIdx.x * 16, my_s = ring + V8_THREADS * 16 + threadIdx.x * 4;
  const int rows = (D + V8_QUADS - 1) / V8_QUADS;  // warp-uniform (the quad shuffles)
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
    float acc = dot8(w.x, h, corr);
    acc = dot8(w.y, h + 8, acc);
    acc = dot8(w.z, h + 16, acc);
    acc = dot8(w.w, h + 24, acc);
    acc *= __uint_as_float(q & 1 ? s2 & 0xFFFF0000u : s2 << 16);  // the group's scale, once
    acc += __shfl_xor_sync(0xFFFFFFFFu, acc, 1);
    acc += __shfl_xor_sync(0xFFFFFFFFu, acc, 2);
    const int n = quad + r * V8_QUADS;
    if (q == 0 && n < D) out[n] = acc;
  }
}

// grid ceil(D / 128), (32, V8_CK) threads: thread (c, j) takes columns 128 blockIdx.x + 4 c ..
// + 3 (one 16-byte load a part row; D a multiple of 4) and the slots k = j, j + V8_CK, ...,
// each w[k] sum_s part[s, k, n] (session 28 call 2: one thread a column walking all K NSL
// loads in turn took 8.9 µs at T 1; call 3, a thread a column and slot, 4.9);
// out[0, n] = bf16 of the sum over j in order of those (for K <= V8_CK: slot order), NaN for a
// bad token (an id outside [-1, E) or one expert twice; -1 may repeat)
constexpr int V8_CK = 8;
__global__ void __launch_bounds__(32 * V8_CK)
int4_moe_decode_combine(u64 part, int NSL, u64 ids_ptr, int ids64, int s_ik, u64 w_ptr,
                        int s_wk, int K, int E, int D, u64 out_ptr) {
  __shared__ float4 acc_j[V8_CK][32];
  const int c = threadIdx.x & 31, j = threadIdx.x >> 5;
  const int n = blockIdx.x * 128 + 4 * c;
  const float* wts = (const float*)w_ptr;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k = j; k < K && n < D; k += V8_CK) {
    const long long e = v8_id(ids_ptr, ids64, s_ik, k);
    if (e < 0 || e >= E) continue;  // -1 adds nothing; outside [0, E): NaN below
    const float4* P = (const float4*)((const float*)part + (size_t)k * D + n);
    const size_t step = (size_t)K * D / 4;  // one slice to the next, in float4
    float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < NSL; ++s) {
      const float4 v = __ldcs(P + s * step);  // read once: evict first
      y.x += v.x, y.y += v.y, y.z += v.z, y.w += v.w;
    }
    const float wk = wts[(size_t)k * s_wk];
    acc.x = fmaf(wk, y.x, acc.x), acc.y = fmaf(wk, y.y, acc.y);
    acc.z = fmaf(wk, y.z, acc.z), acc.w = fmaf(wk, y.w, acc.w);
  }
  acc_j[j][c] = acc;
  __syncthreads();
  if (j != 0 || n >= D) return;
  bool bad = false;
  for (int k = 0; k < K; ++k) {
    const long long e = v8_id(ids_ptr, ids64, s_ik, k);
    bad |= e < -1 || e >= E;
    for (int i = 0; i < k && e != -1; ++i) bad |= v8_id(ids_ptr, ids64, s_ik, i) == e;
  }
  float4 sum = acc_j[0][c];
#pragma unroll
  for (int i = 1; i < V8_CK; ++i) {
    const float4 v = acc_j[i][c];
    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
  }
  const u32 nan2 = 0x7FC07FC0u;
  const uint2 o = make_uint2(bad ? nan2 : (u32)to_bf16(sum.x) | (u32)to_bf16(sum.y) << 16,
                             bad ? nan2 : (u32)to_bf16(sum.z) | (u32)to_bf16(sum.w) << 16);
  *(uint2*)((u16*)out_ptr + n) = o;
}
