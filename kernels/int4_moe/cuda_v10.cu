// int4_moe cuda_v10: the gate/up GEMM of the hot experts (more than WT slots) on wide n-tiles,
// compiled after cuda_v1.cu (cuda_v10.py hands NVRTC the two files as one source).
//
// Legend: cuda_v1.cu's, plus WU warps a CTA (one 32-row unit each, the whole K), NT 8-slot
// n-tiles a pass (a pass: up to P = 8 NT slots of one expert), ST pipeline stages, Y CTA
// columns along the work items, WT the slot count past which an expert is hot.
//
// Why (H200, session 33 call 1, traces/gpu/session33): cuda_v5's gate/up warp streams its
// expert's weights once a pass of 8 slots (NN1 1) and reads its slots' activations once a
// 32-row unit; under skewed routing (T 17-512) and at T 512 it took 1.0-1.8x the time of
// triton_v34's gate/up, whose hot launch runs an expert past 64 slots on 128-slot tiles.
//
// Here a CTA of WU warps takes a work item (hot expert, pass) for WU row units. A stage holds,
// for one chunk pair, each warp's 2 KB of weights and 256 B of scales (cp.async, each lane its
// own words: cuda_v1's ring layout) and the pass's activations [P slots][128 inputs] bf16
// (16 KB at NT 8, every thread copying a share), which the WU warps share: an activation row
// is read from L2 once a CTA, not once a unit. ST - 1 stages in flight, one CTA barrier a pair.
// A lane's B operand of a scale group for n-tile n is one 16-byte LDS (its 8 inputs of slot
// 8 n + g, the layout's order), the row's 16-byte words XOR-swizzled by (slot & 1) << 2 so
// that a quarter warp's 8 reads (slots 2k, 2k + 1, words 4 G + t) hit 8 bank groups. A pass of
// n slots runs on the fewest compiled n-tile counts (2, 4 or NT) that hold it.
// Dequant: cuda_v1's POST 0 (W = bf16((q - 8) s), the reference's rounding, in the mma), fp32
// sums in the mma, K in input order in one warp. Epilogue: HOUT 1's (`store_h_rows`:
// triton_v5's rows, which triton_v34's down GEMM reads).
//
// Work items: every CTA lists the items once in shared memory (a block scan over the active
// experts' pass counts: expert a in active order, pass j), then CTA column y takes items
// y, y + Y, ... A hot expert's passes land in neighbouring columns, run side by side: its
// second stream of weights can come from L2.

__device__ __forceinline__ void cp_async16_z(u32 dst, const void* src, u32 bytes) {
  // bytes 0: the 16 bytes at dst are zero-filled (nothing read from src)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes));
}

// The CTA's work list: list[j] = (a << 16) | pass for the items of every active expert with
// more than ht and at most hi slots (cuda_v12's bands; cuda_v10 / v11 pass hi = INT_MAX), in
// active order; returns the item count (every thread). Block scan of
// two experts a thread per round (warp shuffles, then the warp totals in warp 0).
template <int P>
__device__ __forceinline__ int hot_items(const int* act_cnt, int n_act, int ht, int hi,
                                         int* list, int max_items, int* s_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int carry = 0;
  for (int base = 0; base < n_act; base += 2 * blockDim.x) {
    const int a0 = base + 2 * threadIdx.x;
    int n0 = 0, n1 = 0;
    const int c0 = a0 < n_act ? act_cnt[a0] : 0, c1 = a0 + 1 < n_act ? act_cnt[a0 + 1] : 0;
    if (c0 > ht && c0 <= hi) n0 = (c0 + P - 1) / P;
    if (c1 > ht && c1 <= hi) n1 = (c1 + P - 1) / P;
    int v = n0 + n1;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {  // inclusive scan across the warp
      const int o = __shfl_up_sync(0xFFFFFFFFu, v, d);
      if (lane >= d) v += o;
    }
    if (lane == 31) s_tot[warp] = v;
    __syncthreads();
    if (warp == 0) {
      int w = lane < nw ? s_tot[lane] : 0;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xFFFFFFFFu, w, d);
        if (lane >= d) w += o;
      }
      if (lane < nw) s_tot[lane] = w;  // inclusive totals of warps 0 .. lane
    }
    __syncthreads();
    int j = carry + (warp ? s_tot[warp - 1] : 0) + v - (n0 + n1);  // this thread's first item
    for (int k = 0; k < n0; ++k, ++j)
      if (j < max_items) list[j] = (a0 << 16) | k;
    for (int k = 0; k < n1; ++k, ++j)
      if (j < max_items) list[j] = ((a0 + 1) << 16) | k;
    carry += s_tot[nw - 1];
    __syncthreads();  // s_tot is rewritten next round; the list is complete after the last
  }
  return min(carry, max_items);
}

template <int N>
struct NTiles {  // a pass's compiled n-tile count, as a type (hot_item_loop's pass argument)
  static constexpr int value = N;
};

// A hot launch's work: the CTA lists its (active expert, pass) items once (hot_items), then takes
// items blockIdx.y, + gridDim.y, ... (CTA-uniform) and runs each as pass(NTiles<NTC>(), e,
// start, cnt, p0) at the fewest compiled n-tiles of 2, 4, 8 (only where NT > 8) and NT that
// hold the pass's slots. Shared by int4_moe_hot and cuda_v19.cu / cuda_v20.cu's bodies.
// Callers capture by value ([=]): by reference, cuda_v20.cu's body compiled to other registers
// (172 -> 174); by value every instance's SASS is the hand-written loop's (nvcc, compared).
template <int P, int NT, class Pass>
__device__ __forceinline__ void hot_item_loop(u64 act_e_ptr, u64 act_start_ptr, u64 act_cnt_ptr,
                                              u64 n_act_ptr, int ht, int hi, int* list,
                                              int max_items, int* s_tot, Pass pass) {
  const int* act_cnt = (const int*)act_cnt_ptr;
  const int n_items = hot_items<P>(act_cnt, *(const int*)n_act_ptr, ht, hi, list, max_items,
                                      s_tot);
  for (int it = blockIdx.y; it < n_items; it += gridDim.y) {  // CTA-uniform
    const int a = list[it] >> 16, p0 = (list[it] & 0xFFFF) * P;
    const int e = ((const int*)act_e_ptr)[a], start = ((const int*)act_start_ptr)[a];
    const int cnt = act_cnt[a], nt = (min(P, cnt - p0) + 7) >> 3;
    if (nt <= 2) pass(NTiles<2>(), e, start, cnt, p0);
    else if (NT > 2 && nt <= 4) pass(NTiles<(NT > 2 ? 4 : 2)>(), e, start, cnt, p0);
    else if (NT > 8 && nt <= 8) pass(NTiles<(NT > 8 ? 8 : NT)>(), e, start, cnt, p0);
    else pass(NTiles<NT>(), e, start, cnt, p0);
  }
}

// One work item: pass p0.. (n = min(P, cnt - p0) slots) of expert e (its cnt slots at sorted
// positions start..) for this CTA's WU row units, on NTC n-tiles (8 NTC >= n, a compile-time
// count: the K loop has no branch on it, so the scheduler interleaves the four groups' dequant,
// LDS and mma freely; at a runtime bound each n-tile was its own basic block and the 8 warps an
// SM ran latency-bound, session 33 call 2). Every thread of the CTA calls it.
template <int KPAD, int WU, int NT, int ST, int NTC>
__device__ __forceinline__ void hot_pass(u64 w_ptr, u64 s_ptr, u64 x_ptr, const int* slots,
                                         u64 h_ptr, int topk, int NU, int C, int ldx,
                                         int k_real, int ldo, int e, int start, int cnt, int p0,
                                         u32 wring, u32 xring) {
  constexpr int P = 8 * NT;          // slots a pass (the activation ring's rows)
  constexpr int WST = 6 * 32 * 16;   // a warp's stage: 4 weight blocks + 2 scale words, a lane each
  constexpr int XST = P * 256;       // a stage's activations: P slots x 128 inputs, bf16
  constexpr int XCP = P * 16 / (32 * WU);  // 16-byte activation copies a thread a stage
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int NP = C / 2;  // chunk pairs of the whole K
  const int u = blockIdx.x * WU + warp;  // this warp's row unit
  const bool unit_ok = u < NU;
  const int n = min(P, cnt - p0);
  const size_t unit = (size_t)e * NU + (unit_ok ? u : 0);
  const uint4* wq = (const uint4*)w_ptr + unit * C * 64 + lane;
  const uint4* sq = (const uint4*)s_ptr + unit * (C / 2) * 16 + g;
  // this thread's activation words: slot sl = idx / 16, word ck = idx % 16 of the pair's row
  const uint4* xsrc[XCP];
  u32 xdst[XCP], xok[XCP];
#pragma unroll
  for (int k = 0; k < XCP; ++k) {
    const int idx = threadIdx.x + k * 32 * WU, sl = idx >> 4, ck = idx & 15;
    const int row = sl < n ? slots[start + p0 + sl] / topk : 0;
    xsrc[k] = (const uint4*)x_ptr + (size_t)row * (ldx / 8) + ck;
    xdst[k] = xring + sl * 256 + ((ck ^ ((sl & 1) << 2)) << 4);
    xok[k] = sl < 8 * NTC ? (sl < n ? 1u : 2u) : 0u;  // 0: not read this pass, 2: zeros
  }
  auto issue = [&](int p) {
    const int st = p % ST;
    if (unit_ok) {
      const u32 dst = wring + st * WST;
#pragma unroll
      for (int ch = 0; ch < 2; ++ch)
#pragma unroll
        for (int i = 0; i < 2; ++i) cp_async16(dst + (ch * 2 + i) * 512, wq + p * 128 + ch * 64 + i * 32);
#pragma unroll
      for (int i = 0; i < 2; ++i) cp_async16(dst + (4 + i) * 512, sq + p * 16 + i * 8);
    }
#pragma unroll
    for (int k = 0; k < XCP; ++k) {
      if (!xok[k]) continue;
      const int kin = 128 * p + 8 * ((threadIdx.x + k * 32 * WU) & 15);
      const bool ok = xok[k] == 1u && (!KPAD || kin < k_real);
      cp_async16_z(xdst[k] + st * XST, xsrc[k] + p * 16, ok ? 16u : 0u);
    }
  };
  float acc[2][NTC][4];
  zero_acc(acc);
#pragma unroll
  for (int s2 = 0; s2 < ST - 1; ++s2) {
    if (s2 < NP) issue(s2);
    cp_commit();  // empty groups past the end keep the count uniform
  }
  for (int p = 0; p < NP; ++p) {
    cp_wait<ST - 2>();  // this thread's copies of pair p have landed
    __syncthreads();    // everyone's have; every warp is done with stage (p - 1) % ST
    if (p + ST - 1 < NP) issue(p + ST - 1);
    cp_commit();
    if (!unit_ok) continue;
    const int st = p % ST;
    const u32 src = wring + st * WST, xs = xring + st * XST;
    const WS cur = lds_pair(src);
#pragma unroll
    for (int ch = 0; ch < 2; ++ch)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // scale group G = 2 ch + hf of the pair
        u32 af[2][2][4];  // [tile][mma step of the group][A register]
#pragma unroll
        for (int i = 0; i < 2; ++i) dq_group(cur.w[ch][i], cur.s[i], 2 * ch + hf, af[i]);
        const int ck = 4 * (2 * ch + hf) + t;  // this lane's 16-byte word of the group
#pragma unroll
        for (int q = 0; q < NTC; ++q) {
          const int sl = 8 * q + g;
          const uint4 b = lds(xs + sl * 256 + ((ck ^ ((sl & 1) << 2)) << 4));
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            mma(acc[i][q], af[i][0][0], af[i][0][1], af[i][0][2], af[i][0][3], b.x, b.y);
            mma(acc[i][q], af[i][1][0], af[i][1][1], af[i][1][2], af[i][1][3], b.z, b.w);
          }
        }
      }
  }
  if (unit_ok) {
#pragma unroll
    for (int q = 0; q < NTC; ++q)
      if (8 * q < n) store_h_rows(acc[0][q], acc[1][q], u, p0 + 8 * q, cnt, start, h_ptr, ldo);
  }
  __syncthreads();  // every warp is done with the rings before the next item refills them
}

// MB: the CTAs an SM the launch bounds ask registers for. cuda_v10.py's default: 2 at NT 2 (its
// <= 128 registers a thread; WU x ST rings small enough at ST <= 3: 16 warps an SM, session 33
// call 3's fastest hot launch at uniform T 512), 1 above (NT 8's 64 accumulators a thread take
// ~180 registers); NT 4 builds at 2 in 116 registers without spills (not yet measured).
template <int KPAD, int WU, int NT, int ST, int MB = (NT <= 2 ? 2 : 1)>
__global__ void __launch_bounds__(32 * WU, MB)
int4_moe_hot(u64 w_ptr, u64 s_ptr, u64 x_ptr, u64 slots_ptr, u64 act_e_ptr, u64 act_start_ptr,
             u64 act_cnt_ptr, u64 n_act_ptr, u64 h_ptr, int topk, int NU, int C, int ldx,
             int k_real, int ldo, int ht, int hi, int max_items) {
  constexpr int P = 8 * NT;          // slots a pass
  constexpr int WST = 6 * 32 * 16;
  constexpr int XST = P * 256;
  static_assert(P * 16 % (32 * WU) == 0 && P * 16 >= 32 * WU,
                "the pass's activation words split evenly over the threads");
  extern __shared__ uint4 dsm[];  // [WU][ST][6][32] weights, [ST][P][16] activations, the list
  __shared__ int s_tot[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 base = (u32)__cvta_generic_to_shared(dsm);
  const u32 wring = base + warp * ST * WST + lane * 16;  // this lane's words, stage 0
  const u32 xring = base + WU * ST * WST;
  int* list = (int*)((char*)dsm + WU * ST * WST + ST * XST);
  hot_item_loop<P, NT>(act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, ht, hi, list, max_items,
                       s_tot, [=](auto ntc, int e, int start, int cnt, int p0) {
    hot_pass<KPAD, WU, NT, ST, decltype(ntc)::value>(w_ptr, s_ptr, x_ptr, (const int*)slots_ptr,
        h_ptr, topk, NU, C, ldx, k_real, ldo, e, start, cnt, p0, wring, xring);
  });
}
