// int4_moe cuda_v24: the hot experts' gate/up GEMM as a warp-specialised tensor-core launch --
// 256 weight rows x 128 slots a CTA tile, one producer warpgroup feeding a ring of TMA bulk
// copies, two consumer warpgroups on wgmma with register-A dequant. Compiled after cuda_v1.cu,
// cuda_v10.cu and cuda_v19.cu (cuda_v24.py hands nvcc the four files as one source).
//
// Legend: cuda_v10.cu's / cuda_v19.cu's, plus TC_P = 128 slots a pass (16 n-tiles), TC_WU = 8
// consumer warps a CTA (warpgroups 1 and 2; warp w + 4 holds row unit 8 x + w: 128 gate + 128
// up rows), warpgroup 0 the producer, ST ring stages, SR = S + TC_P rows of the gathered
// activations xg [C chunks][SR][128 B].
//
// Why (session 51 call 3 / session 52 call 1, H100, skewed T 512 at WS 0, by kernel): the cold
// gate/up launch streams its experts at copy speed (1440-1514 µs), but the hot experts' gate/up
// launches take 800-930 + 230 µs of the whole GPU for ~2900 slots (~150-210 TFLOP/s; ncu:
// 36 % of DRAM, 46 % issue-active, 22 % of the warps an SM): cuda_v19's 32-slot (or 64)
// passes dequantise every weight again each pass, and its 8 warps an SM copy the activations
// 16 bytes a thread. Here a 128-slot pass dequantises each weight once for 128 slots, and one
// thread moves a stage (18 KB of weights and scales, 32 KB of activations) with 18 bulk copies.
//
// * Activations (xgather below): the pass's B tile needs, for each 64-input chunk, the 128
//   slots' rows in the swizzled K-major layout of cuda_v19.cu (16-byte word w of row r at
//   r x 128 + ((w ^ (r & 7)) << 4)). xgather writes every hot slot's row in exactly that image,
//   once a call, in logical-k order (cuda_v19's permute) and sorted-slot order: row s of chunk
//   c at xg + (c SR + s) x 128, word w at w ^ ((s - start) & 7), start the expert's first
//   sorted position. A pass starts at start + P j (P = 8 NTC, a multiple of 8), so its rows'
//   (r & 7) is (s - start) & 7 and a chunk of the stage is one contiguous bulk copy of (the
//   pass's n-tiles x 8) rows of 128 bytes. Rows past the
//   pass's slots (the next expert's, or never written) feed only columns that are never stored.
// * Weights: a consumer warp's 2 KB of words and 256 B of scales of a chunk pair are
//   contiguous in the repacked layout (cuda_v21's bulk ring): two bulk copies a warp.
// * Ring: full[st] (PW arrivals, each with its producer's byte count) and empty[st] (one arrival a
//   consumer thread). A consumer thread releases a stage once its wgmmas that read it are done:
//   pair p's stage after pair p + 1's first scale group waits (wait_group 1), the last pair's
//   after the pass's wait_group 0. Producer and consumers count the pairs they have passed
//   through the ring (q) alike: every item streams the whole K (C / 2 pairs).
// * Consumer K loop: cuda_v19's (dequant of a scale group into A registers, wgmma.fence, four
//   wgmmas gate / up x k16, one commit, wait_group 1), a scale group an iteration (not
//   unrolled: ptxas hoisted the next groups' dequant into registers), at N = 32, 64 or 128 by
//   the pass's slots (`tc_tiles`): 128 accumulators a thread at N 128. setmaxnreg moves
//   registers from the producer (24) to the consumers (240).
// * Epilogue: cuda_v10's `store_h_rows` (the D fragment of n-tile q is mma.sync's C fragment).
// Numerics: cuda_v19's (W = bf16((q - 8) s), fp32 sums inside wgmma, k16 steps in K order).

constexpr int TC_WU = 8;                 // consumer warps (row units) a CTA
constexpr int TC_P = 128;                // slots a pass
constexpr int TC_WB = 2048;              // a warp's weight words of a chunk pair
constexpr int TC_SB = 256;               // ... and its scales
constexpr int TC_XST = 2 * TC_P * 128;   // a stage's activations: 2 chunks x P rows x 128 B
constexpr int TC_STG = TC_XST + TC_WU * (TC_WB + TC_SB);  // 51200 B: 1024-aligned stages
static_assert(TC_STG % 1024 == 0, "every stage's activation atoms 1024-byte aligned");

// xg (above) from x [T, ldx] (k_real inputs): one CTA a sorted slot s, a thread a 32-input
// group (cuda_v19's 4 x 4 transpose of 4-byte pairs); only the slots of experts with more
// than ht and at most hi slots are written.
extern "C" __global__ void int4_moe_xgather(const u16* __restrict__ x, const int* __restrict__ slots,
                                            const int* __restrict__ act_start,
                                            const int* __restrict__ act_cnt,
                                            const int* __restrict__ n_act_ptr, u16* __restrict__ xg,
                                            int SR, int topk, int ldx, int k_real, int KP, int ht,
                                            int hi) {
  const int s = blockIdx.x, n_act = *n_act_ptr;
  if (n_act <= 0) return;
  int lo = 0, up = n_act - 1;  // the active expert holding s: the last with act_start <= s
  while (lo < up) {
    const int mid = (lo + up + 1) >> 1;
    if (act_start[mid] <= s) lo = mid;
    else up = mid - 1;
  }
  const int start = act_start[lo], cnt = act_cnt[lo];
  if (s >= start + cnt || cnt <= ht || cnt > hi) return;
  const u16* src_row = x + (size_t)(slots[s] / topk) * ldx;
  const int r = (s - start) & 7;
  for (int G = threadIdx.x; G < KP / 32; G += blockDim.x) {
    const int k0 = 32 * G;
    u32 v[4][4];  // [input word t][pair m]
    xperm_read(src_row + k0, k0, k_real, v);
    uint4* dst = (uint4*)(xg + ((size_t)(G >> 1) * SR + s) * 64);
#pragma unroll
    for (int m = 0; m < 4; ++m) dst[(4 * (G & 1) + m) ^ r] = make_uint4(v[0][m], v[1][m], v[2][m], v[3][m]);
  }
}

__device__ __forceinline__ uint2 lds64(u32 a) {
  uint2 r;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(a));
  return r;
}
__device__ __forceinline__ u32 lds32(u32 a) {
  u32 r;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a));
  return r;
}
// dq_group (cuda_v1.cu) on one group's two weight words (its k16 steps) and its scale word
__device__ __forceinline__ void dq_words(uint2 q2, u32 sw, u32 (&af)[2][4]) {
  const u32 sg = __byte_perm(sw, 0, 0x1010), sg8 = __byte_perm(sw, 0, 0x3232);
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const u32 q = jj ? q2.y : q2.x;
    af[jj][0] = dq(q, sg), af[jj][1] = dq(q >> 4, sg8);
    af[jj][2] = dq(q >> 8, sg), af[jj][3] = dq(q >> 12, sg8);
  }
}

// setmaxnreg: the launch gives each of the 384 threads 168 registers (__launch_bounds__(384,
// 1)); .inc blocks until the CTA's pool holds what it asks, and the pool is what the other
// warpgroups gave back with .dec: the producer's 128 x (168 - 24) must cover the consumers'
// 256 x (240 - 168), exactly as here (at 32 / 240 the consumers waited forever: session 52).
constexpr int TC_LAUNCH_REGS = 65536 / 384 / 8 * 8, TC_PRODUCER_REGS = 24, TC_CONSUMER_REGS = 240;
static_assert(128 * (TC_LAUNCH_REGS - TC_PRODUCER_REGS) >= 256 * (TC_CONSUMER_REGS - TC_LAUNCH_REGS),
              "the consumers' setmaxnreg.inc is covered by the producer's .dec");

template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(R));
}

// A producer's pass (one thread of each of the PW producer warps, pw its warp): the C / 2
// chunk pairs of item (e, start + p0, 8 NTC rows) into the ring from pair count q0 on. Warp pw
// copies the weights and scales of consumer warps [pw, pw + 1) x TC_WU / PW, warp 0 also the
// activations; each arrives on a stage's full barrier (PW arrivals) with its own bytes.
template <int PW>
__device__ __forceinline__ void tc_produce(u64 w_ptr, u64 s_ptr, u64 xg_ptr, int NU, int C, int SR,
                                           int ST, u32 ring, u32 full, u32 empty, int ntc, int e,
                                           int row0, u32 q0, int pw) {
  static_assert(TC_WU % PW == 0, "the consumer warps' copies split evenly over the producers");
  constexpr int WN = TC_WU / PW;  // the consumer warps a producer copies for
  const int NP = C / 2;
  const u32 xbytes = 8 * ntc * 128;
  const char* xg = (const char*)xg_ptr + (size_t)row0 * 128;
  for (int p = 0; p < NP; ++p) {
    const u32 q = q0 + p, st = q % ST, k = q / ST;
    if (k > 0) mbar_wait(empty + 8 * st, (k - 1) & 1);  // its last use's wgmmas are done
    const u32 stage = ring + st * TC_STG, fb = full + 8 * st;
    mbar_expect_tx(fb, (pw == 0 ? 2 * xbytes : 0) + WN * (TC_WB + TC_SB));
    if (pw == 0) {
#pragma unroll
      for (int ch = 0; ch < 2; ++ch)
        bulk_g2s(stage + ch * (TC_P * 128), xg + (size_t)(2 * p + ch) * SR * 128, xbytes, fb);
    }
#pragma unroll 1
    for (int w = pw * WN; w < (pw + 1) * WN; ++w) {  // (24 registers: nothing held across warps)
      const int u = blockIdx.x * TC_WU + w;
      const size_t unit = (size_t)e * NU + (u < NU ? u : 0);  // a padding warp streams unit 0
      bulk_g2s(stage + TC_XST + w * TC_WB, (const uint4*)w_ptr + (unit * C + 2 * p) * 64, TC_WB,
               fb);
      bulk_g2s(stage + TC_XST + TC_WU * TC_WB + w * TC_SB,
               (const uint4*)s_ptr + (unit * (C / 2) + p) * 16, TC_SB, fb);
    }
  }
}

// A consumer warp's pass of n = min(8 NTC, cnt - p0) slots on NTC n-tiles (acc's first NTC),
// unit u, from pair count q0 on; every consumer thread calls it.
template <int ST, int NTC>
__device__ __forceinline__ void tc_consume(float (&acc)[2][16][4], u64 h_ptr, int NU, int C,
                                           int ldo, u32 ring, u32 full, u32 empty, int cw,
                                           int start, int cnt, int p0, u32 q0) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const int NP = C / 2, u = blockIdx.x * TC_WU + cw, n = min(8 * NTC, cnt - p0);
  // every consumer thread arrives: a lane-0 branch between the wgmmas made ptxas serialise
  // them (C7513)
  auto release = [&](u32 q) { mbar_arrive(empty + 8 * (q % ST)); };
  for (int p = 0; p < NP; ++p) {
    const u32 q = q0 + p, st = q % ST;
    mbar_wait(full + 8 * st, (q / ST) & 1);  // pair p's bytes have landed
    const u32 stage = ring + st * TC_STG;
    const u32 wsrc = stage + TC_XST + cw * TC_WB + lane * 16;
    const u32 ssrc = stage + TC_XST + TC_WU * TC_WB + cw * TC_SB + g * 16;
    // a scale group: its words and scales read right before its dequant (not the pair's at
    // once: fewer registers beside the 128 accumulators), wgmma.fence, four wgmmas, commit,
    // wait_group 1 (the group before it is done)
    auto group = [&](int G, u32 (&af)[2][2][4]) {  // G = 2 ch + hf of the pair
      const int ch = G >> 1, hf = G & 1;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint2 wq = lds64(wsrc + (ch * 2 + i) * 512 + 8 * hf);  // words 2 hf, 2 hf + 1
        dq_words(wq, lds32(ssrc + i * 128 + 4 * G), af[i]);
      }
      wg_fence();
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const u32 d = desc_lo(stage + ch * (TC_P * 128) + (2 * hf + jj) * 32);
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wgmma_rs<8 * NTC>(&acc[i][0][0], af[i][jj], d, (p | G | jj) != 0);
      }
      wg_commit();
      wg_wait<1>();
      if (G == 0 && p > 0) release(q - 1);  // pair p - 1's wgmmas are done
    };
    // Two A buffers, alternating: wait_group 1 leaves a group's wgmmas in flight while the next
    // group dequantises, and a wgmma reads its A registers until it is done. With one buffer in
    // a rolled loop the next group's dequant overwrote them (session 53: wrong sums at N 64 /
    // 128, right under compute-sanitizer, which slows the issue). ptxas kept cuda_v19's
    // unrolled groups' registers apart but not around this loop's back edge, so the buffers are
    // two variables of one trip (the build test's `_a_register_hazards` checks the SASS).
#pragma unroll 1
    for (int G = 0; G < 4; G += 2) {
      u32 af0[2][2][4], af1[2][2][4];  // [tile][k16 step of the group][A register]
      group(G, af0);
      group(G + 1, af1);
    }
  }
  wg_wait<0>();
  release(q0 + NP - 1);
  if (u < NU) {
#pragma unroll
    for (int qn = 0; qn < NTC; ++qn)
      if (8 * qn < n) store_h_rows(acc[0][qn], acc[1][qn], u, p0 + 8 * qn, cnt, start, h_ptr, ldo);
  }
}

// The n-tiles a pass of min(8 NTC, left) slots runs on: the fewest of 4, 8, 16 (up to NTC) that
// hold it. The consumers' instances share one accumulator array (declared by the caller): with
// an array each, ptxas kept them apart and serialised the wgmmas at 240 registers (C7512).
template <int NTC>
__device__ __forceinline__ int tc_tiles(int left) {
  const int nt = (min(8 * NTC, left) + 7) >> 3;
  return nt <= 4 ? 4 : nt <= 8 ? 8 : 16;
}

// The launch body (cuda_v24.py wraps it in an extern "C" kernel a (ST, NTC), with
// __launch_bounds__(384, 1)). Grid (ceil(NU / 8), Y): CTA column y takes the items y, y + Y, ...
// (Y / 2 columns past TYH items a column where TYH > 0) of hot_items' list (experts of more
// than ht and at most hi slots, passes of P = 8 NTC slots, each on `tc_tiles`' n-tiles). Dynamic shared memory: 1 KB of alignment slack, the ring
// [ST][TC_STG], the item list.
template <int ST, int NTC, int PW = 1, int TYH = 0>
__device__ __forceinline__ void hot_tc_body(u64 w_ptr, u64 s_ptr, u64 xg_ptr, u64 act_e_ptr,
                                            u64 act_start_ptr, u64 act_cnt_ptr, u64 n_act_ptr,
                                            u64 h_ptr, int NU, int C, int SR, int ldo, int ht,
                                            int hi, int max_items) {
  constexpr int P = 8 * NTC;
  static_assert(P <= TC_P, "a pass within the stage's activation rows");
  extern __shared__ uint4 dsm[];
  __shared__ int s_tot[32];
  __shared__ alignas(8) u64 bars[2 * ST];  // full [ST], then empty [ST]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 raw = (u32)__cvta_generic_to_shared(dsm);
  const u32 ring = (raw + 1023) & ~1023u;
  int* list = (int*)((char*)dsm + (ring - raw) + ST * TC_STG);
  const u32 full = (u32)__cvta_generic_to_shared(bars), empty = full + 8 * ST;
  if (threadIdx.x == 0) {
    for (int st = 0; st < ST; ++st) {
      mbar_init(full + 8 * st, PW);
      mbar_init(empty + 8 * st, 32 * TC_WU);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // (hot_items' CTA barriers order the initialisation before any wait)
  const int n_items = hot_items<P>((const int*)act_cnt_ptr, *(const int*)n_act_ptr, ht, hi, list,
                                   max_items, s_tot);
  // an item's (expert, first sorted position, slot count, first slot of the pass)
  auto item = [&](int it, int& e, int& start, int& cnt, int& p0) {
    const int a = list[it] >> 16;
    p0 = (list[it] & 0xFFFF) * P;
    e = ((const int*)act_e_ptr)[a], start = ((const int*)act_start_ptr)[a];
    cnt = ((const int*)act_cnt_ptr)[a];
  };
  // TYH > 0 (cuda_v26): past TYH items a column only half of the launch's columns run (the
  // others exit here, whole CTAs) and leave their SMs to the cold gate/up launch beside it
  int cols = gridDim.y;
  if constexpr (TYH > 0) {
    if (n_items > TYH * cols) cols = max(1, cols / 2);
    if (blockIdx.y >= cols) return;
  }
  u32 q = 0;  // chunk pairs this CTA has passed through the ring (both roles count alike)
  if (warp < 4) {  // the producer warpgroup: one thread of each of its first PW warps copies
    static_assert(PW >= 1 && PW <= 4, "producer warps within the producer warpgroup");
    setmaxnreg_dec<TC_PRODUCER_REGS>();
    if (warp < PW && lane == 0) {
      for (int it = blockIdx.y; it < n_items; it += cols, q += C / 2) {
        int e, start, cnt, p0;
        item(it, e, start, cnt, p0);
        tc_produce<PW>(w_ptr, s_ptr, xg_ptr, NU, C, SR, ST, ring, full, empty,
                       tc_tiles<NTC>(cnt - p0), e, start + p0, q, PW == 1 ? 0 : warp);
      }
    }
  } else {  // the consumer warpgroups
    setmaxnreg_inc<TC_CONSUMER_REGS>();
    for (int it = blockIdx.y; it < n_items; it += cols, q += C / 2) {  // CTA-uniform
      int e, start, cnt, p0;
      item(it, e, start, cnt, p0);
      float acc[2][16][4];  // every instance's accumulators: written first by the pass's
                            // first wgmmas (acc_in 0)
      const int ntc = tc_tiles<NTC>(cnt - p0), cw = warp - 4;
      if (ntc == 4) {
        tc_consume<ST, 4>(acc, h_ptr, NU, C, ldo, ring, full, empty, cw, start, cnt, p0, q);
      } else if constexpr (NTC >= 8) {
        if (ntc == 8) tc_consume<ST, 8>(acc, h_ptr, NU, C, ldo, ring, full, empty, cw, start, cnt, p0, q);
        else if constexpr (NTC >= 16)
          tc_consume<ST, 16>(acc, h_ptr, NU, C, ldo, ring, full, empty, cw, start, cnt, p0, q);
      }
    }
  }
}
