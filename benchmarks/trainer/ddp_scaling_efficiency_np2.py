"""Figure ddp_scaling_efficiency_np2: images/s of torchrun --nproc_per_node 2 main_ddp.py
over 2 x main_ddp.py alone, the DDP twin of scaling_efficiency_np2 (scaling_efficiency_np2.py).

The same settings and method as Horovod's figure: the np=1 side confined to half the
cores (the threads each rank gets at np=2), alternating. The machine's ceiling (two
independent processes at once) is measured by scaling_efficiency_np2 and not repeated.
"""
from benchmarks import trainer_runs
from benchmarks.trainer import scaling_efficiency_np2

NAME = "ddp_scaling_efficiency_np2"
GOAL = (">=", 0.90)
DESCRIPTION = "DDP: np=2 images/s over 2 x np=1 images/s, same threads per process"
FULL = dict(trainer_runs.FULL, scaling_repeats=3)
QUICK = dict(trainer_runs.QUICK, scaling_repeats=1)


def run(cfg, ctx):
    return scaling_efficiency_np2.scaling(cfg, ctx, one="ddp", two="ddp2", pair=False)


def markdown(fig):
    return scaling_efficiency_np2.markdown(fig)
