// int4_moe cuda_v20: cuda_v19's wgmma hot pass with a unit's gate and up tiles on two warps,
// so a pass of 128 slots fits the registers (compiled after cuda_v1.cu, cuda_v10.cu and
// cuda_v19.cu: cuda_v20.py hands nvcc the four files as one source).
//
// Legend: cuda_v19.cu's; a CTA is 2 WU warps for WU row units (WU / 2 warpgroups); warp w takes
// tile w & 1 (0 gate, 1 up) of unit w >> 1, so a warpgroup's 64 wgmma rows are (unit 2k gate,
// unit 2k up, unit 2k + 1 gate, unit 2k + 1 up).
//
// Why (cuda_v19's sm_90a build, session 46): a warp holding both tiles keeps 2 x N / 2 fp32
// accumulators, 128 registers at N 128: the NT 16 build spilled at 255, so cuda_v19's passes
// stop at 64 slots, and its K loop (~500 SASS a 4096-weight pair at N 64, 285 of them
// dequant) pays that dequant once a 64-slot pass. One tile a warp holds N / 2 accumulators
// (64 at N 128) and dequantises half the unit's weights a step: the same dequant serves 128
// slots.
//
// What changes against cuda_v19's hot_pass_wg: a warp's ring stage holds its tile's two weight
// blocks and its scale block (3 x 512 B; the unit's two warps together copy cuda_v10's 6); a
// scale group's dequant is its tile's 8 registers and two wgmmas (k16 steps jj); the epilogue
// meets gate and up through shared memory (the up warp's accumulators, lane-minor over the
// activation ring once every wgmma is done), then the gate warp runs `store_h_rows`.
// Numerics as cuda_v19 (its tile's rows see the same A fragments and B; the wgmma's N differs).

template <int WU, int NT, int ST, int NTC>
__device__ __forceinline__ void hot_pass_gs(u64 w_ptr, u64 s_ptr, u64 xp_ptr, const int* slots,
                                            u64 h_ptr, int topk, int NU, int C, int KP, int ldo,
                                            int e, int start, int cnt, int p0, u32 wring,
                                            u32 xring, float* xbuf) {
  constexpr int P = 8 * NT;
  constexpr int WST = 3 * 32 * 16;          // a warp's stage: 2 weight blocks + 1 scale block
  constexpr int XST = P * 256;
  constexpr int XCP = P * 16 / (64 * WU);   // 16-byte activation copies a thread a stage
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tile = warp & 1;
  const int NP = C / 2;
  const int u = blockIdx.x * WU + (warp >> 1);
  const bool unit_ok = u < NU;
  const bool wg_ok = blockIdx.x * WU + ((warp & ~3) >> 1) < NU;  // warpgroup-uniform
  const int n = min(P, cnt - p0);
  // a padding unit (u >= NU) streams unit 0: its rows are computed and never stored
  const size_t unit = (size_t)e * NU + (unit_ok ? u : 0);
  const uint4* wq = (const uint4*)w_ptr + unit * C * 64 + tile * 32 + lane;
  const uint4* sq = (const uint4*)s_ptr + unit * (C / 2) * 16 + tile * 8 + (lane >> 2);
  const uint4* xsrc[XCP];
  u32 xdst[XCP], xok[XCP];
#pragma unroll
  for (int k = 0; k < XCP; ++k) {
    const int idx = threadIdx.x + k * 64 * WU, sl = idx >> 4, ck = idx & 15;
    const int c = ck >> 3, w = ck & 7;
    const int row = sl < n ? slots[start + p0 + sl] / topk : 0;
    xsrc[k] = (const uint4*)xp_ptr + (size_t)row * (KP / 8) + ck;
    xdst[k] = xring + c * (P * 128) + sl * 128 + ((w ^ (sl & 7)) << 4);
    xok[k] = sl < 8 * NTC ? (sl < n ? 1u : 2u) : 0u;
  }
  auto issue = [&](int p) {
    const int st = p % ST;
    const u32 dst = wring + st * WST;
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) cp_async16(dst + ch * 512, wq + p * 128 + ch * 64);
    cp_async16(dst + 2 * 512, sq + p * 16);
#pragma unroll
    for (int k = 0; k < XCP; ++k)
      if (xok[k]) cp_async16_z(xdst[k] + st * XST, xsrc[k] + p * 16, xok[k] == 1u ? 16u : 0u);
  };
  float acc[NTC][4];  // this warp's tile; written first by the pass's first wgmma (acc_in 0)
#pragma unroll
  for (int s2 = 0; s2 < ST - 1; ++s2) {
    if (s2 < NP) issue(s2);
    cp_commit();
  }
  for (int p = 0; p < NP; ++p) {
    cp_wait<ST - 2>();
    fence_async_smem();
    if (wg_ok) wg_wait<0>();
    __syncthreads();
    if (p + ST - 1 < NP) issue(p + ST - 1);
    cp_commit();
    if (!wg_ok) continue;
    const int st = p % ST;
    const u32 src = wring + st * WST, xs = xring + st * XST;
    const uint4 w0 = lds(src), w1 = lds(src + 512), sv = lds(src + 1024);
#pragma unroll
    for (int ch = 0; ch < 2; ++ch)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // scale group G = 2 ch + hf of the pair
        u32 af[2][4];  // [k16 step of the group][A register]
        dq_group(ch ? w1 : w0, sv, 2 * ch + hf, af);
        wg_fence();
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
          wgmma_rs<8 * NTC>(&acc[0][0], af[jj], desc_lo(xs + ch * (P * 128) + (2 * hf + jj) * 32),
                            (p | ch | hf | jj) != 0);
        wg_commit();
        wg_wait<1>();
      }
  }
  if (wg_ok) wg_wait<0>();
  __syncthreads();  // every wgmma and copy of the pass is done: the ring may hold the up tiles
  float* mine = xbuf + (size_t)(warp >> 1) * NTC * 4 * 32 + lane;  // [unit][q][r][lane]
  if (tile == 1 && unit_ok) {
#pragma unroll
    for (int q = 0; q < NTC; ++q)
#pragma unroll
      for (int r = 0; r < 4; ++r) mine[(q * 4 + r) * 32] = acc[q][r];
  }
  __syncthreads();
  if (tile == 0 && unit_ok) {
#pragma unroll
    for (int q = 0; q < NTC; ++q) {
      float ua[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) ua[r] = mine[(q * 4 + r) * 32];
      if (8 * q < n) store_h_rows(acc[q], ua, u, p0 + 8 * q, cnt, start, h_ptr, ldo);
    }
  }
  __syncthreads();  // the up tiles are read before the next item refills the ring
}

// The launch body (cuda_v20.py wraps it in an extern "C" kernel of 64 WU threads a
// configuration, int4_moe_hot's arguments, x = xp and ldx = KP). Dynamic shared memory as
// cuda_v19's (the 2 WU half rings take the WU whole rings' bytes).
template <int WU, int NT, int ST>
__device__ __forceinline__ void hot_gs_body(u64 w_ptr, u64 s_ptr, u64 xp_ptr, u64 slots_ptr,
                                            u64 act_e_ptr, u64 act_start_ptr, u64 act_cnt_ptr,
                                            u64 n_act_ptr, u64 h_ptr, int topk, int NU, int C,
                                            int KP, int k_real, int ldo, int ht, int hi,
                                            int max_items) {
  (void)k_real;
  constexpr int P = 8 * NT;
  constexpr int WST = 3 * 32 * 16;
  constexpr int XST = P * 256;
  static_assert(WU % 2 == 0, "whole warpgroups (two units each)");
  static_assert(P * 16 % (64 * WU) == 0 && P * 16 >= 64 * WU,
                "the pass's activation words split evenly over the threads");
  static_assert(WU * NT * 4 * 32 * 4 <= ST * XST, "the up tiles fit the activation ring");
  extern __shared__ uint4 dsm[];
  __shared__ int s_tot[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 raw_base = (u32)__cvta_generic_to_shared(dsm);
  const u32 base = (raw_base + 1023) & ~1023u;
  const u32 xring = base;
  const u32 wring = base + ST * XST + warp * ST * WST + lane * 16;
  float* xbuf = (float*)((char*)dsm + (base - raw_base));
  int* list = (int*)((char*)dsm + (base - raw_base) + ST * XST + 2 * WU * ST * WST);
  hot_item_loop<P, NT>(act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, ht, hi, list, max_items,
                       s_tot, [=](auto ntc, int e, int start, int cnt, int p0) {
    hot_pass_gs<WU, NT, ST, decltype(ntc)::value>(w_ptr, s_ptr, xp_ptr, (const int*)slots_ptr,
        h_ptr, topk, NU, C, KP, ldo, e, start, cnt, p0, wring, xring, xbuf);
  });
}
