"""Train the DFlash drafter against the frozen INT4 target, then export it (drafter_io format).

DFlash block training (notes/ddtree.md §1.4; SpecForge's OnlineDFlashModel does the same):
  * data: the target's OWN greedy continuations. Prompts are random windows of the `drafter`
    split (files the target never trained on, data.py), of lengths `prompt_lens`, continued
    greedily by the exported INT4 target (read back through `from_kimi`) to `seq` tokens. A
    label is then exactly the token the target would emit there, which is what DDTree's greedy
    walk accepts; corpus text would teach the drafter to predict the corpus instead of the
    target. Short sequences keep the anchors in the first ~200 generated tokens, the regime
    the report measures (small models loop later on, which is easy to draft and would flatter
    the held-out numbers). The captured layer outputs of every pool sequence are computed
    once (frozen target, no grad) and kept on the device.
  * blocks: M random anchors p per sequence, all inside the generated part, half of them in
    its first `early` tokens (right after a prompt the target's choices are hardest to draft:
    chain tau 2.5 there vs 3.6 a hundred tokens on, measured on the first shipped run); block =
    [token p, MASK x L] at positions p..p+L; context = hidden_norm(fc(target features of
    tokens < p)), attended non-causally together with the block (blocks never see each other).
    Context K/V get no input norm and the K2.6 layer types (sliding layers then one full one)
    are kept; the sliding window (2048) exceeds every training sequence, so it never cuts.
  * loss: cross-entropy of block rows 1..L through the TARGET's frozen LM head against the
    tokens at p+1..p+L, weighted exp(-(k-1)/gamma) for row k (DFlash's decay; gamma 4 at block
    8), normalised by the weight sum.
The CSV logs per-depth accuracy and `tau_chain` = 1 + mean run of correct leading depths per
block: the acceptance a chain (budget L, top-1 per depth) would get on these positions.
Legend: N pool sequences, B batch, S seq, M anchors per sequence, bs block size (L + 1),
Q = M*bs block rows, F = len(target_layer_ids) * D captured features, Hq/Hkv heads, d head_dim.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import DrafterConfig
from workbench.reference.rope import drafter_rope

from . import DRAFTER_SUBDIR, TARGET_SUBDIR, TOKENIZER_FILE, data
from .common import CsvLog, adamw, autocast, fmt, lr_at, setup
from .twin import Linear, Norm, SwiGLU, rms_norm


@dataclass
class DrafterArgs:
    out: str  # the pair folder holding target/ and tokenizer.json; drafter/ is written there
    device: str = "cpu"
    seed: int = 0
    smoke: bool = False
    steps: int = 3000
    batch: int = 64
    seq: int = 256
    anchors: int = 48  # M blocks per sequence
    early: int = 64  # half of the anchors fall in the first `early` generated tokens
    pool: int = 12288  # on-policy sequences generated once
    prompt_lens: tuple[int, ...] = (32, 48, 64, 96)
    gen_batch: int = 2048
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.05
    gamma: float = 4.0
    eval_every: int = 250
    manifest: str | None = None
    trace: str | None = "traces/train_drafter.csv"
    compile: bool = False
    max_files: int | None = None

    @classmethod
    def smoke_defaults(cls, out: str, **kw) -> DrafterArgs:
        base = dict(smoke=True, steps=30, batch=8, seq=48, anchors=6, early=12, pool=48,
                    prompt_lens=(8, 16), gen_batch=24, warmup=5, eval_every=10, trace=None,
                    max_files=6)
        return cls(out=out, **{**base, **kw})


class DAttention(nn.Module):
    def __init__(self, c: DrafterConfig, out_std: float):
        super().__init__()
        D, d = c.hidden_size, c.head_dim
        self.q_proj, self.k_proj = Linear(D, c.num_heads * d), Linear(D, c.num_kv_heads * d)
        self.v_proj, self.o_proj = Linear(D, c.num_kv_heads * d), Linear(c.num_heads * d, D,
                                                                         out_std)
        self.q_norm, self.k_norm = Norm(d), Norm(d)


class DLayer(nn.Module):
    def __init__(self, c: DrafterConfig, index: int):
        super().__init__()
        out_std = 0.02 / (2 * c.num_layers) ** 0.5
        self.sliding = c.layer_types[index] == "sliding_attention"
        self.input_layernorm = Norm(c.hidden_size)
        self.post_attention_layernorm = Norm(c.hidden_size)
        self.self_attn = DAttention(c, out_std)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, out_std)


def rope_half(x, cos, sin):
    """Rotate-half RoPE: x [B, S, h, d], cos/sin [B, S, d/2] fp32 (Qwen3 layout)."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    xf = x.float()
    h = x.shape[-1] // 2
    x1, x2 = xf[..., :h], xf[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(x.dtype)


class TrainDrafter(nn.Module):
    """Same parameter names as reference/drafter.py's DFlashDrafter."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.cfg = c
        D = c.hidden_size
        self.fc = Linear(len(c.target_layer_ids) * D, D)
        self.hidden_norm = Norm(D)
        self.layers = nn.ModuleList(DLayer(c, i) for i in range(c.num_layers))
        self.norm = Norm(D)
        self.rope = drafter_rope(c)

    def _heads(self, at: DAttention, x, pos_cs, n_heads, proj, norm):
        c = self.cfg
        y = proj(x).unflatten(-1, (n_heads, c.head_dim))
        if norm is not None:
            y = rope_half(rms_norm(y, norm.weight, c.rms_norm_eps), *pos_cs)
        return y

    def forward(self, feats: torch.Tensor, block_x: torch.Tensor, anchors: torch.Tensor):
        """feats [B, S, F] (target features of tokens 0..S-1), block_x [B, M*bs, D] (embedded
        [token p, MASK x L] per anchor), anchors [B, M] -> final-normed hidden [B, M*bs, D]."""
        c = self.cfg
        B, S, _ = feats.shape
        bs, M = c.block_size, anchors.shape[1]
        Q, G = M * bs, c.num_heads // c.num_kv_heads
        dev = feats.device
        ctx = rms_norm(self.fc(feats), self.hidden_norm.weight, c.rms_norm_eps)  # [B, S, D]
        ctx_pos = torch.arange(S, device=dev).expand(B, S)
        blk_pos = (anchors.unsqueeze(-1) + torch.arange(bs, device=dev)).view(B, Q)
        ctx_cs = self.rope.cos_sin(ctx_pos)
        blk_cs = self.rope.cos_sin(blk_pos)
        # masks [B, 1, Q, S + Q]: context t < anchor of the query's block; its own block only
        qblock = torch.arange(Q, device=dev) // bs
        see_ctx = ctx_pos.unsqueeze(1) < anchors.repeat_interleave(bs, 1).unsqueeze(2)  # [B,Q,S]
        see_blk = (qblock.view(-1, 1) == qblock.view(1, -1)).expand(B, Q, Q)
        full = torch.cat([see_ctx, see_blk], 2).unsqueeze(1)
        rel = blk_pos.unsqueeze(2) - torch.cat([ctx_pos, blk_pos], 1).unsqueeze(1)
        window = ((rel < c.sliding_window) & (rel > -c.sliding_window)).unsqueeze(1)
        x = block_x
        for layer in self.layers:
            at = layer.self_attn
            a = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
            q = self._heads(at, a, blk_cs, c.num_heads, at.q_proj, at.q_norm)
            kb = self._heads(at, a, blk_cs, c.num_kv_heads, at.k_proj, at.k_norm)
            vb = self._heads(at, a, None, c.num_kv_heads, at.v_proj, None)
            kc = self._heads(at, ctx, ctx_cs, c.num_kv_heads, at.k_proj, at.k_norm)  # no input
            vc = self._heads(at, ctx, None, c.num_kv_heads, at.v_proj, None)  # norm on context
            k = torch.cat([kc, kb], 1).transpose(1, 2).repeat_interleave(G, 1)  # [B, Hq, S+Q, d]
            v = torch.cat([vc, vb], 1).transpose(1, 2).repeat_interleave(G, 1)
            mask = full & window if layer.sliding else full
            if layer.sliding and c.causal_sliding_in_block:
                raise NotImplementedError("training with causal sliding layers in the block")
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.to(q.dtype), v.to(q.dtype),
                                               attn_mask=mask)  # [B, Hq, Q, d]
            x = x + at.o_proj(o.transpose(1, 2).reshape(B, Q, -1))
            x = x + layer.mlp(rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps))
        return rms_norm(x, self.norm.weight, c.rms_norm_eps)


def sample_anchors(starts: torch.Tensor, S: int, M: int, bs: int, g: torch.Generator,
                   early: int = 0):
    """[B, M] distinct anchors per row in [starts[b], S - bs]: M // 2 uniform in the first
    `early` positions of that range (none when early = 0), the rest uniform over what is left."""
    B = starts.shape[0]
    pos = torch.arange(S).view(1, -1)
    ok = (pos >= starts.view(-1, 1)) & (pos <= S - bs)
    win = ok & (pos < starts.view(-1, 1) + early)
    m1 = M // 2 if early else 0
    if int(ok.sum(1).min()) < M or int(win.sum(1).min()) < m1:
        raise ValueError(f"anchors: {M} per sequence ({m1} in the first {early}) do not fit in "
                         f"[start, {S - bs}]")
    r = torch.rand(B, S, generator=g)
    first = r.masked_fill(~win, 3.0).argsort(1)[:, :m1]
    taken = torch.zeros(B, S, dtype=torch.bool).scatter(1, first, True)
    rest = r.masked_fill(~ok | taken, 3.0).argsort(1)[:, :M - m1]
    return torch.cat([first, rest], 1).sort(1).values


def block_loss(drafter: TrainDrafter, embed_w, head_w, feats, ids, anchors, gamma: float):
    """(weighted loss, correct [B, M, L] bool) of one batch; ids [B, S], anchors [B, M]."""
    c = drafter.cfg
    B, M, bs = anchors.shape[0], anchors.shape[1], c.block_size
    blk = torch.full((B, M, bs), c.mask_token_id, dtype=torch.long, device=ids.device)
    blk[..., 0] = ids.gather(1, anchors)
    z = drafter(feats, embed_w[blk.view(B, M * bs)], anchors).view(B, M, bs, -1)[:, :, 1:]
    logits = F.linear(z, head_w).float()  # [B, M, L, V] through the target's LM head
    lab = ids.gather(1, (anchors.unsqueeze(-1) + torch.arange(1, bs, device=ids.device))
                     .view(B, -1)).view(B, M, bs - 1)
    w = torch.exp(-torch.arange(bs - 1, device=ids.device, dtype=torch.float32) / gamma)
    ce = F.cross_entropy(logits.flatten(0, 2), lab.flatten(), reduction="none").view(B, M, -1)
    loss = (ce * w).sum() / (w.sum() * B * M)
    return loss, logits.argmax(-1) == lab


def tau_chain(correct: torch.Tensor) -> float:
    """1 + mean number of leading correct depths per block (correct [..., L] bool)."""
    return 1.0 + correct.long().cumprod(-1).sum(-1).float().mean().item()


@torch.no_grad()
def onpolicy_pool(target, stream, n: int, seq: int, prompt_lens, gen_batch: int,
                  g: torch.Generator, dev, desc: str):
    """n sequences [n, seq] = random stream window of a prompt length + the target's greedy
    continuation; starts [n] = prompt lengths (the first position a label may come from)."""
    from tqdm.auto import tqdm

    ids, starts = [], []
    chunks = [(prompt_lens[i % len(prompt_lens)], min(gen_batch, n - i * gen_batch))
              for i in range((n + gen_batch - 1) // gen_batch)]
    for P, b in tqdm(chunks, desc=desc, mininterval=2.0):
        prompts = data.sample_windows(stream, b, P, g).to(dev)
        ids.append(target.greedy(prompts, seq - P, autocast=dev.type == "cuda"))
        starts.append(torch.full((b,), P, dtype=torch.long))
    return torch.cat(ids), torch.cat(starts).to(dev)


@torch.no_grad()
def capture_features(target, ids: torch.Tensor, chunk: int, dev) -> torch.Tensor:
    """[n, S, F] bf16 (fp32 on CPU): outputs of the drafter's target layers, frozen target."""
    layers = target.capture_layers
    out = []
    for i in range(0, ids.shape[0], chunk):
        with autocast(dev):
            _, cap, _ = target(ids[i:i + chunk], capture=layers, want_logits=False)
        out.append(cap.to(torch.bfloat16 if dev.type == "cuda" else torch.float32))
    return torch.cat(out)


def train_drafter(args: DrafterArgs) -> dict:
    """Train on the exported target in `out/target`; write `out/drafter`; return a summary."""
    from tqdm.auto import tqdm

    from workbench.checkpoint import load_model

    from .target import from_kimi

    t_start = time.perf_counter()
    dev = setup(args.seed, args.device)
    out = Path(args.out)
    km = load_model(out / TARGET_SUBDIR)
    cfg = km.cfg
    target = from_kimi(km).to(dev)
    target.capture_layers = tuple(cfg.drafter.target_layer_ids)
    for p in target.parameters():
        p.requires_grad_(False)
    tok = data.load_tokenizer(out / TOKENIZER_FILE)
    manifest = data.load_manifest(args.manifest) if args.manifest else None
    train_s = data.token_stream(tok, data.read_split("drafter", manifest,
                                                     limit=args.max_files))
    held_s = data.token_stream(tok, data.read_split("heldout", manifest,
                                                    limit=4 if args.smoke else None))
    g = torch.Generator().manual_seed(args.seed)

    t0 = time.perf_counter()
    ids, starts = onpolicy_pool(target, train_s, args.pool, args.seq, args.prompt_lens,
                                args.gen_batch, g, dev, "greedy pool")
    n_val = max(args.batch, args.pool // 32)
    vids, vstarts = onpolicy_pool(target, held_s, n_val, args.seq, args.prompt_lens,
                                  args.gen_batch, torch.Generator().manual_seed(4321), dev,
                                  "held-out pool")
    chunk = 256 if dev.type == "cuda" else 16
    feats, vfeats = capture_features(target, ids, chunk, dev), capture_features(target, vids,
                                                                               chunk, dev)
    gen_s = time.perf_counter() - t0
    print(f"on-policy data: {ids.shape[0]} + {vids.shape[0]} held-out sequences of {args.seq} "
          f"tokens, features {tuple(feats.shape)} in {gen_s:.0f} s")

    dc = cfg.drafter
    drafter = TrainDrafter(dc).to(dev)
    fwd = torch.compile(drafter) if args.compile else drafter
    embed_w, head_w = target.model.embed_tokens.weight, target.lm_head.weight
    opt = adamw(drafter, args.lr, args.weight_decay, fused=dev.type == "cuda")
    log = CsvLog(args.trace)
    vg = torch.Generator().manual_seed(99)
    vsel = torch.randperm(vids.shape[0], generator=vg)[: min(vids.shape[0], 4 * args.batch)]
    vanch = sample_anchors(vstarts[vsel].cpu(), args.seq, args.anchors, dc.block_size, vg)
    # the report's regime: every anchor in the first `early` tokens after the prompt
    vearly = None
    if args.early:
        m = min(args.anchors, args.early)
        offs = torch.rand(len(vsel), args.early, generator=vg).argsort(1)[:, :m].sort(1).values
        vearly = offs + vstarts[vsel].cpu().view(-1, 1)
    n_params = sum(p.numel() for p in drafter.parameters())
    print(f"drafter: {n_params / 1e6:.2f} M params, {dc.num_layers} layers, block "
          f"{dc.block_size}, features of target layers {list(dc.target_layer_ids)}; "
          f"{args.steps} steps x {args.batch} sequences x {args.anchors} blocks")

    def run(sel, anchors_cpu, f, x):
        with autocast(dev):
            return block_loss(fwd, embed_w, head_w, f[sel], x[sel], anchors_cpu.to(dev),
                              args.gamma)

    t1 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="drafter", mininterval=2.0)
    for step in bar:
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        sel = torch.randint(0, ids.shape[0], (args.batch,), generator=g)
        anchors = sample_anchors(starts[sel].cpu(), args.seq, args.anchors, dc.block_size, g,
                                 args.early)
        loss, correct = run(sel.to(dev), anchors, feats, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps - 1:
            drafter.eval()
            with torch.no_grad():
                vl, vc = zip(*(run(vsel[i:i + args.batch].to(dev), vanch[i:i + args.batch],
                                   vfeats, vids) for i in range(0, len(vsel), args.batch)))
            drafter.train()
            vcor = torch.cat(vc)
            early_tau = ""
            if vearly is not None:
                with torch.no_grad():
                    ve = [run(vsel[i:i + args.batch].to(dev),
                              vearly[i:i + args.batch].clamp_max(args.seq - dc.block_size),
                              vfeats, vids)[1] for i in range(0, len(vsel), args.batch)]
                early_tau = fmt(tau_chain(torch.cat(ve)))
            el = time.perf_counter() - t1
            row = {"step": step, "loss": fmt(loss.item()), "val_loss": fmt(sum(
                v.item() for v in vl) / len(vl)), "tau_chain": fmt(tau_chain(correct)),
                "val_tau_chain": fmt(tau_chain(vcor)), "val_tau_chain_early": early_tau,
                "lr": fmt(lr)}
            row |= {f"val_acc_d{k + 1}": fmt(vcor[..., k].float().mean().item())
                    for k in range(dc.depth)}
            row |= {"seqs_per_s": round((step + 1) * args.batch / el, 1),
                    "elapsed_s": round(el, 1)}
            log.add(row)
            bar.set_postfix(loss=row["loss"], val_tau=row["val_tau_chain"])
    train_s = time.perf_counter() - t1

    from workbench.drafter_io import save_drafter

    path = save_drafter(export_drafter(drafter.cpu()), out / DRAFTER_SUBDIR)
    last = log.rows[-1]
    summary = {"args": asdict(args), "params": n_params, "data_s": round(gen_s, 1),
               "train_s": round(train_s, 1), "wall_s": round(time.perf_counter() - t_start, 1),
               "val_loss": last["val_loss"], "val_tau_chain": last["val_tau_chain"],
               "torch": torch.__version__,
               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    (path / "train.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"drafter: {train_s:.0f} s training, held-out chain tau {last['val_tau_chain']} "
          f"(top-1 per depth, block {dc.block_size}); wrote {path}")
    return summary


@torch.no_grad()
def export_drafter(twin: TrainDrafter):
    """The twin as a DFlashDrafter with bf16 parameters (names are identical)."""
    from workbench.reference.drafter import empty_drafter

    dr = empty_drafter(twin.cfg)
    src = twin.state_dict()
    dst = dr.state_dict()
    if set(src) != set(dst):
        raise RuntimeError(f"export_drafter: names differ: {sorted(set(src) ^ set(dst))[:6]}")
    for name, t in dst.items():
        t.copy_(src[name].to(t.dtype))
    return dr
