"""Figure horovod_compiled_over_ddp_cluster_400g: horovod_compiled_over_ddp_cluster_100g (whose
docstring says what is measured) with 400 Gb/s between nodes."""
from benchmarks.scaling import horovod_compiled_over_ddp_cluster_100g as at_100g

NAME = "horovod_compiled_over_ddp_cluster_400g"
GBPS = 400
GOAL, FULL, QUICK = at_100g.GOAL, at_100g.FULL, at_100g.QUICK
DESCRIPTION = "Horovod --compile (regions) efficiency over DDP's, 32 emulated H100s, 400 Gb/s between nodes"
markdown = at_100g.markdown


def run(cfg, ctx):
    return at_100g.measure(cfg, ctx, GBPS)
