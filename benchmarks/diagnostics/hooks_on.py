"""main_horovod.py at np=1 with DistributedOptimizer's gradient hooks on, as at every np >= 2,
and Horovod's elastic mode off.

    python -m benchmarks.diagnostics.hooks_on [main_horovod.py flags]

DistributedOptimizer registers its hooks only when size() > 1 or HOROVOD_ELASTIC=1, and Horovod
reads HOROVOD_ELASTIC once more at init, where it also turns on elastic mode in its core (on
GPUs, a polling wait for each allreduce instead of cudaEventSynchronize). Here Horovod is
initialised first, without it, and the variable is set afterwards, for the optimizer's check
alone: each step then allreduces every gradient from its hook, as a job of several processes
does, with nothing else changed. main_horovod.main's own hvd.init() finds Horovod initialised.
Benchmarks only: the trainers never run it.
"""
import os
import sys

import horovod.torch as hvd

import main_horovod
from training.ports import hvd_port
from training.run import launch

if __name__ == "__main__":
    hvd_port.apply()  # the ports' CUDA settings, which main_horovod.main would set before its init
    hvd.init()
    os.environ["HOROVOD_ELASTIC"] = "1"
    sys.exit(launch.run_cli(main_horovod.main))
