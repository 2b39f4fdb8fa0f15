"""Which kernels one MoE layer of the emulated EP rank launches, in order (CPU, no GPU needed).

Runs one verify forward of a config's EP rank 0 (tiny, EP4 by default) with the engine preset
(Triton under the interpreter) and prints, for one layer (the first MoE router to the next),
every registry op call and every aten op that launches a kernel on a GPU (views, reshapes and
other metadata-only ops are left out): the list to shrink when fusing the glue between our
kernels. The one forward also shows first-call work (the engine path's weight stacking: a
cat). Usage:
    TRITON_INTERPRET=1 python3 scripts/layer_ops.py [--config tiny] [--layout ep4] [--rows 17]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workbench import ops
from workbench.dist.emulate import rank_model
from workbench.dist.moe import op_activations
from workbench.ops.registry import wrapping

# aten ops that only make views or read metadata: no kernel on a GPU
FREE = {"view", "_unsafe_view", "reshape", "slice", "select", "expand", "unsqueeze", "squeeze",
        "permute", "transpose", "t", "as_strided", "alias", "detach", "split", "unbind",
        "empty", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "_to_copy?",
        "sym_size", "is_same_size", "view_as_real", "view_as_complex", "split_with_sizes",
        "_reshape_alias", "t_", "numel", "dim", "stride", "size", "item"}


class Log(TorchDispatchMode):
    """Logs the aten ops the model runs between registry ops (inside an op: its own kernels,
    not glue; under the interpreter a Triton launch also shows as set_/copy_ noise)."""

    def __init__(self, events):
        super().__init__()
        self.events, self.depth = events, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE and not self.depth:
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)][:3]
            self.events.append(f"  aten.{name} {shapes}")
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--rows", type=int, default=17, help="verify rows N (budget + 1)")
    ap.add_argument("--layout", default="ep4", help="tp<W> / ep<W> / ep<A>xtp<B> (tiny: 4 heads)")
    a = ap.parse_args()
    world = 1
    for part in a.layout.lower().split("x"):
        world *= int(part[2:])
    model, comm = rank_model(a.config, a.layout, world=world)
    cfg, N = model.cfg, a.rows
    cache = model.new_cache(1, 64 + N)
    for layer in cache:
        layer[:, :64].normal_()
    prefix = torch.full((1,), 64, dtype=torch.long)
    anc = torch.ones(1, N, 1, dtype=torch.long)  # every row sees the first (chain-free star)
    pos = (64 + torch.arange(N)).view(1, N)
    tokens = torch.randint(0, cfg.vocab_size, (1, N))
    events: list[str] = []

    log = Log(events)

    def wrap(name, fn):
        def call(*args, **kw):
            events.append(f"OP {name}")
            log.depth += 1
            try:
                return fn(*args, **kw)
            finally:
                log.depth -= 1
        return call

    with torch.no_grad(), ops.use("engine"), op_activations(torch.bfloat16), wrapping(wrap), log:
        model(tokens, pos, cache, prefix, anc, want_logits=False)
    # one layer's worth of calls: from the first MoE layer's router to the next router (its
    # MoE half, then the next layer's attention half)
    routes = [i for i, e in enumerate(events) if e == "OP moe_route"]
    layer = events[routes[0]:routes[1] if len(routes) > 1 else len(events)]
    print("\n".join(layer))
    n = sum(e.startswith("  aten") for e in layer)
    print(f"\n{n} aten kernel ops + {sum(e.startswith('OP') for e in layer)} op calls; by name:",
          Counter(e.split()[0] for e in layer if e.startswith("  aten")).most_common())


if __name__ == "__main__":
    main()
