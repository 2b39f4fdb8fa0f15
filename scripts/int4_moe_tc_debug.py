"""Where cuda_v24's TC launch goes wrong (a GPU diagnosis, not a test): on one Kimi MoE layer at
skewed routing, inside the op's hot hook, (1) the gather kernel against its CPU twin, (2) the
TC launch's rows of h against cuda_v10's hot launch on the same experts (both into NaN-poisoned
h, on one stream), per hot expert and pass: how many rows and columns are NaN or off, for the
default knobs and each variant given, with xg NaN- or zero-filled before the gather (a
difference says the kernel reads rows the gather never wrote).

    python3 scripts/int4_moe_tc_debug.py [--T 17,128] [--cfgs "TNT=4;TNT=8;TST=2;TY=1"]

Session 53 call 1 (H100): the smoke's T 128 / 512 came back NaN on ~every token with a hot
expert, T 17 passed. Call 2 (this script): the N 64 / 128 passes wrong, N 32 right but at TNT 8,
every pass right under compute-sanitizer: a race, found in the SASS (the next scale group's
dequant wrote the A registers of wgmmas still in flight; fixed with two A buffers)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _cfgs(text: str) -> list[dict]:
    out = [{}]
    for part in filter(None, text.split(";")):
        out.append({k: int(v) for k, v in (kv.split("=") for kv in part.split(","))})
    return out


def _rows(h: torch.Tensor, start: int, cnt: int) -> torch.Tensor:
    """h [S, 2, Ip] bf16 hi | lo -> the expert's rows as fp32 [cnt, Ip]."""
    r = h[start:start + cnt].float()
    return r[:, 0] + r[:, 1]


def _report(tag: str, h_tc, h_ref, meta, thr: int, P: int) -> bool:
    _, act_e, starts, cnts, n_act = (t.cpu() for t in meta)
    all_ok = True
    lines = []
    for a in range(int(n_act[0])):
        start, cnt = int(starts[a]), int(cnts[a])
        if cnt <= thr:
            continue
        got, want = _rows(h_tc, start, cnt), _rows(h_ref, start, cnt)
        nan = got.isnan()
        off = ~nan & ((got - want).abs() > 2e-2 + 2e-2 * want.abs())
        bad = nan | off
        if not bad.any():
            lines.append(f"  expert {int(act_e[a])} ({cnt} slots): ok, max |d| "
                         f"{(got - want).abs().max().item():.2e}")
            continue
        all_ok = False
        per_pass = []
        for p0 in range(0, cnt, P):
            b = bad[p0:p0 + P]
            rows = b.any(1).nonzero().flatten().tolist()
            cols = b.any(0).nonzero().flatten()
            per_pass.append(f"pass {p0 // P} ({min(P, cnt - p0)} slots): {len(rows)} rows bad "
                            f"(first {rows[:6]}, r%8 {sorted({r % 8 for r in rows})}), "
                            f"{cols.numel()} cols (first {cols[:6].tolist()}, col//128 "
                            f"{sorted(set((cols // 128).tolist()))[:17]}), "
                            f"nan {int(nan[p0:p0 + P].sum())} off {int(off[p0:p0 + P].sum())}")
        lines.append(f"  expert {int(act_e[a])} ({cnt} slots) BAD: " + "; ".join(per_pass))
    print(f"{tag}: {'ok' if all_ok else 'BAD'}")
    for ln in lines[:24]:
        print(ln)
    return all_ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", default="17,128")
    ap.add_argument("--skew", type=float, default=1.2)
    ap.add_argument("--cfgs", default="TNT=4;TNT=8;TST=2;TY=1", help="TC knob variants, ';'")
    a = ap.parse_args(argv)
    from int4_moe_smoke import draw, kimi_layer  # (this folder: the smoke's layer and draws)

    from workbench.kernels.int4_moe import cuda_v10, cuda_v17, cuda_v24, mma_layout

    ex, E, K, D = kimi_layer()
    variants = _cfgs(a.cfgs)
    real_xg_empty = cuda_v24.xg_empty
    state = {"ok": True}

    def hook(c, p, xq, w1, s1, NU1, C1, h):
        thr = c.get("WB", 0) or c["WT"]
        n_act = int(p.meta[4][0])
        hot = [(int(s), int(n)) for s, n in zip(p.meta[2][:n_act].tolist(),
                                                 p.meta[3][:n_act].tolist()) if n > thr]
        print(f"T {xq.shape[0]}: S {p.S}, WT {c['WT']}, WB {c.get('WB', 0)}, hot experts past "
              f"{thr}: {len(hot)} with {[n for _, n in hot]} slots", flush=True)
        if hot:
            KP = C1 * mma_layout.CHUNK
            want = cuda_v24.xgather_reference(xq.cpu(), p, thr, KP)
            xg = real_xg_empty(p, KP, xq.device).fill_(float("nan"))
            got = cuda_v24.xgather(xq, p, thr, KP, xg).cpu()
            same = torch.equal(got.isnan(), want.isnan())
            w = ~want.isnan()
            print(f"  xgather vs its twin: written rows same {same}, values same "
                  f"{same and torch.equal(got[w], want[w])}", flush=True)
            h_ref = torch.full_like(h, float("nan"))
            cuda_v10.launch_hot(c | {"WT": thr, "WS": 0}, p, xq, w1, s1, NU1, C1, h_ref)
            for v in variants:
                for fill in (float("nan"), 0.0):
                    cuda_v24.xg_empty = (lambda *args, f=fill: real_xg_empty(*args).fill_(f))
                    try:
                        h_tc = torch.full_like(h, float("nan"))
                        cv = c | v | {"WS": 0}
                        cuda_v24.launch_tc(cv, p, xq, w1, s1, NU1, C1, h_tc, thr)()
                        torch.cuda.synchronize()
                    finally:
                        cuda_v24.xg_empty = real_xg_empty
                    tag = f"  TC {v or 'default'} xg {'NaN' if fill != fill else 'zero'}-filled"
                    state["ok"] &= _report(tag, h_tc, h_ref, p.meta, thr, 8 * cv["TNT"])
        return cuda_v24.launch_bands_tc(c, p, xq, w1, s1, NU1, C1, h)

    op, _ = cuda_v17.on_tiles(cuda_v24.tiles, "", hot_for=hook)
    for T in (int(t) for t in a.T.split(",")):
        x, ids, w = draw(T, a.skew, E, K, D)
        op(x, ids, w, ex)
        torch.cuda.synchronize()
    return 0 if state["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
