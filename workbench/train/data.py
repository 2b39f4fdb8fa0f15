"""Corpus, tokenizer and token streams: the Python standard library every machine has offline.

Corpus rule (RULE_VERSION 1), applied to the running interpreter's
`sysconfig.get_paths()["stdlib"]`:
  * every `*.py` file, as a sorted list of '/'-separated paths relative to that folder,
  * except test suites (any `test/` or `tests/` folder), `site-packages/`, `idlelib/`,
    `lib2to3/` (its fixture files), `turtledemo/`, `tkinter/` (absent where Tk is a separate
    package), `ensurepip/`, `distutils/` (gone in 3.12), `__phello__/`, and generated data
    tables: `encodings/` (gencodec charmaps), `pydoc_data/` (a 700 KB generated dict),
    `html/entities.py`, `stringprep.py`,
  * and files that are not UTF-8.
Splits by h = int(sha256(path)[:8], 16) % 100, so a file's split never depends on which other
files exist (stable across Python versions):
  * heldout  h < 10: never seen by the tokenizer or either model (test prompts, round-trips);
  * drafter  10 <= h < 25: never seen by the target; the drafter's training prompts come from
    here, so the target's continuations it learns are of text the target has not memorised,
    like the held-out prompts it is measured on (continuations of memorised training text are
    far easier to draft, and a drafter trained on them overestimates itself);
  * train    the rest: the tokenizer and the target train on these.

The list differs between Python versions (3.11 here, 3.12 on the GPU box), so a run writes a
manifest (`corpus.json`: Python version, every path with its bytes, sha256 and split, and the
sha256 of the path list) and a later run given `--manifest` trains only on the listed training
files present locally, reporting what differs (`manifest_report`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from . import SPECIAL_TOKENS

RULE_VERSION = 2
HELDOUT_PERCENT, DRAFTER_PERCENT = 10, 15
SPLITS = ("train", "drafter", "heldout")
EXCLUDED_DIRS = ("site-packages/", "idlelib/", "lib2to3/", "turtledemo/", "tkinter/",
                 "ensurepip/", "distutils/", "__phello__/", "encodings/", "pydoc_data/")
EXCLUDED_FILES = ("html/entities.py", "stringprep.py")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def included(rel: str) -> bool:
    """The path rule above (rel is '/'-separated, relative to the stdlib folder)."""
    parts = rel.split("/")
    return (rel.endswith(".py") and not rel.startswith(EXCLUDED_DIRS)
            and rel not in EXCLUDED_FILES and "test" not in parts[:-1]
            and "tests" not in parts[:-1])


def split_of(rel: str) -> str:
    h = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 100
    return ("heldout" if h < HELDOUT_PERCENT else
            "drafter" if h < HELDOUT_PERCENT + DRAFTER_PERCENT else "train")


def is_heldout(rel: str) -> bool:
    return split_of(rel) == "heldout"


def list_hash(paths) -> str:
    return hashlib.sha256("\n".join(sorted(paths)).encode()).hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def build_manifest(root: Path | None = None) -> dict:
    """The corpus of this interpreter: every included file with its bytes, sha256 and split."""
    root = root or stdlib_root()
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if not included(rel):
            continue
        text = _read(p)
        if text is None:
            continue
        data = text.encode()
        files.append({"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "split": split_of(rel)})
    return {
        "rule_version": RULE_VERSION, "heldout_percent": HELDOUT_PERCENT,
        "drafter_percent": DRAFTER_PERCENT,
        "python": platform.python_version(), "implementation": sys.implementation.name,
        "stdlib": str(root), "n_files": len(files),
        "n_heldout": sum(f["split"] == "heldout" for f in files),
        "n_drafter": sum(f["split"] == "drafter" for f in files),
        "bytes": sum(f["bytes"] for f in files),
        "list_sha256": list_hash(f["path"] for f in files), "files": files,
    }


def load_manifest(path) -> dict:
    """A corpus.json; refuses one written under another rule version (its splits differ)."""
    m = json.loads(Path(path).read_text())
    if m.get("rule_version") != RULE_VERSION:
        raise ValueError(f"{path}: corpus rule version {m.get('rule_version')}, this code uses "
                         f"{RULE_VERSION}; train without --manifest to write a new one")
    return m


def save_manifest(manifest: dict, path) -> Path:
    Path(path).write_text(json.dumps(manifest, indent=1) + "\n")
    return Path(path)


def manifest_report(manifest: dict, root: Path | None = None) -> str:
    """One paragraph: does this interpreter's stdlib match the manifest a pair was trained on?"""
    here = build_manifest(root)
    if here["list_sha256"] == manifest["list_sha256"]:
        same = sum(a["sha256"] == b["sha256"] for a, b in zip(here["files"], manifest["files"]))
        return (f"corpus: this Python {here['python']} gives the manifest's file list exactly "
                f"({manifest['n_files']} files, list sha256 {manifest['list_sha256'][:12]}); "
                f"{same} of them have identical contents")
    mine, theirs = {f["path"] for f in here["files"]}, {f["path"] for f in manifest["files"]}
    held = {f["path"] for f in manifest["files"] if f["split"] == "heldout"}
    return (f"corpus: trained on Python {manifest['python']} ({manifest['n_files']} files, "
            f"list sha256 {manifest['list_sha256'][:12]}); this is Python {here['python']} "
            f"({here['n_files']} files, list sha256 {here['list_sha256'][:12]}): "
            f"{len(mine & theirs)} in common, {len(theirs - mine)} missing here, "
            f"{len(mine - theirs)} extra here; {len(held & mine)} of {len(held)} held-out files "
            "present")


@dataclass
class CorpusFile:
    path: str
    text: str


def read_split(split: str, manifest: dict | None = None, root: Path | None = None,
               limit: int | None = None) -> list[CorpusFile]:
    """Files of one split ('train' | 'drafter' | 'heldout') present here, sorted by path.

    With a manifest, only its files of that split (the training run's list); without one, this
    interpreter's own list. `limit` keeps the first n (smoke runs).
    """
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    root = root or stdlib_root()
    if manifest is None:
        paths = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.py"))]
        paths = [r for r in paths if included(r) and split_of(r) == split]
    else:
        paths = [f["path"] for f in manifest["files"] if f["split"] == split]
    out = []
    for rel in paths:
        text = _read(root / rel) if (root / rel).is_file() else None
        if text is not None:
            out.append(CorpusFile(rel, text))
        if limit is not None and len(out) >= limit:
            break
    return out


# -- tokenizer -------------------------------------------------------------------------------
def train_tokenizer(texts, vocab_size: int):
    """Byte-level BPE (GPT-2 pre-tokenizer, no normalizer): every byte string round-trips.

    The special tokens take ids 0..3 (bos, eos, mask, pad), then the 256 byte symbols, then
    merges up to `vocab_size`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"tokenizer: expected {s} at id {i}, got {tok.token_to_id(s)}")
    return tok


def load_tokenizer(path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok, ids) -> str:
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


def token_stream(tok, files: list[CorpusFile]) -> torch.Tensor:
    """All files as one int32 stream: <|bos|> file <|eos|> <|bos|> file <|eos|> ..."""
    from . import BOS_ID, EOS_ID

    encs = tok.encode_batch([f.text for f in files], add_special_tokens=False)
    ids: list[int] = []
    for e in encs:
        ids += [BOS_ID, *e.ids, EOS_ID]
    return torch.tensor(ids, dtype=torch.int32)


def sample_windows(stream: torch.Tensor, batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
    """[batch, seq] int64 windows at uniform random starts of the stream."""
    if stream.numel() < seq + 1:
        raise ValueError(f"stream: expected at least {seq + 1} tokens, got {stream.numel()}")
    starts = torch.randint(0, stream.numel() - seq, (batch,), generator=g)
    idx = starts.view(-1, 1) + torch.arange(seq).view(1, -1)
    return stream[idx].long()


# -- prompts ---------------------------------------------------------------------------------
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+", re.M)


def function_prompts(tok, files: list[CorpusFile], n: int, prompt_tokens: int = 64,
                     min_body_tokens: int = 32) -> list[dict]:
    """`n` prompts: the first `prompt_tokens` tokens of functions of the given files.

    A function starts at its `def` line (indentation included) and must be followed by at least
    `min_body_tokens` more tokens of its file. Files are visited round-robin in path order and,
    inside a file, functions are taken in the order of sha256(path:offset), so the prompts
    spread over files and functions deterministically. Returns dicts with path, offset, ids.
    """
    per_file = []
    for f in files:
        offs = sorted((m.start() for m in _DEF.finditer(f.text)),
                      key=lambda o: hashlib.sha256(f"{f.path}:{o}".encode()).hexdigest())
        per_file.append((f, offs))
    out, rnd = [], 0
    while len(out) < n and any(len(o) > rnd for _, o in per_file):
        for f, offs in per_file:
            if rnd >= len(offs) or len(out) >= n:
                continue
            ids = encode(tok, f.text[offs[rnd]:offs[rnd] + 16 * (prompt_tokens + min_body_tokens)])
            if len(ids) >= prompt_tokens + min_body_tokens:
                out.append({"path": f.path, "offset": offs[rnd], "ids": ids[:prompt_tokens]})
        rnd += 1
    return out
