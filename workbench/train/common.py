"""Pieces both trainers share: seeding, precision, the LR schedule, the optimizer, CSV logs."""

from __future__ import annotations

import contextlib
import csv
import math
import random
from pathlib import Path

import torch


def setup(seed: int, device: str) -> torch.device:
    """Seed every generator; TF32 matmuls on GPU (the fp32 parts are norms and the router)."""
    random.seed(seed)
    torch.manual_seed(seed)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return dev


def autocast(dev: torch.device):
    """bf16 autocast on GPU; plain fp32 on CPU (bf16 matmuls on a laptop CPU are slow)."""
    if dev.type == "cuda":
        return torch.autocast("cuda", torch.bfloat16)
    return contextlib.nullcontext()


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup to `peak`, then cosine down to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(model: torch.nn.Module, lr: float, weight_decay: float, fused: bool):
    """AdamW; no decay on norms and biases (1-D), decay on matrices and embeddings."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


class CsvLog:
    """Append rows (dicts) to a CSV; the header is the union of keys of the first row."""

    def __init__(self, path: Path | str | None):
        self.path = Path(path) if path else None
        self.rows: list[dict] = []
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if not self.path:
            return
        keys = list(self.rows[0])
        new = not self.path.exists()
        with self.path.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow({k: row.get(k, "") for k in keys})


def fmt(x: float) -> float:
    return float(f"{x:.5g}")
