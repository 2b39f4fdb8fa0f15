"""YaRN rotary embeddings (DeepSeek-V3 / Kimi K2 frequencies), both pair layouts.

Target MLA: pairs (2i, 2i+1) interleaved (GPT-J style; `view_as_complex` in DeepSeek's code).
DFlash drafter (Qwen3): rotate-half pairs (i, i + d/2) over the full head dim.
The YaRN cos/sin attention factor is mscale(f, mscale) / mscale(f, mscale_all_dim), 1 for K2.
"""

from __future__ import annotations

import math

import torch


def _yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, base: float, factor: float, original_max_position: int,
                  beta_fast: float, beta_slow: float) -> torch.Tensor:
    """[dim/2] float64 inverse frequencies with YaRN's linear ramp between the correction dims."""
    # explicit CPU: models are built under torch.device("meta")
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim)
    if factor <= 1.0:
        return inv

    def correction_dim(n_rot: float) -> float:
        return dim * math.log(original_max_position / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
    return inv / factor * ramp + inv * (1 - ramp)


def target_rope(cfg) -> Rope:
    """The target's MLA rope over the qk_rope dims, interleaved pairs (a ModelConfig)."""
    return Rope(cfg.qk_rope_dim, cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max_position,
                cfg.rope_beta_fast, cfg.rope_beta_slow, cfg.rope_mscale, cfg.rope_mscale_all_dim,
                interleaved=True)


def drafter_rope(cfg) -> Rope:
    """The DFlash drafter's Qwen3 rope: rotate-half YaRN on the full head (a DrafterConfig).

    mscale == mscale_all_dim == 1, so the cos/sin attention factor is 1 and the softmax scale
    stays head_dim^-0.5."""
    return Rope(cfg.head_dim, cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max_position,
                cfg.rope_beta_fast, cfg.rope_beta_slow, interleaved=False)


class Rope:
    """cos/sin at integer positions for one head width; `apply` rotates the last dim."""

    def __init__(self, dim: int, base: float, factor: float, original_max_position: int,
                 beta_fast: float, beta_slow: float, mscale: float = 1.0,
                 mscale_all_dim: float = 1.0, interleaved: bool = True):
        self.dim = dim
        self.interleaved = interleaved
        self.inv_freq = yarn_inv_freq(dim, base, factor, original_max_position, beta_fast,
                                      beta_slow)
        self.attn_factor = _yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor,
                                                                              mscale_all_dim)
        self._inv_freq_on: dict[torch.device, torch.Tensor] = {}
        self._tables: dict[torch.device, torch.Tensor] = {}  # reserve(): [n, dim] cos | sin

    def inv_freq_on(self, device: torch.device) -> torch.Tensor:
        """inv_freq on `device`, copied once: a per-call host->device copy would sync every
        layer and cannot be captured in a CUDA graph."""
        t = self._inv_freq_on.get(device)
        if t is None:
            t = self._inv_freq_on[device] = self.inv_freq.to(device)
        return t

    def reserve(self, n: int, device) -> None:
        """Tabulate cos/sin for positions [0, n) on `device` (a cache of n slots calls this):
        later `cos_sin` calls there gather rows (one kernel) instead of ~10 float64 kernels
        per call. The rows are the per-call values bit for bit (same float64 math, same
        device). Positions must then stay below the largest n reserved (cache slots do)."""
        pos = torch.arange(n, device=device)
        table = self._tables.get(pos.device)
        if table is None or table.shape[0] < n:
            self._tables[pos.device] = torch.cat(self._compute(pos), -1)  # [n, dim] cos | sin

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq_on(positions.device)
        return ((ang.cos() * self.attn_factor).float(), (ang.sin() * self.attn_factor).float())

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [...] int -> cos, sin [..., dim/2] float32 (angles in float64)."""
        table = self._tables.get(positions.device)
        return self._compute(positions) if table is None else table_rows(table, positions)

    def table(self, device) -> torch.Tensor:
        """The reserved [n, dim] fp32 cos | sin table on `device` (what the "rope" op reads).
        Raises ValueError when `reserve` was not called there: the op has no fallback, since
        tabulating on the fly would need max(positions), a host sync (KimiModel.new_cache and
        DistKimiModel.new_cache reserve their cache length)."""
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:  # reserve keys tensors' devices: cuda:i
            dev = torch.device("cuda", torch.cuda.current_device())
        t = self._tables.get(dev)
        if t is None:
            raise ValueError(f"rope table: none reserved on {dev}; call Rope.reserve(n, device) "
                             "first (a model's new_cache does)")
        return t

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., S, (heads,) dim] at positions [..., S]; heads broadcast. fp32 math, x.dtype out."""
        cos, sin = self.cos_sin(positions)
        return rotate(x, positions, cos, sin, self.interleaved)


def rotate(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """Rope.apply's math once cos, sin [..., S, dim/2] are gathered (shared by the op)."""
    if x.dim() == positions.dim() + 2:  # a heads axis between S and dim
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def table_rows(table: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., R/2] fp32: the rows of a reserved cos | sin table [n, R] at positions."""
    cs = table[positions]  # [..., R]
    half = table.shape[-1] // 2
    return cs[..., :half], cs[..., half:]


def rope(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor,
         interleaved: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """The "rope" op's reference: x [..., S, (H,) R] rotated at int positions [..., S] with the
    cos | sin rows of table [n, R] fp32 (Rope.table). Bit for bit Rope.apply (the same gather
    and the same `rotate`), x.dtype out. interleaved: pairs (2i, 2i+1) (target MLA), else
    rotate-half pairs (i, i + R/2) (drafter). out: a view of x's shape to write instead (the
    model's q buffer [..., C:]); returned."""
    y = rotate(x, positions, *table_rows(table, positions), interleaved)
    return y if out is None else out.copy_(y)
