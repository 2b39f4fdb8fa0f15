"""tree_mla kernels: absorbed-MLA verify attention with an ancestor bitmask (README.md in this
folder has the design, the split policy and the version log).

Versions, each with the reference's signature and outputs (o_lat q.dtype, lse fp32):
    triton_v1  three launches: mask-free split-KV prefix pass (heads x rows in M), masked tree
               block, LSE combine
    triton_v2  the tree block folded into the last prefix split; one-split requests write
               o_lat/lse directly, empty split programs exit at once, combine only where a
               request has 2+ splits (v1's split policy)
    triton_v2_split128  triton_v2 with splits of >= 128 keys (more, shorter programs at small P)
    triton_v3  triton_v2 with TMA prefix tiles (two bulk copies a tile instead of 18 cp.async a
               thread; no register spills in the prefix loop), short prefixes in the masked loop
    triton_v4  triton_v3 under a policy of short splits at short contexts (256 keys up to
               P = 2048) and up to 32 splits past it, the tree in its own part there, and the
               combine launched as a programmatic dependent (PDL), Q by TMA
    triton_v4_split512  triton_v4 with v3's 512-key splits up to P = 2048 (the control for
               the short splits' partial traffic where M is large)
    triton_v5  position-invariant (the exactness variant): one node's heads a program, its
               prefix + ancestors as one virtual key sequence in 64-key tiles, splits by the
               row's own key count: bitwise AR == DDTree
    triton_v6  triton_v5's invariance with TMA for the tiles wholly inside the prefix (one tile
               function for both loads) and v4's short splits chosen by the row's key count
    triton_v7  triton_v4's kernels under a policy by head count and context: below 32 heads
               128-key splits, up to 64 of them (a TP8 rank's small verify fills the GPU)
    triton_v8  triton_v7 with a combine that loads its parts 16 at a time (one barrier a chunk,
               not a load latency a part) in 32-column blocks; a fixed but different merge tree
    gluon_v9   triton_v4's cascade with the attention kernel in Gluon: the two warpgroups split
               the score tile by keys (no duplicate QK^T), K in a 2-slot TMA ring (sm_90 only)
    gluon_v10  gluon_v9 with P handed to the PV wgmma through its own shared-memory buffer (one
               CTA barrier a tile instead of the conversion's four)
    gluon_v10_by_heads  gluon_v10 under triton_v7's policy by head count (short splits below
               32 heads)
    gluon_v11  the seesaw: warpgroup 0 scores even tiles, warpgroup 1 odd ones (whole m64n64
               S each), P and the running max passed through shared memory, so one
               warpgroup's softmax runs under the other's MMAs (warp-specialized Gluon)
    gluon_v11_long  gluon_v11 with >= 1024-key splits past P = 2048 at >= 32 heads
    gluon_v12  gluon_v11 with each K half in 64-column chunks under their own mbarriers (a
               QK^T starts on a half's first chunk); 1.11x v11's time on the H200 (session 14)
    gluon_v13  gluon_v11 with a partition barrier before each rendezvous that publishes
               shared memory to the other warpgroup (what racecheck needs to see the handoff)
    gluon_v13_long  gluon_v13 under gluon_v11_long's policy
    gluon_v14  gluon_v13 with each partition computing its own geometry (nothing computed is
               stored to shared memory at the warp-specialization fork)
    gluon_v14_long  gluon_v14 under gluon_v11_long's policy
    triton_v15 triton_v4's cascade with the attention MMAs transposed ("swap AB"): 64 keys on
               the MMA's M dimension, 16 query rows on its N, for few-row (8-head) decode
    triton_v16 triton_v15's attention under triton_v7's policy by head count (more, shorter
               parts below 32 heads) with triton_v8's chunked combine
    triton_v17 triton_v7 with a one-round merge (v8's kernel: 128 parts a chunk, 8 x 8 tiles)
    gluon_v18  gluon_v13's attention under triton_v7's policy with triton_v17's merge
               (H200: faster at N 1 and N 9 from P 8192, slower from N 17 and 2.6x at B 32)
    gluon_v19  gluon_v13 with O times one reciprocal of l a row in the epilogue (no
               per-value division: 752 fewer SASS, run once a CTA; H200: 1.5-4.3 % faster
               than gluon_v13 at the 8- and 64-head shapes benched; BEST from session 17)
    gluon_v20  ENGINE-ONLY: gluon_v18's short parts (with v19's epilogue) below 32 heads where
               their programs fit one wave of the GPU, gluon_v19 otherwise: the split
               follows the launch's shape, so it is not batch-invariant (ENGINE below; H200:
               EP8 C 1 AR step 6.56 vs 7.22 ms, C 1 DDTree-16 15.49 vs 15.82)
    gluon_v21  ENGINE-ONLY: gluon_v20 with triton_v15's transposed attention under 64-key
               parts (v17's merge) where a request's rows fit one 16-row block and the
               programs one wave (8-head decode at small batch)
    gluon_v22  ENGINE-ONLY: gluon_v21 with the short-part launch's merge at 8 rows x 32
               columns a program, one round of up to 64 parts (v17's: 8 x 8, 128)
    gluon_v23  ENGINE-ONLY: gluon_v22 with the transposed decode launch's merge at 4 rows x
               32 columns a program, one round of 128 parts (H200 sweep: 0.5-3.7 µs faster
               at every 8-head decode shape swept)
    gluon_v24  ENGINE-ONLY: gluon_v23 with one-wave long parts for 8-head decode of 5-8
               requests (N H <= 8, S = SMs // B - 1 >= 15 prefix parts of whole 64-key
               tiles, v17's merge; H200: B 8 N 1 P 4096 21.7 vs 24.7 µs; the rule lost at
               B 16 / 32 and at 17 rows, so it stops there)
    triton_v26 triton_v4 with the LSE merge in the attention launch: the row block's last part
               to finish (a ticket counter) merges the partials with the combine's arithmetic
               (v4's bits), from L2, and no combine launch
    gluon_v25  gluon_v19 under gluon_v11_long's policy (>= 1024-key splits past P = 2048 at
               >= 32 heads: fewer fp32 partials for a 64-head verify, fewer programs for
               N = 1; session 14 measured the trade on gluon_v13's kernel)

BEST (gluon_v19) needs an sm_90 GPU; PORTABLE (triton_v4) is what the presets select elsewhere
(workbench.ops.registry.PORTABLE). Importing this package imports no Triton; `register()` adds
the variants to the op registry.
"""

from __future__ import annotations

_MOD = "workbench.kernels.tree_mla"
# the version the presets ("optimized", "engine") select on an sm_90 GPU: gluon_v19 (session 17,
# H200: gluon_v13's kernel with a reciprocal epilogue, 1.5-4.3 % faster at the 7 shapes benched,
# 45 GPU tests, the trained and `small` token-exact suites pass). gluon_v13 before it (session 14,
# H200: gluon_v11's seesaw, faster than gluon_v10 at 26 of 28 REAL shapes in session 13, with
# the partition barrier that lets racecheck follow its handoffs: 90 GPU tests, memcheck clean,
# racecheck's remaining reports all on Triton's warp-specialization fork and join (README
# "Design (v13)"). gluon_v10 before it (racecheck clean, 0.75-1.03x slower)
BEST = "gluon_v19"
# what the presets select where BEST cannot run (Gluon has no interpreter: the CPU tests, the
# CPU demo and notebooks): the fastest version that runs everywhere
PORTABLE = "triton_v4"
# the "engine" preset's version (kernels/__init__.py): a serving engine picks its splits by the
# launch's shape, and that preset is batch-variant anyway (cuBLAS split-K by row count).
# gluon_v22 from session 19 (H200, EP8 emulation: C 1 AR 6.08 ms of kernels against gluon_v20's
# 6.56 and gluon_v19's 7.22, the decode attention 6.8 against 11.6 and 22.3 µs a layer (v21's
# launch); C 1 DDTree-16 15.47 against gluon_v21's 15.74, the merges 527 against 782 µs a step).
# gluon_v24 from session 20 (H200): gluon_v23's decode merge (4 x 32 tiles: 0.4-3.7 µs faster at
# every 8-head decode shape swept, call 1) and the one-wave parts at B 5-8 decode (the EP8 C 8
# AR step's attention kernels 1339 against 1519 µs, call 4); every launch bitwise the one it
# names (65 GPU cases)
ENGINE = "gluon_v24"
# batch/position-invariant (keys grouped by the row's own key sequence): the "invariant"
# preset, DDTree bitwise AR on the H200 (v5 session 4; v6, 1.1-3x faster, session 5)
INVARIANT = "triton_v6"
VARIANTS: dict[str, dict[str, str]] = {
    "tree_mla": {
        "triton_v1": f"{_MOD}.triton_v1:tree_mla_triton",
        "triton_v2": f"{_MOD}.triton_v2:tree_mla_triton",
        "triton_v2_split128": f"{_MOD}.triton_v2:tree_mla_triton_split128",
        "triton_v3": f"{_MOD}.triton_v3:tree_mla_triton",
        "triton_v4": f"{_MOD}.triton_v4:tree_mla_triton",
        "triton_v4_split512": f"{_MOD}.triton_v4:tree_mla_triton_split512",
        "triton_v5": f"{_MOD}.triton_v5:tree_mla_triton",
        "triton_v6": f"{_MOD}.triton_v6:tree_mla_triton",
        "triton_v7": f"{_MOD}.triton_v7:tree_mla_triton",
        "triton_v8": f"{_MOD}.triton_v8:tree_mla_triton",
        "gluon_v9": f"{_MOD}.gluon_v9:tree_mla_gluon",
        "gluon_v10": f"{_MOD}.gluon_v10:tree_mla_gluon",
        "gluon_v10_by_heads": f"{_MOD}.gluon_v10:tree_mla_gluon_by_heads",
        "gluon_v11": f"{_MOD}.gluon_v11:tree_mla_gluon",
        "gluon_v11_long": f"{_MOD}.gluon_v11:tree_mla_gluon_long",
        "gluon_v12": f"{_MOD}.gluon_v12:tree_mla_gluon",
        "gluon_v13": f"{_MOD}.gluon_v13:tree_mla_gluon",
        "gluon_v13_long": f"{_MOD}.gluon_v13:tree_mla_gluon_long",
        "gluon_v14": f"{_MOD}.gluon_v14:tree_mla_gluon",
        "gluon_v14_long": f"{_MOD}.gluon_v14:tree_mla_gluon_long",
        "triton_v15": f"{_MOD}.triton_v15:tree_mla_triton",
        "triton_v16": f"{_MOD}.triton_v16:tree_mla_triton",
        "triton_v17": f"{_MOD}.triton_v17:tree_mla_triton",
        "gluon_v18": f"{_MOD}.gluon_v18:tree_mla_gluon",
        "gluon_v19": f"{_MOD}.gluon_v19:tree_mla_gluon",
        "gluon_v20": f"{_MOD}.gluon_v20:tree_mla_gluon",
        "gluon_v21": f"{_MOD}.gluon_v21:tree_mla_gluon",
        "gluon_v22": f"{_MOD}.gluon_v22:tree_mla_gluon",
        "gluon_v23": f"{_MOD}.gluon_v23:tree_mla_gluon",
        "gluon_v24": f"{_MOD}.gluon_v24:tree_mla_gluon",
        "gluon_v25": f"{_MOD}.gluon_v25:tree_mla_gluon",
        "triton_v26": f"{_MOD}.triton_v26:tree_mla_triton",
    },
}
DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("tree_mla", "triton_v1"): "Triton cascade: split-KV prefix (heads x rows in M, no mask), "
    "tree block under the ancestor bits + LSE merge",
    ("tree_mla", "triton_v2"): "Triton: tree block folded into the last prefix split (one-split "
    "requests finish in one launch), empty splits exit early, combine by the real split count",
    ("tree_mla", "triton_v2_split128"): "triton_v2 with prefix splits of >= 128 keys: more, "
    "shorter programs at small contexts (P-only policy, batch invariant)",
    ("tree_mla", "triton_v3"): "triton_v2 with the prefix K tiles loaded by TMA (host-built "
    "descriptors, each split's last tile shifted back to end inside the prefix: no row mask, "
    "no per-thread cp.async), short prefixes through the masked tree loop",
    ("tree_mla", "triton_v4"): "triton_v3 with P-only splits of 256 keys up to P = 2048 and up "
    "to 32 splits past it (tree block in a part of its own there), combine launched with PDL, "
    "Q by TMA",
    ("tree_mla", "triton_v4_split512"): "triton_v4 with 512-key splits up to P = 2048 (v3's "
    "partition there: fewer partials where M is large)",
    ("tree_mla", "triton_v5"): "position-invariant: a row's prefix + ancestors as one key "
    "sequence (gathered 64-key tiles, splits by the row's own key count), so a DDTree row "
    "equals plain AR decode of the same token bit for bit",
    ("tree_mla", "triton_v6"): "triton_v5 (position-invariant) with the tiles wholly inside the "
    "prefix loaded by TMA and the rest gathered, both through one tile function, v4's 256-key "
    "splits chosen by the row's own key count, PDL combine",
    ("tree_mla", "triton_v7"): "triton_v4's kernels with a split policy by head count and "
    "context: below 32 heads 128-key splits (up to 64 past P = 2048), so a small TP8 verify "
    "fills the GPU; v4's policy at 64 heads",
    ("tree_mla", "triton_v8"): "triton_v7 with a combine that is not a chain of one load per "
    "part: all lse at once, 16 parts a [16, 16, 32] tile load, 32-column blocks (4x v4's "
    "programs); a fixed merge tree per request (batch invariant, not v7's bits)",
    ("tree_mla", "gluon_v9"): ("Gluon attention kernel under v4's policy and combine: each "
                               "warpgroup scores half the keys of a tile and owns half the "
                               "value columns (no duplicate QK^T), K tiles in a 2-slot TMA "
                               "ring; bf16/fp16 on sm_90", ("sm90", "triton")),
    ("tree_mla", "gluon_v10"): ("gluon_v9 with P stored by each warpgroup into a [64, 64] "
                                "shared-memory buffer read by the PV wgmma (one barrier a "
                                "tile, not the layout conversion's four)", ("sm90", "triton")),
    ("tree_mla", "gluon_v10_by_heads"): ("gluon_v10 under triton_v7's policy by head count: "
                                         "below 32 heads 128-key splits (up to 64), so an EP8 "
                                         "rank's small verify fills the GPU",
                                         ("sm90", "triton")),
    ("tree_mla", "gluon_v11"): ("the seesaw (FlashMLA's schedule) under v4's policy and "
                                "combine: warpgroups score alternate whole tiles and exchange "
                                "P and the running max through shared memory, K slots refilled "
                                "by halves as each is read; bf16/fp16 on sm_90",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v11_long"): ("gluon_v11 with >= 1024-key splits past P = 2048 at 32 "
                                     "heads or more (at most 8: fewer fp32 partials for a "
                                     "64-head verify)", ("sm90", "triton")),
    ("tree_mla", "gluon_v12"): ("gluon_v11 with each K half in 64-column chunks, each under "
                                "its own mbarrier, so a QK^T starts on the first chunk "
                                "(1.11x v11's time on the H200: a measured negative)",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v13"): ("gluon_v11 with a partition barrier before each rendezvous "
                                "that publishes shared memory to the other warpgroup (without "
                                "it racecheck reports the handoff of the wgmma row vectors)",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v13_long"): ("gluon_v13 under gluon_v11_long's policy (>= 1024-key "
                                     "splits past P = 2048 at 32 heads or more)",
                                     ("sm90", "triton")),
    ("tree_mla", "gluon_v14"): ("gluon_v13 with each partition computing its own geometry "
                                "from the kernel's arguments: nothing computed crosses the "
                                "warp-specialization fork through shared memory; v13's bits",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v14_long"): ("gluon_v14 under gluon_v11_long's policy",
                                     ("sm90", "triton")),
    ("tree_mla", "triton_v15"): "triton_v4's cascade with the attention MMAs transposed for "
    "few query rows: 64 keys on the MMA's M dimension, 16 query rows on its N (S^T = K Q^T, "
    "O^T += V^T P^T): an 8-head decode's 8 rows no longer padded to 64",
    ("tree_mla", "triton_v16"): "triton_v15's transposed attention under triton_v7's policy "
    "by head count (below 32 heads 128-key splits, up to 64) with triton_v8's chunked "
    "combine (16 parts a load): short parts where a part's length sets the attention's time",
    ("tree_mla", "triton_v17"): "triton_v7 (v4's attention, the policy by head count) with a "
    "one-round merge: v8's combine kernel at 128 parts a chunk over 8 x 8 tiles, m from the "
    "same lse load (64 programs a row block)",
    ("tree_mla", "gluon_v18"): ("gluon_v13's attention under triton_v7's policy by head count "
                                "(128-key parts below 32 heads) with triton_v17's one-round "
                                "merge", ("sm90", "triton")),
    ("tree_mla", "gluon_v19"): ("gluon_v13 with an epilogue multiplying O by one reciprocal "
                                "of l a row instead of a division a value: 6207 SASS instead "
                                "of 6959, the part a short part's CTA fetches cold",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v20"): ("ENGINE-ONLY: gluon_v18's 128-key parts and one-round merge "
                                "with gluon_v19's epilogue below 32 heads where their programs "
                                "fit one wave of the GPU, gluon_v19 otherwise (the split "
                                "follows the launch's shape: not batch-invariant)",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v21"): ("ENGINE-ONLY: gluon_v20 plus triton_v15's transposed attention "
                                "under 64-key parts with triton_v17's merge where N H <= 16 and "
                                "the programs fit one wave (8-head decode at small batch)",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v22"): ("ENGINE-ONLY: gluon_v21 with its short-part launch merged on 8 "
                                "rows x 32 columns a program, one round of <= 64 parts "
                                "(triton_v8's kernel; v17's tile past 64 parts)",
                                ("sm90", "triton")),
    ("tree_mla", "gluon_v23"): ("ENGINE-ONLY: gluon_v22 with its transposed decode launch "
                                "merged on 4 rows x 32 columns a program, one round of 128 "
                                "parts (triton_v8's kernel)", ("sm90", "triton")),
    ("tree_mla", "gluon_v24"): ("ENGINE-ONLY: gluon_v23 plus one-wave long parts for decode "
                                "rows (N H <= 8) of 5-8 requests, where gluon_v23 runs "
                                "gluon_v19 (S = SMs // B - 1 >= 15 prefix parts of 64-key "
                                "tiles, triton_v17's merge)", ("sm90", "triton")),
    ("tree_mla", "gluon_v25"): ("gluon_v19 under gluon_v11_long's policy (>= 1024-key splits, "
                                "at most 8, past P = 2048 at 32 heads or more; gluon_v19 "
                                "below 32 heads)", ("sm90", "triton")),
    ("tree_mla", "triton_v26"): "triton_v4 with the LSE merge in the attention launch: each part "
    "takes a ticket on its row block's counter, the last merges the block's partials in part "
    "order with the combine's arithmetic (v4's bits), reading them from L2; no combine launch",
}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
