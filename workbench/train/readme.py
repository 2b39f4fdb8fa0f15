"""Write the pair folder's README.md from what the run recorded (so a rerun documents itself)."""

from __future__ import annotations

import json
from pathlib import Path

from . import DRAFTER_SUBDIR, MANIFEST_FILE, TARGET_SUBDIR, TOKENIZER_FILE, pair_size_bytes

COMMANDS = """\
OUT=/some/folder bash scripts/train_gpu.sh     # the whole run; its stages are:
python -m workbench.train target  --device cuda [--manifest corpus.json]
python -m workbench.train drafter --device cuda [--manifest corpus.json]
python -m workbench.train report  --device cuda
python -m workbench.train readme  --wall target=S --wall drafter=S --wall report=S"""


def _mb(path: Path) -> str:
    return f"{pair_size_bytes(path) / 1e6:.2f} MB" if path.is_dir() else \
        f"{path.stat().st_size / 1e6:.2f} MB"


def write_readme(pair_dir, walls: dict[str, float], acceptance_csv=None) -> Path:
    pair = Path(pair_dir)
    tgt = json.loads((pair / TARGET_SUBDIR / "train.json").read_text())
    drf = json.loads((pair / DRAFTER_SUBDIR / "train.json").read_text())
    man = json.loads((pair / MANIFEST_FILE).read_text())
    ta, da = tgt["args"], drf["args"]
    cfg = json.loads((pair / TARGET_SUBDIR / "config.json").read_text())["text_config"]
    dcfg = json.loads((pair / DRAFTER_SUBDIR / "config.json").read_text())
    wall = " + ".join(f"{k} {v:.0f} s" for k, v in walls.items())
    acc, acc_title = "", "Acceptance"
    if acceptance_csv and Path(acceptance_csv).is_file():
        import pandas as pd

        df = pd.read_csv(acceptance_csv)
        bf = df[df["precision"] == "bf16"] if "precision" in df else df
        g = bf[(bf["mode"] == "ddtree") & (bf["temperature"] == 0) & (bf["block_size"] == 8)]
        t1 = bf[(bf["mode"] == "ddtree") & (bf["temperature"] == 1) & (bf["block_size"] == 8)]
        if "max_new" in df:
            acc_title = (f"Acceptance (held-out function prompts, {int(g['max_new'].iloc[0])} new "
                         "tokens, block 8, bf16)")

        def row(name, vals, f="{:.2f}"):
            return f"| {name} | " + " | ".join(f.format(v) for v in vals) + " |\n"

        acc = ("| budget | " + " | ".join(str(b) for b in g["budget"]) + " |\n|---|"
               + "---:|" * len(g) + "\n" + row("tau greedy", g["tau"]))
        if "tau_first64" in g:
            acc += row("tau greedy, first 64 tokens", g["tau_first64"])
        if len(t1):
            acc += row("tau T=1", t1["tau"])
        acc += row("experts/layer", g["experts_per_layer"], "{:.1f}")
        acc += "\nFull table and the fp32 lossless check: `traces/acceptance_trained.md`.\n"
    text = f"""# The trained pair: a small Kimi-architecture target + its DFlash drafter

Made by `scripts/train_gpu.sh` on {tgt['device']} (torch {tgt['torch']}) in {wall}.
Everything in this folder is what that run wrote; `python -m workbench.train --help` says how.

| file | what | size |
|---|---|---:|
| `{TARGET_SUBDIR}/` | target, Kimi K2.6 checkpoint format (`workbench.checkpoint.load_model`) | {_mb(pair / TARGET_SUBDIR)} |
| `{DRAFTER_SUBDIR}/` | DFlash drafter (`workbench.drafter_io.load_drafter`) | {_mb(pair / DRAFTER_SUBDIR)} |
| `{TOKENIZER_FILE}` | byte-level BPE, {cfg['vocab_size']} tokens (`tokenizers`) | {_mb(pair / TOKENIZER_FILE)} |
| `{MANIFEST_FILE}` | the corpus: every file with its bytes, sha256 and split | {_mb(pair / MANIFEST_FILE)} |

Whole folder: {_mb(pair)}.

## Shapes
Target: {cfg['num_hidden_layers']} layers (layer 0 dense SwiGLU {cfg['intermediate_size']}, then
MoE), hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads, MLA q_lora
{cfg['q_lora_rank']} / kv_lora {cfg['kv_lora_rank']} / nope {cfg['qk_nope_head_dim']} / rope
{cfg['qk_rope_head_dim']} / v {cfg['v_head_dim']}, {cfg['n_routed_experts']} routed experts
top-{cfg['num_experts_per_tok']} (FFN {cfg['moe_intermediate_size']}, sigmoid + bias routing,
x {cfg['routed_scaling_factor']}) + 1 shared expert, experts INT4 group 32, vocab
{cfg['vocab_size']}, K2's YaRN; {tgt['params'] / 1e6:.1f} M parameters.

Drafter: {dcfg['num_hidden_layers']} Qwen3 layers ({dcfg['num_attention_heads']} q /
{dcfg['num_key_value_heads']} kv heads of {dcfg['head_dim']}, SwiGLU
{dcfg['intermediate_size']}), block size {dcfg['block_size']}, mask token
{dcfg['dflash_config']['mask_token_id']}, features of target layers
{dcfg['dflash_config']['target_layer_ids']}; {drf['params'] / 1e6:.1f} M parameters.

## Corpus and tokenizer
The Python {man['python']} standard library (`{man['stdlib']}`), rule version
{man['rule_version']} (`workbench/train/data.py` says which folders and files are left out):
{man['n_files']} files, {man['bytes'] / 1e6:.1f} MB, split by path hash: {man['n_heldout']}
held out ({man['heldout_percent']} %, never seen by the tokenizer or either model),
{man.get('n_drafter', 0)} for the drafter's prompts ({man.get('drafter_percent', 0)} %, never seen
by the target or the tokenizer), the rest for the tokenizer and the target. File list
sha256 `{man['list_sha256']}`. Another Python's stdlib differs: `data.manifest_report` says how,
and `--manifest {MANIFEST_FILE}` retrains on exactly this list (files missing there are skipped).

## Training (seed {ta['seed']})
Target: {ta['steps']} steps x {ta['batch']} x {ta['seq']} tokens, AdamW lr {ta['lr']} (warmup
{ta['warmup']}, cosine to 10 %), weight decay {ta['weight_decay']}, dropout {ta['dropout']}, bf16
autocast; routing balanced by DeepSeek-V3's aux-loss-free bias update (rate {ta['bias_rate']}),
no balance loss; INT4: post-training quantization with quantize_int4_g32 after a QAT tail (last
{ta['qat_frac']:.0%} of steps with straight-through fake quantization by the same rule).
{tgt['train_s']:.0f} s of training at {tgt['tokens_per_s']:,} tokens/s; held-out loss
{tgt['val_loss']} (float experts) / {tgt['val_loss_int4']} (INT4). Curve: `traces/train_target.csv`.

Drafter: {da['pool']} sequences of {da['seq']} tokens generated greedily by the INT4 target from
random prompts from the drafter split, files the target never saw ({', '.join(map(str, da['prompt_lens']))} tokens), {drf['data_s']:.0f} s;
then {da['steps']} steps x {da['batch']} sequences x {da['anchors']} blocks, lr {da['lr']},
loss decay gamma {da['gamma']}; {drf['train_s']:.0f} s. Held-out chain tau (top-1 per depth)
{drf['val_tau_chain']}. Curve: `traces/train_drafter.csv`.

## {acc_title}
{acc}
## Decisions
* INT4: PTQ with a QAT tail. The experts train in float; the last {ta['qat_frac']:.0%} of steps
  run them through `fake_quant_g32` (exactly quantize_int4_g32 + dequant, straight-through
  gradient), and export quantizes the same float weights, so the shipped INT4 target is the
  function the final steps trained (held-out loss float vs INT4 above: the gap is ~0).
* Routing balance: aux-loss-free (DeepSeek-V3): e_score_correction_bias += rate * sign(mean
  load - load) after each step; it steers selection only, the weights stay the unbiased
  sigmoid. `max_load_over_mean` in the target CSV tracks it.
* Tokenizer: byte-level BPE, 2048 tokens. Byte-level round-trips every file exactly (tested on
  the held-out files); ~3.2 characters per token on this corpus; a small vocabulary keeps the
  untied embedding + LM head at 2 MB so the experts and the drafter get the size budget.
* Drafter data: the INT4 target's own greedy continuations of prompts from files it never
  trained on (a 15 % `drafter` split). Trained on continuations of memorised training text, a
  drafter reads the future off the target's hidden states and fails on new text.
* Held-out regime: right after a prompt the target's continuation is hardest to draft (chain
  tau ~2.5 over the first 32 tokens vs ~3.6 after 100, measured on the first run), so half
  the training anchors sit in the first 64 generated tokens and the report gives tau over the
  first 64 tokens next to tau over all of them.
* Lossless check in fp32: in bf16 the reference forward is neither batch- nor row-count-
  invariant (an ulp can flip a near-tie in the MoE routing), so greedy AR and DDTree can part
  at such a point; with fp32 activations (same weights) they must agree, and the report and
  tests check that.

## Sizing on the H200 (eager bf16, measured)
Target ~500 k tokens/s (64 x 512 per step, E*I = 4096 computed densely as two GEMMs), so
600 steps take ~40 s; the held-out loss bottoms out near 600 steps (~10 epochs of ~1.9 M
training tokens) and rises after (memorisation). Drafter ~24 steps/s (64 sequences x 48
blocks), 3000 steps ~125 s, plus ~25 s for the greedy pool (KV-cached twin decode). The report
runs the reference ops: ~0.2 s per batched decode step, ~220 s for its grid. Whole script
~8 min, under the 9-minute limit.

## Reproduce
```
{COMMANDS}
```
Seeded (data order, init, anchors); GPU kernels are not bitwise deterministic, so a rerun gives
close, not identical, weights.
"""
    path = pair / "README.md"
    path.write_text(text)
    return path
