"""Training a small Kimi-architecture target and its DFlash drafter on the Python stdlib.

    python -m workbench.train tokenizer|target|drafter|all|report [--smoke] ...

Modules, in the order a run uses them:
    data.py      the corpus (a fixed, hashed list of stdlib files; train / drafter / held-out
                 splits by path hash), the byte-level BPE tokenizer, token streams, prompts
    twin.py      TrainKimi: a trainable float twin of reference/model.py (same names, same math)
    target.py    target training: aux-loss-free routing balance, QAT tail, PTQ export to a K2.6
                 checkpoint (and `from_kimi`, the way back)
    drafter.py   TrainDrafter: a trainable twin of reference/drafter.py, DFlash block training
                 on the frozen INT4 target's own greedy continuations, export
    report.py    acceptance report of a pair (tau per budget, distinct experts, lossless check)
    readme.py    the pair folder's README from the run's records
    common.py    seeding, precision, LR schedule, optimizer, CSV logs
    __main__.py  the command line (`main(argv)`)

The pair lives in `workbench/assets/trained/` (target/, drafter/, tokenizer.json, corpus.json,
README.md); `trained_config` below is its shape (the "trained" preset).
Legend: D hidden, H heads, C latent, R rope dims, E experts, K experts per token, I expert FFN
width, V vocab, L draft depth, S training sequence length, M anchors (blocks) per sequence.
"""

from __future__ import annotations

from pathlib import Path

from workbench.config import DrafterConfig, ModelConfig

TRAINED_DIR = Path(__file__).resolve().parent.parent / "assets" / "trained"
TARGET_SUBDIR, DRAFTER_SUBDIR = "target", "drafter"
TOKENIZER_FILE, MANIFEST_FILE = "tokenizer.json", "corpus.json"

# special tokens come first in the vocabulary, so their ids are fixed whatever the merges
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|mask|>", "<|pad|>")
BOS_ID, EOS_ID, MASK_ID, PAD_ID = range(4)


def trained_config(vocab_size: int = 2048, smoke: bool = False) -> ModelConfig:
    """The shipped pair's shape (or its toy `smoke` version for CPU tests).

    Every structural feature of Kimi K2.6 is kept: MLA with a q and a kv latent, dense layer 0,
    routed experts (sigmoid + bias top-k, renormalised, x 2.827) plus one shared expert, INT4
    group-32 experts, YaRN with K2's values; the drafter is K2.6's shape (Qwen3 layers, the
    last one full attention, the others sliding) at this width.
    """
    if smoke:
        layers, D, H = 3, 64, 4
        mla = dict(q_lora_rank=48, kv_lora_rank=32, qk_nope_dim=16, qk_rope_dim=8,
                   v_head_dim=16)
        moe = dict(n_routed_experts=8, n_experts_per_tok=2, moe_intermediate=32,
                   dense_intermediate=128)
        dr = dict(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                  target_layer_ids=(0, 2))
    else:
        # 6 layers: 1 dense + 5 MoE (32 experts top-4): ~16 MB on disk with INT4 experts
        layers, D, H = 6, 256, 8
        mla = dict(q_lora_rank=128, kv_lora_rank=128, qk_nope_dim=32, qk_rope_dim=16,
                   v_head_dim=32)
        moe = dict(n_routed_experts=32, n_experts_per_tok=4, moe_intermediate=128,
                   dense_intermediate=768)
        # 4 drafter layers (~7 MB). Captured layers 1, 3, 5: every other layer up to the last;
        # K2.6's rule (build_target_layer_ids) skips the last 2 of 61, a 6-layer target has no
        # such depth to spare.
        dr = dict(num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=768,
                  target_layer_ids=(1, 3, 5))
    n = dr["num_layers"]
    drafter = DrafterConfig(
        hidden_size=D, block_size=8, mask_token_id=MASK_ID,
        layer_types=("sliding_attention",) * (n - 1) + ("full_attention",),
        sliding_window=2048, **dr)
    return ModelConfig(
        name="trained-smoke" if smoke else "trained", vocab_size=vocab_size, hidden_size=D,
        num_layers=layers, first_k_dense=1, num_heads=H, n_shared_experts=1,
        max_position_embeddings=4096, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        drafter=drafter, **mla, **moe)


def pair_paths(pair_dir: str | Path = TRAINED_DIR) -> dict[str, Path]:
    p = Path(pair_dir)
    return {"target": p / TARGET_SUBDIR, "drafter": p / DRAFTER_SUBDIR,
            "tokenizer": p / TOKENIZER_FILE, "manifest": p / MANIFEST_FILE}


def pair_present(pair_dir: str | Path = TRAINED_DIR) -> bool:
    """True when a complete pair (both checkpoints and the tokenizer) is in `pair_dir`."""
    ps = pair_paths(pair_dir)
    return ((ps["target"] / "model.safetensors.index.json").is_file()
            and (ps["drafter"] / "model.safetensors").is_file() and ps["tokenizer"].is_file())


def load_pair(pair_dir: str | Path = TRAINED_DIR, device="cpu"):
    """(target KimiModel, DFlashDrafter, tokenizers.Tokenizer) of a trained pair folder."""
    from workbench.checkpoint import load_model
    from workbench.drafter_io import load_drafter

    from .data import load_tokenizer

    ps = pair_paths(pair_dir)
    if not pair_present(pair_dir):
        raise FileNotFoundError(f"{pair_dir}: no trained pair (expected {TARGET_SUBDIR}/, "
                                f"{DRAFTER_SUBDIR}/ and {TOKENIZER_FILE}); run scripts/"
                                "train_gpu.sh or `python -m workbench.train all`")
    return (load_model(ps["target"], device=device), load_drafter(ps["drafter"], device=device),
            load_tokenizer(ps["tokenizer"]))


def pair_size_bytes(pair_dir: str | Path = TRAINED_DIR) -> int:
    return sum(f.stat().st_size for f in Path(pair_dir).rglob("*") if f.is_file())


__all__ = ["BOS_ID", "EOS_ID", "MASK_ID", "PAD_ID", "SPECIAL_TOKENS", "TRAINED_DIR",
           "load_pair", "pair_paths", "pair_present", "pair_size_bytes", "trained_config"]
