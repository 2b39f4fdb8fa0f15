// int4_moe cuda_v3: the whole decode MoE in one launch (compiled after cuda_v1.cu, whose
// unit_block it runs: cuda_v3.py hands NVRTC the two files as one source).
//
// Legend: cuda_v1.cu's, plus S = T K slots (S <= SMAX), A active experts, NB1 / NB2 CTA items
// an active expert (ceil(NU / RW) per GEMM), W warps a CTA (KW1 RW1 = KW2 RW2 = W).
//
// Why one launch: at decode the four launches of cuda_v2 (router, gate/up, down, combine)
// each pay a ramp and a tail (T 1 on 384 experts: 75.6 µs of kernels, 81.2 graph-replayed,
// against a 48.5 µs floor; an EP8 rank's one expert: ~25 µs against ~6). Here
//   1. every CTA routes the S <= 64 slots itself in shared memory (the ids are ~256 bytes):
//      the sorted order, the active experts in ascending id order and the bad-token flags
//      are the router's (`_common._route_kernel`: slots grouped by expert in slot order);
//   2. CTAs take work items from a counter, all gate/up items (active expert major) before
//      all down items, so a CTA that takes a down item for expert a only waits on gate/up
//      items other running CTAs hold: no deadlock whatever the grid or the residency;
//   3. a down item issues its first weight pairs (and, with pf02, an L2 prefetch of its
//      slice: measured slower, off by default), then waits for expert a's h (a count of finished gate/up items, release / acquire at
//      gpu scope), so the wait overlaps loads;
//   4. the CTA that finishes the last down item of a unit block (its count reaches A)
//      combines those rows for every token: sum_j w[t, j] y[t K + j] in j order, as
//      `_common._combine_kernel` (no atomics on values: deterministic);
//   5. the last CTA to leave zeroes the counters for the next launch (graph replays too).
// One launch at a time a counter buffer (cuda_v3.py keeps one a device and stream).

constexpr int SMAX = 64;  // slots one CTA routes (the fused path's T K bound)

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// ctr: [0] the next work item, [1] CTAs finished, [2, 2 + SMAX) gate/up items finished an
// active expert, [2 + SMAX, 2 + SMAX + NB2) down items finished a unit block; n_ctr entries.
template <int POST, int KPAD1, int KPAD2, int W, int KW1, int KW2, int U, int MINB>
__global__ void __launch_bounds__(32 * W, MINB)
int4_moe_fused(u64 w1, u64 s1, u64 x_ptr, int ldx, int D, int NU1, int C1,
               u64 w2, u64 s2, u64 h_ptr, u64 h_lo_ptr, int ldh, int I, int NU2, int C2,
               u64 ids_ptr, int ids64, int s_it, int s_ik, u64 wt_ptr, int s_wt, int s_wk,
               u64 y_ptr, u64 out_ptr, u64 ctr_ptr, int n_ctr, int T, int topk, int E,
               int pf01, int pf1, int pf02, int pf2) {
  constexpr int RW1 = W / KW1, RW2 = W / KW2, NN = 1;
  static_assert(RW1 * KW1 == W && RW2 * KW2 == W && U >= 3 && W >= 2, "CTA shape");
  __shared__ float red[W * 2 * NN * 32 * 4];
  extern __shared__ uint4 dsm[];  // [warp][stage][6 words][32 lanes]
  __shared__ int s_id[SMAX];      // slot -> its expert id, -1: not routed here (or past S)
  __shared__ int s_first[SMAX];   // slot opens its expert (its first slot)
  __shared__ int s_slots[SMAX];   // sorted position -> slot
  __shared__ int s_ae[SMAX], s_as[SMAX], s_ac[SMAX];  // active expert: id, first position, slots
  __shared__ int s_bad[SMAX];     // token -> 1: an id outside [-1, E) or one expert twice
  __shared__ int s_nact, s_item, s_flag;
  int* ctr = (int*)ctr_ptr;
  int* done1 = ctr + 2;
  int* done2 = ctr + 2 + SMAX;
  const int tid = threadIdx.x, S = T * topk;
  if (tid == 0) {
    s_item = atomicAdd(ctr, 1);  // in flight while the CTA routes
    s_nact = 0;
  }
  for (int i = tid; i < SMAX; i += blockDim.x) {
    int id = -1, bad = 0;
    if (i < S) {
      const size_t off = (size_t)(i / topk) * s_it + (size_t)(i % topk) * s_ik;
      const long long raw = ids64 ? ((const long long*)ids_ptr)[off] : ((const int*)ids_ptr)[off];
      if (raw >= 0 && raw < E) id = (int)raw;
      else bad = raw != -1;
    }
    s_id[i] = id;
    s_first[i] = bad;  // reused below; the flag goes to s_bad after the barrier
    s_bad[i] = 0;
  }
  __syncthreads();
  int less = 0, before = 0, same = 0, dup = 0, id = -1;
  if (tid < S) {  // one thread a slot (W >= 2: 64 threads or more)
    id = s_id[tid];
    if (s_first[tid]) s_bad[tid / topk] = 1;
    if (id >= 0)
      for (int j = 0; j < S; ++j) {
        const int o = s_id[j];
        less += o >= 0 && o < id;
        before += o == id && j < tid;
        same += o == id;
        dup |= o == id && j != tid && j / topk == tid / topk;
      }
  }
  __syncthreads();
  if (tid < S) {
    if (dup) s_bad[tid / topk] = 1;
    s_first[tid] = id >= 0 && before == 0;
    if (id >= 0) s_slots[less + before] = tid;
  }
  __syncthreads();
  if (tid < S && s_first[tid]) {
    int a = 0;  // the expert's rank among the active ones: distinct ids below it
    for (int j = 0; j < S; ++j) a += s_first[j] && s_id[j] < id;
    s_ae[a] = id, s_as[a] = less, s_ac[a] = same;
    atomicAdd(&s_nact, 1);
  }
  __syncthreads();

  const int n_act = s_nact;
  const GemmArgs g1{w1, s1, x_ptr, x_ptr, h_ptr, h_lo_ptr, NU1, C1, ldx, D, I, ldh, pf01, pf1};
  const GemmArgs g2{w2, s2, h_ptr, h_lo_ptr, y_ptr, y_ptr, NU2, C2, ldh, I, D, D, pf02, pf2};
  const int NB1 = (NU1 + RW1 - 1) / RW1, NB2 = (NU2 + RW2 - 1) / RW2;
  const int n1 = n_act * NB1, total = n1 + n_act * NB2;

  // rows [r0, r1) of out for every token: the weighted sum of the token's routed slots' y
  auto combine = [&](int r0, int r1) {
    const int rows = r1 - r0;
    for (int i = tid; i < T * rows; i += blockDim.x) {
      const int t = i / rows, r = r0 + i % rows;
      float acc = 0.f;
      for (int j = 0; j < topk; ++j) {
        if (s_id[t * topk + j] < 0) continue;
        const float wj = ((const float*)wt_ptr)[(size_t)t * s_wt + (size_t)j * s_wk];
        acc += wj * __ldcg((const float*)y_ptr + (size_t)(t * topk + j) * D + r);
      }
      if (s_bad[t]) acc = __int_as_float(0x7fc00000);
      ((u16*)out_ptr)[(size_t)t * D + r] = to_bf16(acc);
    }
  };
  if (n_act == 0 && blockIdx.x == 0) combine(0, D);  // nothing routed here: zeros (NaN if bad)

  int item = s_item;
  while (item < total) {
    int nxt = 0;
    if (tid == 0) nxt = atomicAdd(ctr, 1);  // the next item, in flight while this one runs
    if (item < n1) {
      const int a = item / NB1;
      unit_block<0, POST, KPAD1, KW1, RW1, NN, U, 0, 2>(g1, s_slots, topk, s_ae[a], s_as[a], s_ac[a],
                                                     item % NB1, red, dsm, [] {});
      __threadfence();  // this thread's h stores, then the count (release by the fence + barrier)
      __syncthreads();
      if (tid == 0) atomicAdd(done1 + a, 1);
    } else {
      const int a = (item - n1) / NB2, b = (item - n1) % NB2;
      const int* ready_at = done1 + a;
      unit_block<1, POST, KPAD2, KW2, RW2, NN, U, 1, 2>(
          g2, s_slots, topk, s_ae[a], s_as[a], s_ac[a], b, red, dsm, [&] {
            while (ld_acquire(ready_at) < NB1) __nanosleep(128);
          });
      __threadfence();
      __syncthreads();
      if (tid == 0) s_flag = atomicAdd(done2 + b, 1) == n_act - 1;
      __syncthreads();
      if (s_flag) {  // the block's last expert: every slot's y rows are written
        __threadfence();
        combine(b * RW2 * 32, min(D, (b + 1) * RW2 * 32));
      }
    }
    __syncthreads();  // s_flag and s_item are reused
    if (tid == 0) s_item = nxt;
    __syncthreads();
    item = s_item;
  }

  __threadfence();
  __syncthreads();
  if (tid == 0) s_flag = atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (s_flag) {  // every other CTA has left: nobody reads the counters any more
    for (int i = tid; i < n_ctr; i += blockDim.x) ctr[i] = 0;
    __threadfence();
  }
}
