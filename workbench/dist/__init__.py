"""The decode loop on several ranks (torch.distributed): layouts, the sharded model, launch,
and the single-rank emulation of 8 GPUs.

    from workbench.dist import run_distributed, dist_generate
    out = run_distributed(dist_generate, 8, "tiny-dist", prompts, ep=8, budget=8)
    out["result"].tokens, out["ranks"]          # rank 0's GenerateResult, per-rank timings

    torchrun --nproc-per-node 8 -m workbench.dist --ep 8 --budget 8 --device cuda
    python -m workbench.dist.emulate --preset kimi-k2.6 --ctx 4096 --tau 3 --csv out.csv

layout.py  who holds what (Layout, shard_tensor, the exact reduction mode, cache cost)
comm.py    collectives behind one interface, timed and byte-counted per phase
moe.py     MoE-TP (all-reduce) and EP / EP x TP (all_to_all_single, exact slot-order combine;
           engine path: `ep_dispatch("local")` runs each rank's experts on the replicated stream)
model.py   DistKimiModel: KimiModel's decode interface on one rank's shard
vocab.py   vocab-parallel argmax / Gumbel sampling / log-softmax top-K; DistDrafter
launch.py  run_distributed (watchdog, clear errors), NCCL settings (NVLink multicast off)
decode.py  dist_generate (one rank's loop), generate_main_distributed (CLI / torchrun)
check.py   token comparison with the stated tie rule
emulate.py rank 0's real step with modelled collectives -> projected tokens/s
"""

from .decode import dist_config, dist_generate, generate_main_distributed
from .launch import DistributedError, DistributedTimeout, run_distributed
from .layout import Layout, LayoutError, latent_cache_bytes
from .model import DistKimiModel, build_dist_model

__all__ = [
    "DistKimiModel", "DistributedError", "DistributedTimeout", "Layout", "LayoutError",
    "build_dist_model", "dist_config", "dist_generate", "generate_main_distributed",
    "latent_cache_bytes", "run_distributed",
]
