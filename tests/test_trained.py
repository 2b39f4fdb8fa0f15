"""The trained pair: smoke trainer, training twins equal the inference models, corpus and
tokenizer, and (when shipped) the pair in workbench/assets/trained.

CPU, about a minute. The shipped-pair tests skip, saying why, until scripts/train_gpu.sh's
output is unpacked into workbench/assets/trained.
Token-exact checks run with fp32 activations (`decode_mode(fp32=True)`: same weights): in bf16 a
trained MoE model is not batch- or row-count-invariant (a rounding ulp can flip a near-tie in
the top-k routing), so AR and DDTree may part at such a point; report.py measures how often.
"""

import pytest
import torch

from workbench.train import (
    EOS_ID,
    MASK_ID,
    TRAINED_DIR,
    data,
    load_pair,
    pair_present,
    pair_size_bytes,
    trained_config,
)
from workbench.train.__main__ import main
from workbench.train.report import decode_mode, heldout_prompts

SHIPPED = pair_present(TRAINED_DIR)
needs_pair = pytest.mark.skipif(
    not SHIPPED, reason="no trained pair in workbench/assets/trained yet: run "
    "scripts/train_gpu.sh on a GPU, then `cat trained.tar.part* | tar -x -C workbench/assets`")


def _manifest():
    p = TRAINED_DIR / "corpus.json"
    return data.load_manifest(p) if p.exists() else None


# -- smoke trainer (the CI path of `python -m workbench.train smoke`) ------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    rc = main(["smoke", "--out", str(out), "--trace-dir", str(out / "traces")])
    return out, rc


def test_smoke_trainer_runs_and_losses_decrease(smoke):
    import pandas as pd

    out, rc = smoke
    assert rc == 0 and pair_present(out)
    tgt = pd.read_csv(out / "traces" / "train_target.csv")
    assert tgt["val_loss"].iloc[-1] < tgt["val_loss"].iloc[0] - 0.5  # from ~ln(V)
    assert tgt["val_loss_int4"].iloc[-1] < tgt["val_loss_int4"].iloc[0] - 0.5
    dr = pd.read_csv(out / "traces" / "train_drafter.csv")
    assert dr["val_loss"].iloc[-1] < dr["val_loss"].iloc[0] - 0.5


def test_smoke_pair_loads_and_ddtree_equals_ar(smoke):
    from workbench.generate import generate

    out, _ = smoke
    target, drafter, tok = load_pair(out)
    assert target.cfg.vocab_size == tok.get_vocab_size()
    assert drafter.cfg.mask_token_id == MASK_ID == tok.token_to_id("<|mask|>")
    ids = [p["ids"] for p in heldout_prompts(tok, 3, 20, None)]
    with decode_mode(target, drafter, slack=16, fp32=True):
        ar = generate(target, prompts=ids, max_new_tokens=12)
        for budget in (1, 6):
            dd = generate(target, drafter, ids, max_new_tokens=12, budget=budget)
            assert dd.tokens == ar.tokens, budget


# -- training twins compute what the inference models compute --------------------------------
def test_fake_quant_is_exactly_the_export_rule():
    from workbench.reference.int4 import dequant_int4_g32, pack_int4, quantize_int4_g32
    from workbench.train.twin import fake_quant_g32

    g = torch.Generator().manual_seed(0)
    # why: one group all zeros (scale clamp), one with a huge outlier (clamp at -8..7)
    w = torch.randn(5, 96, generator=g) * 0.05
    w[1, :32] = 0.0
    w[2, 40] = 3.0
    q, s = quantize_int4_g32(w)
    assert torch.equal(fake_quant_g32(w), dequant_int4_g32(pack_int4(q), s).float())
    w.requires_grad_(True)
    fake_quant_g32(w).sum().backward()  # straight-through: the gradient is the identity
    assert torch.equal(w.grad, torch.ones_like(w))


@pytest.fixture(scope="module")
def twin_pair():
    from workbench.train.drafter import TrainDrafter, export_drafter
    from workbench.train.target import export_kimi
    from workbench.train.twin import TrainKimi

    torch.manual_seed(0)
    cfg = trained_config(384, smoke=True)
    twin = TrainKimi(cfg).eval()
    twin.quant = True
    with torch.no_grad():  # bf16-representable weights, so export rounds nothing
        for p in twin.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    dtwin = TrainDrafter(cfg.drafter).eval()
    with torch.no_grad():
        for p in dtwin.parameters():
            p.copy_((p * (3 if p.dim() >= 2 else 1)).to(torch.bfloat16).float())
    return twin, export_kimi(twin), dtwin, export_drafter(dtwin)


def _full_forward(km, ids, capture=()):
    from workbench.reference.tree_mla import causal_anc_bits

    n = ids.shape[1]
    return km(ids, torch.arange(n).view(1, -1), km.new_cache(1, n), torch.zeros(1, dtype=torch.long),
              causal_anc_bits(n), capture=capture)


def test_target_twin_equals_kimi_model(twin_pair):
    from workbench.train.target import from_kimi

    twin, km, _, _ = twin_pair
    ids = torch.randint(4, km.cfg.vocab_size, (1, 37), generator=torch.Generator().manual_seed(1))
    ref = _full_forward(km, ids).logits
    with torch.no_grad():
        _, _, lt = twin(ids)
        _, _, lb = from_kimi(km)(ids)  # the drafter trainer's view of the exported target
    for got in (lt, lb):
        cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
        assert cos > 0.9999 and (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.97


def test_drafter_twin_equals_reference_drafter(twin_pair):
    _, km, dtwin, dref = twin_pair
    c = dref.cfg
    S, P = 30, 17
    ids = torch.randint(4, km.cfg.vocab_size, (1, S), generator=torch.Generator().manual_seed(2))
    feats = _full_forward(km, ids, c.target_layer_ids).captured  # [1, S, F] bf16
    block = torch.full((1, c.block_size), c.mask_token_id)
    block[0, 0] = ids[0, P]
    cache = dref.new_cache(1, S)
    dref.materialize(cache, feats, torch.arange(S).view(1, -1), torch.tensor([P]))
    want = dref.forward_block(cache, block, torch.tensor([P]), km).float()
    # why two anchors: blocks of one sequence are trained together and must not see each other
    anchors = torch.tensor([[4, P]])
    blocks = torch.full((1, 2, c.block_size), c.mask_token_id)
    blocks[0, :, 0] = ids[0, anchors[0]]
    emb = km.model.embed_tokens.weight.float()[blocks.view(1, -1)]
    with torch.no_grad():
        got = dtwin(feats.float(), emb, anchors).view(1, 2, c.block_size, -1)[:, 1]
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.9999


# -- corpus and tokenizer ----------------------------------------------------------------------
def test_corpus_rule_and_splits_are_stable():
    assert data.split_of("json/decoder.py") == data.split_of("json/decoder.py")
    assert not data.included("test/test_json.py") and not data.included("idlelib/run.py")
    assert not data.included("encodings/cp1252.py") and not data.included("lib2to3/x/y.py")
    assert data.included("json/decoder.py") and not data.included("json/tests/t.py")
    m = data.build_manifest()
    splits = {f["split"] for f in m["files"]}
    assert splits == set(data.SPLITS) and m["n_heldout"] >= 8
    assert m["list_sha256"] == data.list_hash(f["path"] for f in m["files"])
    shipped = _manifest()
    if shipped is not None:  # the shipped list may come from another Python: same rule, same split
        assert all(f["split"] == data.split_of(f["path"]) for f in shipped["files"])
        assert "held-out files present" in data.manifest_report(shipped) or \
            "exactly" in data.manifest_report(shipped)


def test_tokenizer_roundtrips_heldout_files():
    if SHIPPED:
        tok = data.load_tokenizer(TRAINED_DIR / "tokenizer.json")
    else:  # the same trainer on a few training files
        tok = data.train_tokenizer([f.text for f in data.read_split("train", limit=8)], 384)
    held = data.read_split("heldout", _manifest())
    assert len(held) >= 8
    for f in held:
        ids = data.encode(tok, f.text)
        assert EOS_ID not in ids and data.decode(tok, ids) == f.text, f.path


# -- the shipped pair --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    return load_pair(TRAINED_DIR)


@needs_pair
def test_shipped_pair_loads_and_fits(shipped):
    target, drafter, tok = shipped
    assert pair_size_bytes(TRAINED_DIR) <= 25_000_000
    assert target.cfg.name == "trained" and target.cfg.vocab_size == tok.get_vocab_size()
    assert drafter.cfg.hidden_size == target.cfg.hidden_size
    assert (TRAINED_DIR / "README.md").is_file()


@pytest.fixture(scope="module")
def shipped_ar(shipped):
    from workbench.generate import generate

    target, drafter, tok = shipped
    ids = [p["ids"] for p in heldout_prompts(tok, 4, 64, _manifest())]
    with decode_mode(target, drafter, slack=16, fp32=True):
        return ids, generate(target, prompts=ids, max_new_tokens=32)


@needs_pair
@pytest.mark.parametrize("budget", [1, 8, 32])
def test_shipped_pair_ddtree_equals_ar_on_heldout_prompts(shipped, shipped_ar, budget):
    from workbench.generate import generate

    target, drafter, tok = shipped
    ids, ar = shipped_ar
    with decode_mode(target, drafter, slack=16, fp32=True):
        dd = generate(target, drafter, ids, max_new_tokens=32, budget=budget)
    assert dd.tokens == ar.tokens
    assert dd.tokens_per_step > (1.3 if budget == 1 else 2.0)  # the trained drafter is accepted
    text = data.decode(tok, ar.tokens[0])
    assert len(text) > 32 and text.isascii()
