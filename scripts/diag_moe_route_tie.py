"""Why did dense moe_route triton_v1 pick another 8th expert than the float64 reference at
T 544, seed 0, row 324 (tests/test_moe_route_op.py::test_real_widths_match_the_reference)?
Prints the reference's choices around the K/K+1 boundary of every row where triton_v1 or
torch_bf16 differ from it, with the margin, and the two variants' own choices there."""

from __future__ import annotations

import torch

from workbench.config import ModelConfig
from workbench.kernels.dense.moe_route_triton_v1 import moe_route as tri
from workbench.kernels.dense.torch_bf16 import moe_route as tbf
from workbench.reference.moe_route import moe_route as ref


def main() -> None:
    cfg = ModelConfig.preset("kimi-k2.6")
    D, E, K, sc = cfg.hidden_size, cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.routed_scaling_factor
    for seed in (0, 1):
        for T in (1, 17, 544):
            g = torch.Generator(device="cuda").manual_seed(seed)
            h = torch.randn(T, D, generator=g, device="cuda").to(torch.bfloat16)
            w = (torch.randn(E, D, generator=g, device="cuda") * D**-0.5).to(torch.bfloat16)
            b = 0.02 * torch.randn(E, generator=g, device="cuda")
            ids_r, _ = ref(h, w, b, K, sc)
            ids_t, _ = tri(h, w, b, K, sc)
            ids_b, _ = tbf(h, w, b, K, sc)
            s64 = torch.sigmoid(h.double() @ w.double().t())
            ch_r = s64.float() + b
            ch_b = torch.sigmoid(torch.mm(h, w.t(), out_dtype=torch.float32)) + b
            bad_t = (ids_t != ids_r).any(1).nonzero().flatten().tolist()
            bad_b = (ids_b != ids_r).any(1).nonzero().flatten().tolist()
            print(f"seed {seed} T {T}: triton_v1 differs at rows {bad_t}, torch_bf16 at {bad_b}")
            for r in sorted(set(bad_t) | set(bad_b)):
                top = torch.sort(ch_r[r], descending=True, stable=True)
                k8, k9 = top.indices[K - 1].item(), top.indices[K].item()
                print(f"  row {r}: ref slot 8 = {k8} ({top.values[K - 1].item():.9g}), slot 9 = {k9} "
                      f"({top.values[K].item():.9g}), margin {top.values[K - 1].item() - top.values[K].item():.3g}; "
                      f"torch_bf16 choices {ch_b[r, k8].item():.9g} / {ch_b[r, k9].item():.9g}; "
                      f"ids ref {ids_r[r].tolist()} tri {ids_t[r].tolist()} bf16 {ids_b[r].tolist()}")


if __name__ == "__main__":
    main()
