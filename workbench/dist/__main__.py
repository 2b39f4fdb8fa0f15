"""`python -m workbench.dist` = `python -m workbench generate` on several ranks.

    torchrun --nproc-per-node 8 -m workbench.dist --preset tiny-dist --ep 8 --budget 8
    python -m workbench.dist --preset tiny-dist --tp 4        # starts 4 ranks itself
"""

import argparse
import sys

from workbench.__main__ import _ids

from .decode import generate_main_distributed


def add_dist_args(p: argparse.ArgumentParser) -> None:
    """The flags `python -m workbench generate` needs for the distributed path."""
    p.add_argument("--tp", type=int, default=None, help="MoE width split (ranks = tp x ep)")
    p.add_argument("--ep", type=int, default=None, help="MoE expert groups (ranks = tp x ep)")
    p.add_argument("--nvls", action="store_true", help="NVLink multicast on (NCCL; default off)")
    p.add_argument("--drafter-layout", choices=("replicated", "tp"), default="replicated",
                   help="the DFlash drafter on every rank whole, or split over the ranks (its "
                        "heads, MLP width and fc: workbench/dist/drafter.py)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before all ranks end")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.dist", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny-dist", help="tiny-dist | tiny | small | kimi-k2.6")
    p.add_argument("--checkpoint")
    p.add_argument("--drafter-checkpoint")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-ids", type=_ids, action="append")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--stop-ids", type=_ids, default=None)
    p.add_argument("--kernels")
    p.add_argument("--json", action="store_true")
    add_dist_args(p)
    return generate_main_distributed(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
