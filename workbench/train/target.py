"""Train the target (a TrainKimi twin) on the stdlib corpus, then export it as a K2.6 checkpoint.

Recipe (all seeded; defaults are the shipped run's):
  * next-token cross-entropy on random windows of the training stream, residual dropout
    (training only), AdamW (0.9, 0.95),
    weight decay 0.1 on matrices, linear warmup + cosine to 10%, grad clip 1.0, bf16 autocast
    on GPU (fp32 master weights), fp32 on CPU;
  * routing balance: DeepSeek-V3's auxiliary-loss-free bias update. After every step each MoE
    layer's e_score_correction_bias moves by `bias_rate` * sign(mean load - expert load); no
    balance loss term touches the gradients;
  * INT4: the last `qat_frac` of the steps run the experts through fake_quant_g32 (straight-
    through), then export quantizes the same float weights with reference/int4's
    quantize_int4_g32 (post-training quantization with a QAT tail, so the exported INT4 model
    is the function the last steps trained). The CSV logs the held-out loss with float and
    with INT4 experts at every eval, which shows the PTQ gap and the tail closing it.
Export: a KimiModel (bf16 everywhere, INT4 experts as packed buffers) written by
workbench.checkpoint.save_model; `from_kimi` reads one back into a twin (the drafter trainer
uses that, so the drafter learns the shipped INT4 target, not the float one).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.reference.int4 import dequant_int4_g32, pack_int4, quantize_int4_g32

from . import MANIFEST_FILE, TARGET_SUBDIR, TOKENIZER_FILE, data, trained_config
from .common import CsvLog, adamw, autocast, fmt, lr_at, setup
from .twin import TrainKimi

_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(gate|up|down)_(packed|scale)")


@dataclass
class TargetArgs:
    out: str  # the pair folder: tokenizer.json, corpus.json, target/ land here
    device: str = "cpu"
    seed: int = 0
    smoke: bool = False
    vocab: int = 2048
    steps: int = 600  # held-out loss bottoms out here (~10 epochs); more only memorises
    batch: int = 64
    seq: int = 512
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    qat_frac: float = 0.1
    bias_rate: float = 5e-3  # 5x DeepSeek-V3's 1e-3: this run has ~1e3 steps, not ~1e5
    dropout: float = 0.1  # the corpus is small (~1.9 M training tokens)
    eval_every: int = 50
    manifest: str | None = None  # train on this corpus list (a shipped corpus.json)
    trace: str | None = "traces/train_target.csv"
    compile: bool = False
    max_files: int | None = None  # smoke: the first n training files only

    @classmethod
    def smoke_defaults(cls, out: str, **kw) -> TargetArgs:
        base = dict(smoke=True, vocab=384, steps=40, batch=8, seq=64, lr=3e-3, warmup=5,
                    eval_every=10, max_files=12, trace=None)
        return cls(out=out, **{**base, **kw})


def prepare_corpus(args: TargetArgs):
    """Manifest + tokenizer (trained on the training split unless out/tokenizer.json exists)
    + token streams. Returns (tokenizer, train stream, held-out stream, manifest)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = data.load_manifest(args.manifest) if args.manifest else data.build_manifest()
    if args.manifest:
        print(data.manifest_report(manifest))
    train = data.read_split("train", manifest, limit=args.max_files)
    held = data.read_split("heldout", manifest, limit=4 if args.smoke else None)
    if not train or not held:
        raise RuntimeError(f"corpus: expected training and held-out files, got {len(train)} "
                           f"and {len(held)} under {data.stdlib_root()}")
    tok_path = out / TOKENIZER_FILE
    if tok_path.exists():
        tok = data.load_tokenizer(tok_path)
    else:
        t0 = time.perf_counter()
        tok = data.train_tokenizer([f.text for f in train], args.vocab)
        tok.save(str(tok_path))
        print(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens, trained on "
              f"{len(train)} files in {time.perf_counter() - t0:.1f} s")
    if tok.get_vocab_size() != args.vocab:
        raise RuntimeError(f"{tok_path}: vocab {tok.get_vocab_size()}, expected {args.vocab}")
    if not args.smoke and not args.max_files:
        data.save_manifest(manifest, out / MANIFEST_FILE)
    return tok, data.token_stream(tok, train), data.token_stream(tok, held), manifest


@torch.no_grad()
def evaluate(model: TrainKimi, batches: torch.Tensor, dev, quant: bool) -> float:
    was, model.quant = model.quant, quant
    model.eval()
    losses = []
    for x in batches:  # [b, S+1]
        x = x.to(dev)
        with autocast(dev):
            _, _, logits = model(x[:, :-1])
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).item())
    model.quant = was
    model.train()
    return sum(losses) / len(losses)


def train_target(args: TargetArgs) -> dict:
    """Train, export to `out/target`, return a summary (also written to out/target/train.json)."""
    from tqdm.auto import tqdm

    t_start = time.perf_counter()
    dev = setup(args.seed, args.device)
    tok, stream, held, manifest = prepare_corpus(args)
    cfg = trained_config(tok.get_vocab_size(), smoke=args.smoke)
    g = torch.Generator().manual_seed(args.seed)
    val = [data.sample_windows(held, 16 if not args.smoke else 4, args.seq + 1,
                               torch.Generator().manual_seed(1234)) for _ in range(4)]
    model = TrainKimi(cfg).to(dev)
    model.dropout = args.dropout
    step_fn = torch.compile(model) if args.compile else model
    opt = adamw(model, args.lr, args.weight_decay, fused=dev.type == "cuda")
    log = CsvLog(args.trace)
    qat_from = int(args.steps * (1 - args.qat_frac)) if args.qat_frac > 0 else args.steps
    n_params = sum(p.numel() for p in model.parameters())
    print(f"target {cfg.name}: {n_params / 1e6:.2f} M params, {cfg.num_layers} layers, "
          f"{cfg.n_routed_experts} experts top-{cfg.n_experts_per_tok}, V {cfg.vocab_size}; "
          f"train stream {stream.numel():,} tokens, held-out {held.numel():,}; {args.steps} "
          f"steps x {args.batch} x {args.seq} tokens (QAT from step {qat_from})")

    t0, seen, ema = time.perf_counter(), 0, None
    bar = tqdm(range(args.steps), desc="target", mininterval=2.0)
    for step in bar:
        model.quant = step >= qat_from
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        x = data.sample_windows(stream, args.batch, args.seq + 1, g).to(dev, non_blocking=True)
        stats: dict = {}
        with autocast(dev):
            _, _, logits = step_fn(x[:, :-1], stats=stats)
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imbalance = balance_routing(model, stats["load"], args.bias_rate)
        seen += x[:, :-1].numel()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        last = step == args.steps - 1
        if step % args.eval_every == 0 or last:
            vf = evaluate(model, val, dev, quant=False)
            vq = evaluate(model, val, dev, quant=True)
            el = time.perf_counter() - t0
            log.add({"step": step, "tokens": seen, "loss": fmt(loss.item()), "loss_ema": fmt(ema),
                     "val_loss": fmt(vf), "val_loss_int4": fmt(vq), "lr": fmt(lr),
                     "qat": int(model.quant), "max_load_over_mean": fmt(imbalance),
                     "tokens_per_s": round(seen / el), "elapsed_s": round(el, 1)})
            bar.set_postfix(loss=f"{ema:.3f}", val=f"{vf:.3f}", int4=f"{vq:.3f}")
    train_s = time.perf_counter() - t0

    km = export_kimi(model.cpu())
    from workbench.checkpoint import save_model

    path = save_model(km, Path(args.out) / TARGET_SUBDIR)
    last = log.rows[-1]
    summary = {"args": asdict(args), "params": n_params, "train_s": round(train_s, 1),
               "wall_s": round(time.perf_counter() - t_start, 1),
               "tokens_per_s": last["tokens_per_s"], "val_loss": last["val_loss"],
               "val_loss_int4": last["val_loss_int4"], "corpus_python": manifest["python"],
               "corpus_list_sha256": manifest["list_sha256"], "torch": torch.__version__,
               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    (path / "train.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"target: {train_s:.0f} s training, {last['tokens_per_s']:,} tokens/s, held-out loss "
          f"{last['val_loss']} (INT4 {last['val_loss_int4']}); wrote {path}")
    return summary


@torch.no_grad()
def balance_routing(model: TrainKimi, loads: list[torch.Tensor], rate: float) -> float:
    """Aux-loss-free balance (DeepSeek-V3 §2.1.2): bias += rate * sign(mean load - load).
    Returns max(load) / mean(load) over the MoE layers of this step (1.0 = perfect)."""
    worst = 1.0
    for moe, load in zip(model.moe_layers(), loads):
        load = load.float()
        mean = load.mean()
        moe.gate.e_score_correction_bias += rate * torch.sign(mean - load)
        worst = max(worst, (load.max() / mean.clamp_min(1)).item())
    return worst


# -- export / import -------------------------------------------------------------------------
@torch.no_grad()
def export_kimi(twin: TrainKimi):
    """The twin as a KimiModel: bf16 params, fp32 routing bias, experts INT4 g32 (PTQ)."""
    from workbench.reference.model import KimiModel

    with torch.device("meta"):
        km = KimiModel(twin.cfg)
    km = km.to_empty(device="cpu")
    src = {k: v.detach().float().cpu() for k, v in twin.state_dict().items()}
    dst = dict(km.named_parameters()) | dict(km.named_buffers())
    used = set()
    for name, t in dst.items():
        m = _EXPERT.fullmatch(name)
        if m is None:
            t.copy_(src[name].to(t.dtype))
            used.add(name)
            continue
        base, proj, kind = m.groups()
        w = src[f"{base}.{proj}_w"]  # [E, out, in]
        used.add(f"{base}.{proj}_w")
        for e in range(w.shape[0]):
            q, s = quantize_int4_g32(w[e])
            t[e] = pack_int4(q) if kind == "packed" else s
    left = set(src) - used
    if left:
        raise RuntimeError(f"export_kimi: twin tensors with no checkpoint slot: {sorted(left)}")
    return km.eval()


@torch.no_grad()
def from_kimi(km) -> TrainKimi:
    """A KimiModel (e.g. from load_model) as a float twin; experts = their dequantised INT4."""
    twin = TrainKimi(km.cfg)
    src = dict(km.named_parameters()) | dict(km.named_buffers())
    for name, t in twin.state_dict().items():
        if name.endswith(("gate_w", "up_w", "down_w")):
            base, proj = name.rsplit(".", 1)
            proj = proj[:-2]
            t.copy_(dequant_int4_g32(src[f"{base}.{proj}_packed"], src[f"{base}.{proj}_scale"])
                    .float())
        else:
            t.copy_(src[name].float())
    return twin.eval()
