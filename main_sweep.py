"""Train many runs as one MPI job, each a main_horovod.py run on its own share of the job's
processes: one per combination of --sweep values (a grid), or the trials of an Optuna study
(--search), each in a folder of CHECKPOINT_DIR.

  mpirun -np 8 python main_sweep.py --arch resnet18 --sweep lr=0.05,0.1,0.2,0.4 --sweep seed=0,1
  srun --mpi=pmix python main_sweep.py --sweep seed=0,1,2,3          # under Slurm
  horovodrun -np 4 --mpi python main_sweep.py --sweep lr=0.05,0.1
  mpirun -np 8 python main_sweep.py --search lr=log:0.01:1 --search weight-decay=log:1e-5:1e-3 \\
      --trials 40 --epochs 30

The other flags are main_horovod.py's, and every run gets them. CHECKPOINT_DIR/sweep.csv and
sweep.svg sum a grid up, search.csv and search.svg a study (CHECKPOINT_DIR/study.journal);
submitting the same command again continues what was left.
"""
import sys

import main_horovod
from sweeps import flags, search, sweep
from training.base.errors import UsageError
from training.run import launch


def main(argv=None):
    args = flags.parse_args(__doc__, argv)
    if args.search:
        return search.run(main_horovod.main, args, argv)
    if not args.sweep:
        raise UsageError("main_sweep.py needs --sweep FLAG=V1,V2,... or --search FLAG=LO:HI "
                         "--trials N; main_horovod.py trains one run")
    return sweep.run(main_horovod.main, args, argv)


if __name__ == "__main__":
    sys.exit(launch.run_cli(main))
