"""Vocab-parallel heads: distributed argmax, Gumbel sampling and log-softmax top-K, all with
GLOBAL token ids, and the drafter wrapper that uses them.

Rank r holds logits for ids [vocab_start, vocab_start + V/world). Ties resolve to the lowest
global id everywhere, as torch.argmax and reference/tree_build.topk_logprobs (stable sort) do:
candidates are concatenated in rank order and compared with stable sorts / first-max.

`DistDrafter` is the REPLICATED drafter; only its LM head (the target's, V x D: 2.35 GB at
K2.6, the largest drafter-side weight) is vocab-parallel. Why: replicated layers need no
collective and give each rank the same draft as the single-process loop bit for bit. The
price at K2.6 size: the DFlash layers and fc (~7 GB bf16) are read whole by every rank on
every draft, ~1.6 ms at 4.3 TB/s, against ~0.2 ms plus two all-reduces a drafter layer under
TP8: drafter.py's `TPDistDrafter` (drafter_layout="tp"; `emulate --drafter-layout` times both).
Legend: B batch, L draft depth, k candidates per depth, V vocab (local: V/world).
"""

from __future__ import annotations

import torch

from workbench import ops
from workbench.kernels.dense.torch_bf16 import stable_topk as stable_topk_ids

from .comm import Comm


def dist_argmax(local: torch.Tensor, vocab_start: int, comm: Comm) -> torch.Tensor:
    """local [..., V/world] -> global argmax ids [...] int64, lowest id among equal maxima.

    One all-gather of (value, id) pairs as float64 (exact for fp32 values and ids < 2^53)."""
    v, i = local.max(-1)  # first maximum within the shard
    pair = torch.stack([v.double(), (i + vocab_start).double()], -1)  # [..., 2]
    allp = comm.all_gather_cat(pair.unsqueeze(-2), -2)  # [..., world, 2] in rank order
    r = allp[..., 0].argmax(-1, keepdim=True)  # first max = lowest rank = lowest id
    return allp[..., 1].gather(-1, r).squeeze(-1).long()


def dist_sample(local: torch.Tensor, vocab_start: int, temperature: float,
                generator: torch.Generator, comm: Comm) -> torch.Tensor:
    """One draw per row from softmax(logits / T) over the whole vocab: Gumbel-max, with each
    rank's noise from its own generator (seed it per rank), so no logits move.

    argmax_v (l_v / T + G_v) with G iid Gumbel(0, 1) is distributed as softmax(l / T)."""
    if temperature <= 0:
        return dist_argmax(local, vocab_start, comm)
    u = torch.rand(local.shape, generator=generator, device=local.device, dtype=torch.float64)
    g = -torch.log(-torch.log(u.clamp_min(1e-300)))
    return dist_argmax(local.double() / temperature + g, vocab_start, comm)


def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of `torch.sort(x, -1, descending=True, stable=True)` (values, indices), x
    fp32 [..., n], 1 <= k <= n <= 2^31: the router's stable top-k (kernels/dense torch_bf16
    `stable_topk`: ONE torch.topk over unique int64 keys, the value's order-preserving bits
    then n - 1 - index) and the values gathered from x (not decoded).

    Why: the vocab-parallel draft head sorted its whole shard to keep k of it: at K2.6 a
    [B, L, 20480] radix sort, 69 µs of the EP8 rank's C 1 DDTree-16 step and 128 µs at C 8
    (H200, session 58 call 1's glue table), for 8 candidates a row. The keys are distinct for
    every element, ordered by value and then by LOWER index first, so topk's unspecified tie
    order cannot show and the result is the stable sort's bit for bit; zeros canonicalised
    (+0.0 for -0.0, which the sort treats as equal). NaN: the sort ranks every NaN first; here
    only a positive-sign NaN is, a negative-sign one last (a NaN log-prob is a poisoned input
    either way)."""
    idx = stable_topk_ids(x, k)
    return x.gather(-1, idx), idx


def dist_topk_logprobs(local: torch.Tensor, vocab_start: int, k: int, comm: Comm,
                       shard_topk=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Vocab-parallel `topk_logprobs` (ddtree.md §2.1): local [B, L, V/world] fp32 ->
    (logprobs fp32 [B, L, k], global ids int64 [B, L, k]), sorted descending, k <= V.

    1. each rank: shard max m_r and sum_r exp(x - m_r); one all-gather -> global
       logZ = M + log(sum_r s_r exp(m_r - M))  (online-softmax merge, one collective);
    2. each rank: its top-k of (x - M) - log S (torch's log_softmax rounding order), global ids
       (`stable_topk`: a stable sort's first k, without sorting the shard; or
       shard_topk(local [R, V/w], M [R], log S [R], k) with the same bits, a drafter
       version's kernel: kernels/drafter HEAD_TOPK, up to its MAX_K);
    3. one all-gather of world*k candidates -> stable sort -> top-k (with shard_topk: its
       stable top-k of the candidates' fp32 values, M = log S = 0, exact: the same bits but
       for a negative-sign NaN, which the sort ranks first and stable_topk last).
    """
    local = local.float()
    m = local.amax(-1, keepdim=True)  # [B, L, 1]
    s = torch.exp(local - m).sum(-1, keepdim=True)
    ms = comm.all_gather_cat(torch.cat([m, s], -1).unsqueeze(-2), -2)  # [B, L, world, 2]
    M = ms[..., 0].amax(-1, keepdim=True)  # [B, L, 1]
    S = (ms[..., 1] * torch.exp(ms[..., 0] - M)).sum(-1, keepdim=True)
    log_s = torch.log(S)
    B, L, Vl = local.shape
    kl = min(k, Vl)
    kernel = shard_topk is not None and kl <= shard_topk.MAX_K  # the kernel's k range (its doc)
    if kernel:
        vals, idx = shard_topk(local.reshape(B * L, Vl), M.reshape(-1), log_s.reshape(-1), kl)
        vals, idx = vals.view(B, L, kl), idx.view(B, L, kl)
    else:
        vals, idx = stable_topk((local - M) - log_s, kl)
    cand = torch.stack([vals.double(), (idx + vocab_start).double()], -1)
    allc = comm.all_gather_cat(cand, -2)  # [B, L, world*kl, 2], rank order = id order
    n = allc.shape[-2]
    kk = min(k, n)
    if kernel and kk <= shard_topk.MAX_K:  # the candidates' stable top-k on the same kernel:
        zero = torch.zeros(B * L, dtype=torch.float32, device=local.device)  # (x - 0) - 0 = x
        v, pos = shard_topk(allc[..., 0].float().reshape(B * L, n), zero, zero, kk)
        ids = allc[..., 1].reshape(B * L, n).gather(-1, pos).view(B, L, kk)
        return v.view(B, L, kk), ids.long().contiguous()
    v, order = torch.sort(allc[..., 0], dim=-1, descending=True, stable=True)
    ids = allc[..., 1].gather(-1, order[..., :kk])
    return v[..., :kk].float().contiguous(), ids.long().contiguous()


# the op table's names (`loopbench.op_range`) for the draft's code outside registry ops
DRAFT_BODY, DRAFT_TOPK = "(drafter body)", "(draft head top-k)"


class DistDrafter:
    """A replicated DFlashDrafter for the decode loop on a DistKimiModel: the loop calls
    `draft_override`, which runs the selected `drafter` variant's block forward (the
    reference's `forward_block`, or the kernel's `BLOCK_HIDDEN` body) and then the
    vocab-parallel log-softmax top-K (the single-process `drafter` op would read a full LM
    head); `materialize` runs the `drafter_materialize` op."""

    def __init__(self, drafter, target):
        self.drafter, self.target = drafter, target
        self.cfg = drafter.cfg

    def new_cache(self, batch: int, max_len: int):
        return self.drafter.new_cache(batch, max_len)

    def materialize(self, cache, target_hidden, positions, count) -> None:
        with self.target.log("draft"):
            ops.get("drafter_materialize")(self.drafter, cache, target_hidden, positions, count)

    def _body(self):
        """The selected variant's block body, or None: the drafter's own forward_block."""
        return block_body()

    def draft_override(self, drafter, target, cache, bonus, start, k):
        """(logprobs fp32 [B, L, k], global ids int64 [B, L, k]), as the `drafter` op."""
        from workbench.loopbench import op_range  # the op table's rows (profiling only)

        with target.log("draft"):
            body = self._body()
            with op_range(DRAFT_BODY):
                if body is None:
                    z = self.drafter.forward_block(cache, block_ids(self.cfg, bonus), start,
                                                   target)[:, 1:]  # [B, L, D]
                else:
                    z = body(self.drafter, target, cache, bonus, start).view(
                        bonus.shape[0], self.cfg.depth, -1)
            local = ops.get("lm_head")(z, target.lm_head_shard.weight)  # [B, L, V/w]
            with op_range(DRAFT_TOPK):
                head = head_kernel()
                if head is not None:  # the variant's whole head, collectives included
                    return head(local, target.vocab_start, k, target.comm)
                return dist_topk_logprobs(local, target.vocab_start, k, target.comm,
                                          head_topk())


def block_body():
    """The selected `drafter` variant's block forward without its head (kernels/drafter
    BLOCK_HIDDEN), None for the reference; a variant without one is an error, not a silent
    switch to the reference body."""
    from workbench.kernels.drafter import BLOCK_HIDDEN

    name = ops.selected("drafter")
    if name == ops.REFERENCE:
        return None
    if name not in BLOCK_HIDDEN:
        raise ValueError(f"drafter: the distributed drafter needs a block body for variant "
                         f"{name!r}; expected one of {sorted(BLOCK_HIDDEN)} or "
                         f"{ops.REFERENCE!r}")
    return ops.Variant(name, BLOCK_HIDDEN[name]).load()  # the registry's "module:function" loader


def _selected_entry(table: str):
    """The selected `drafter` variant's entry of kernels/drafter's `table` ("module:function"
    loaded by the registry's loader), None where the variant has none."""
    import workbench.kernels.drafter as kd

    name, entries = ops.selected("drafter"), getattr(kd, table)
    return ops.Variant(name, entries[name]).load() if name in entries else None


def head_topk():
    """The selected `drafter` variant's shard top-k for the vocab-parallel head (kernels/drafter
    HEAD_TOPK: `dist_topk_logprobs`' shard_topk), None where the variant has none (the
    reference, triton_v1-v5: `stable_topk`)."""
    return _selected_entry("HEAD_TOPK")


def head_kernel():
    """The selected `drafter` variant's whole vocab-parallel head (kernels/drafter HEAD:
    `dist_topk_logprobs`' contract, (local, vocab_start, k, comm)), None where the variant has
    none (then `dist_topk_logprobs` with `head_topk()`'s shard top-k)."""
    return _selected_entry("HEAD")


def block_ids(cfg, bonus: torch.Tensor) -> torch.Tensor:
    """[bonus, MASK x L] per request: [B, L+1] (reference/drafter.draft_topk's block)."""
    B = bonus.shape[0]
    masks = torch.full((B, cfg.depth), cfg.mask_token_id, dtype=torch.long, device=bonus.device)
    return torch.cat([bonus.view(B, 1).long(), masks], 1)
