// int4_moe cuda_v19: cuda_v10's hot gate/up launch with its MMAs on wgmma (sm_90a), compiled
// after cuda_v1.cu and cuda_v10.cu (cuda_v19.py hands nvcc the three files as one source).
//
// Legend: cuda_v10.cu's (WU warps a CTA, a multiple of 4: WU / 4 warpgroups; NT 8-slot n-tiles
// a pass, P = 8 NT slots; ST stages), plus KP the padded K (a multiple of 128), xp the pass's
// activations in logical-k order (below).
//
// Why (session 45's issue model, scripts/hot_issue_model.py, README "What limits skewed T 128 /
// 512"): cuda_v10's hot loop spends 277 of 442 SASS a 4096-weight step on dequant and 64 on
// HMMA, and every pass of 32 slots dequantises an expert's weights again: the launch is
// issue-bound at skewed T 128 / 512. A wgmma m64nNk16 takes a warp's dequantised A fragment
// (the layout of mma.sync m16n8k16's A, warp w holding rows 16 w .. 16 w + 15 of the
// warpgroup's 64) against N slots from shared memory in one instruction: a k16 step's dequant
// serves 8 NTC slots with 2 instructions (gate, up) instead of 2 NTC HMMAs and NTC LDS.
//
// What changes against cuda_v10's hot_pass:
// * The B operand (activations) is read by descriptor, K-major, 128-byte swizzle: a chunk of
//   64 inputs is [P slots][128 B], 16-byte word w of slot s at s * 128 + ((w ^ (s & 7)) << 4),
//   atoms 1024-byte aligned; a k16 step's descriptor starts 32 B further in (the swizzle is on
//   the address bits, so the step offsets compose with it). Each 16-byte cp.async lands whole.
// * The repacked weights put logical k 2t + b / 2t + 8 + b of step (group G, jj) at inputs
//   8t + 4jj + b / 8t + 4jj + 2 + b of G (mma_layout.py); wgmma reads B's k in order, so the
//   activations are first permuted once a call (int4_moe_xperm: xp[32 G + 16 jj + 8 kc + 2 t +
//   b] = x[32 G + 8 t + 4 jj + 2 kc + b], zeros past k_real) -- mma_layout.logical_k_perm is the
//   CPU twin the tests hold against the fragment layout.
// * Per group G of a pair: dequant (cuda_v10's, the same registers), wgmma.fence, four wgmmas
//   (gate / up x jj) into the tile's accumulators, one commit; wait_group 1 lets the group's
//   wgmmas run under the next group's dequant. Before a stage is refilled every warpgroup has
//   waited its wgmmas (wait_group 0 at the top of the pair, before the CTA barrier).
// * cp.async's writes reach wgmma's async proxy through fence.proxy.async after they land.
// Accumulators, epilogue (`store_h_rows`) and the item list are cuda_v10's: a thread's D
// fragment of n-tile q is mma.sync's C fragment of that n-tile. Numerics: W = bf16((q - 8) s)
// as cuda_v10, fp32 sums inside wgmma (its k16 association is not promised to be mma.sync's:
// the reference's tolerance, not cuda_v10's bits).

// The B descriptor's words. Low: start >> 4 (bits 0-13), LBO 1 (bits 16-29; unused by K-major
// swizzled layouts). High (a constant): SBO 1024 B >> 4 (8 rows of 128 B), swizzle mode 1 =
// 128 B (bits 62-63). Only the low word varies, so only it moves to a uniform register a wgmma.
__device__ __forceinline__ u32 desc_lo(u32 saddr) { return ((saddr & 0x3FFFF) >> 4) | (1u << 16); }
constexpr u32 DESC_HI = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// d (N / 2 fp32: n8 chunk j's four at 4 j) = A (this warp's 16 x 16 bf16 fragment, mma.sync's
// A layout) x B (16 x N bf16 at the descriptor (dlo, DESC_HI)), + d where acc_in (0 on a pass's
// first k16 step: no zeroing instruction defines the accumulators inside the wgmma pipeline,
// which ptxas would serialise, C7515)
template <int N>
__device__ __forceinline__ void wgmma_rs(float* d, const u32 (&a)[4], u32 dlo, u32 acc_in);
template <> __device__ __forceinline__ void wgmma_rs<16>(float* d, const u32 (&a)[4], u32 dlo, u32 acc_in) {
  asm volatile("{\n.reg .pred p;\n.reg .b64 bd;\nsetp.ne.b32 p, %14, 0;\n"
               "mov.b64 bd, {%12, %13};\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7}, "
               "{%8,%9,%10,%11}, bd, p, 1, 1, 0;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(DESC_HI), "r"(acc_in));
}
template <> __device__ __forceinline__ void wgmma_rs<32>(float* d, const u32 (&a)[4], u32 dlo, u32 acc_in) {
  asm volatile("{\n.reg .pred p;\n.reg .b64 bd;\nsetp.ne.b32 p, %22, 0;\n"
               "mov.b64 bd, {%20, %21};\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
               "{%16,%17,%18,%19}, bd, p, 1, 1, 0;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(DESC_HI), "r"(acc_in));
}
template <> __device__ __forceinline__ void wgmma_rs<64>(float* d, const u32 (&a)[4], u32 dlo, u32 acc_in) {
  asm volatile("{\n.reg .pred p;\n.reg .b64 bd;\nsetp.ne.b32 p, %38, 0;\n"
               "mov.b64 bd, {%36, %37};\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
               "{%32,%33,%34,%35}, bd, p, 1, 1, 0;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                 "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(DESC_HI), "r"(acc_in));
}
template <> __device__ __forceinline__ void wgmma_rs<128>(float* d, const u32 (&a)[4], u32 dlo, u32 acc_in) {
  asm volatile("{\n.reg .pred p;\n.reg .b64 bd;\nsetp.ne.b32 p, %70, 0;\n"
               "mov.b64 bd, {%68, %69};\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
               "{%64,%65,%66,%67}, bd, p, 1, 1, 0;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                 "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                 "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                 "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                 "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                 "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(DESC_HI), "r"(acc_in));
}

// One 32-input group of an activation row (src: its first input k0) as four 16-byte words of
// 4-byte pairs, v[t][m] = inputs k0 + 8 t + 2 m, + 1 (zeros past k_real): what the permute
// kernels (int4_moe_xperm here, cuda_v24.cu's int4_moe_xgather) write transposed.
__device__ __forceinline__ void xperm_read(const u16* __restrict__ src, int k0, int k_real,
                                           u32 (&v)[4][4]) {
  if (k0 + 32 <= k_real) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint4 w = *(const uint4*)(src + 8 * t);
      v[t][0] = w.x, v[t][1] = w.y, v[t][2] = w.z, v[t][3] = w.w;
    }
  } else {
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int k = k0 + 8 * t + 2 * m;
        const u32 lo = k < k_real ? src[8 * t + 2 * m] : 0u;
        const u32 hi = k + 1 < k_real ? src[8 * t + 2 * m + 1] : 0u;
        v[t][m] = lo | (hi << 16);
      }
  }
}

// xp [T, KP] bf16 = x [T, ldx] (k_real inputs) in logical-k order, zeros past k_real. A thread
// takes one 32-input group of one row: four 16-byte words in (word t: inputs 8t .. 8t + 7, as
// four 4-byte pairs), four out (word 2 jj + kc: pair kc of half jj of every input word t), a
// 4 x 4 transpose of 4-byte pairs.
extern "C" __global__ void int4_moe_xperm(const u16* __restrict__ x, u16* __restrict__ xp,
                                          int T, int ldx, int k_real, int KP) {
  const int groups = KP / 32;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)T * groups) return;
  const int row = (int)(i / groups), G = (int)(i % groups), k0 = 32 * G;
  u32 v[4][4];  // [input word t][pair m]
  xperm_read(x + (size_t)row * ldx + k0, k0, k_real, v);
  uint4* dst = (uint4*)(xp + (size_t)row * KP + k0);
#pragma unroll
  for (int m = 0; m < 4; ++m) dst[m] = make_uint4(v[0][m], v[1][m], v[2][m], v[3][m]);
}

// cuda_v10's hot_pass with wgmma (header). Every thread of the CTA calls it; xring is the
// 1024-byte aligned activation ring (ST stages of two 64-input chunks [P][128 B]).
template <int WU, int NT, int ST, int NTC>
__device__ __forceinline__ void hot_pass_wg(u64 w_ptr, u64 s_ptr, u64 xp_ptr, const int* slots,
                                            u64 h_ptr, int topk, int NU, int C, int KP, int ldo,
                                            int e, int start, int cnt, int p0, u32 wring,
                                            u32 xring) {
  constexpr int P = 8 * NT;
  constexpr int WST = 6 * 32 * 16;
  constexpr int XST = P * 256;             // a stage: two chunks of P x 128 B
  constexpr int XCP = P * 16 / (32 * WU);  // 16-byte activation copies a thread a stage
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int NP = C / 2;
  const int u = blockIdx.x * WU + warp;
  const bool unit_ok = u < NU;
  const bool wg_ok = blockIdx.x * WU + (warp & ~3) < NU;  // warpgroup-uniform: any unit real
  const int n = min(P, cnt - p0);
  const size_t unit = (size_t)e * NU + (unit_ok ? u : 0);
  const uint4* wq = (const uint4*)w_ptr + unit * C * 64 + lane;
  const uint4* sq = (const uint4*)s_ptr + unit * (C / 2) * 16 + (lane >> 2);
  const uint4* xsrc[XCP];
  u32 xdst[XCP], xok[XCP];
#pragma unroll
  for (int k = 0; k < XCP; ++k) {
    const int idx = threadIdx.x + k * 32 * WU, sl = idx >> 4, ck = idx & 15;
    const int c = ck >> 3, w = ck & 7;  // chunk of the pair, 16-byte word of the chunk's row
    const int row = sl < n ? slots[start + p0 + sl] / topk : 0;
    xsrc[k] = (const uint4*)xp_ptr + (size_t)row * (KP / 8) + ck;
    xdst[k] = xring + c * (P * 128) + sl * 128 + ((w ^ (sl & 7)) << 4);
    xok[k] = sl < 8 * NTC ? (sl < n ? 1u : 2u) : 0u;  // 0: not read this pass, 2: zeros
  }
  // A padding warp (u >= NU, only where NU is not a multiple of 4) streams unit 0 of the expert
  // like the others: its wgmma rows are computed and never stored, and its A stays finite
  auto issue = [&](int p) {
    const int st = p % ST;
    const u32 dst = wring + st * WST;
#pragma unroll
    for (int ch = 0; ch < 2; ++ch)
#pragma unroll
      for (int i = 0; i < 2; ++i) cp_async16(dst + (ch * 2 + i) * 512, wq + p * 128 + ch * 64 + i * 32);
#pragma unroll
    for (int i = 0; i < 2; ++i) cp_async16(dst + (4 + i) * 512, sq + p * 16 + i * 8);
#pragma unroll
    for (int k = 0; k < XCP; ++k)
      if (xok[k]) cp_async16_z(xdst[k] + st * XST, xsrc[k] + p * 16, xok[k] == 1u ? 16u : 0u);
  };
  float acc[2][NTC][4];  // written first by the pass's first wgmmas (acc_in 0)
#pragma unroll
  for (int s2 = 0; s2 < ST - 1; ++s2) {
    if (s2 < NP) issue(s2);
    cp_commit();
  }
  for (int p = 0; p < NP; ++p) {
    cp_wait<ST - 2>();   // this thread's copies of pair p have landed
    fence_async_smem();  // ... and are visible to wgmma's async proxy
    if (wg_ok) wg_wait<0>();  // this warpgroup's wgmmas of pair p - 1 are done with their stage
    __syncthreads();     // everyone's copies landed; every warpgroup is done with stage (p - 1) % ST
    if (p + ST - 1 < NP) issue(p + ST - 1);
    cp_commit();
    if (!wg_ok) continue;
    const int st = p % ST;
    const u32 src = wring + st * WST, xs = xring + st * XST;
    const WS cur = lds_pair(src);
#pragma unroll
    for (int ch = 0; ch < 2; ++ch)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // scale group G = 2 ch + hf of the pair
        u32 af[2][2][4];  // [tile][k16 step of the group][A register]
#pragma unroll
        for (int i = 0; i < 2; ++i) dq_group(cur.w[ch][i], cur.s[i], 2 * ch + hf, af[i]);
        wg_fence();
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const u32 d = desc_lo(xs + ch * (P * 128) + (2 * hf + jj) * 32);
#pragma unroll
          for (int i = 0; i < 2; ++i)
            wgmma_rs<8 * NTC>(&acc[i][0][0], af[i][jj], d, (p | ch | hf | jj) != 0);
        }
        wg_commit();
        wg_wait<1>();
      }
  }
  if (wg_ok) wg_wait<0>();
  if (unit_ok) {
#pragma unroll
    for (int q = 0; q < NTC; ++q)
      if (8 * q < n) store_h_rows(acc[0][q], acc[1][q], u, p0 + 8 * q, cnt, start, h_ptr, ldo);
  }
  __syncthreads();  // every warp is done with the rings before the next item refills them
}

// The launch body (cuda_v19.py wraps it in an extern "C" kernel a configuration, with
// __launch_bounds__(32 WU, MB) and int4_moe_hot's arguments, x = xp and ldx = KP): cuda_v10's
// int4_moe_hot on hot_pass_wg.
// Dynamic shared memory: 1 KB of alignment slack, the activation ring [ST][2][P][128 B], the
// WU weight rings, the item list.
template <int WU, int NT, int ST>
__device__ __forceinline__ void hot_wg_body(u64 w_ptr, u64 s_ptr, u64 xp_ptr, u64 slots_ptr,
                                            u64 act_e_ptr, u64 act_start_ptr, u64 act_cnt_ptr,
                                            u64 n_act_ptr, u64 h_ptr, int topk, int NU, int C,
                                            int KP, int k_real, int ldo, int ht, int hi,
                                            int max_items) {
  (void)k_real;  // cuda_v10's argument list; xp holds zeros past k_real already
  constexpr int P = 8 * NT;
  constexpr int WST = 6 * 32 * 16;
  constexpr int XST = P * 256;
  static_assert(WU % 4 == 0, "whole warpgroups");
  static_assert(P * 16 % (32 * WU) == 0 && P * 16 >= 32 * WU,
                "the pass's activation words split evenly over the threads");
  extern __shared__ uint4 dsm[];
  __shared__ int s_tot[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 raw_base = (u32)__cvta_generic_to_shared(dsm);
  const u32 base = (raw_base + 1023) & ~1023u;  // the swizzle atoms' alignment
  const u32 xring = base;
  const u32 wring = base + ST * XST + warp * ST * WST + lane * 16;
  int* list = (int*)((char*)dsm + (base - raw_base) + ST * XST + WU * ST * WST);
  hot_item_loop<P, NT>(act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, ht, hi, list, max_items,
                       s_tot, [=](auto ntc, int e, int start, int cnt, int p0) {
    hot_pass_wg<WU, NT, ST, decltype(ntc)::value>(w_ptr, s_ptr, xp_ptr, (const int*)slots_ptr,
        h_ptr, topk, NU, C, KP, ldo, e, start, cnt, p0, wring, xring);
  });
}
