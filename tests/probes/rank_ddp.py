"""Run main_ddp.main() under torchrun and save what THIS rank ended with.

    torchrun --nproc_per_node 2 tests/probes/rank_ddp.py OUT_DIR [main_ddp.py flags]

Each rank writes OUT_DIR/rank<r>.pt with its model state and metric history,
and where it ran (its host's name, the world and local sizes), as rank_horovod.py
does for Horovod, so tests can compare ranks with each other.
"""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import main_ddp  # noqa: E402

if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    model, result = main_ddp.main(argv)
    torch.save({"model": model.state_dict(), "result": result, "size": dist.get_world_size(),
                "local_size": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                "threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0)),
                "host": socket.gethostname()},
               os.path.join(out, f"rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()
