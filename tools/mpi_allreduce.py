"""Time Open MPI's own allreduce (MPI_Allreduce through mpi4py) of float32 buffers, under the
algorithm the job's MCA parameters pick: the collective that benchmarks/scaling/
tree_allreduce_error.py holds the scaling model's ring and tree against.

    mpirun -np 8 --hostfile H --mca coll_tuned_use_dynamic_rules 1 \\
        --mca coll_tuned_allreduce_algorithm 4 python -m tools.mpi_allreduce --sizes 1e6,16e6

Every size is allreduced once untimed, then --repeats times; a call's time is its slowest
rank's, and the fastest call of each size is kept (other work on a shared host only adds).
Every rank contributes rank + 1, so each element of the sum is N (N + 1) / 2, which every rank
checks. Rank 0 prints the times and writes [[bytes, seconds], ...] to --json. It imports no
torch: a rank starts in a fraction of a second.
"""
import argparse
import json
import sys
import time


def parse_sizes(text):
    """'1e6,16e6' -> [1000000, 16000000], each a whole number of float32s."""
    try:
        sizes = [int(float(s)) // 4 * 4 for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 4:
        raise ValueError(f"--sizes takes bytes separated by commas (e.g. 1e6,16e6), not '{text}'")
    return sizes


def time_size(comm, nbytes, repeats):
    """The fastest of `repeats` allreduces of nbytes, each timed by its slowest rank."""
    from mpi4py import MPI
    import numpy as np

    n, rank = comm.Get_size(), comm.Get_rank()
    out = np.empty(nbytes // 4, dtype=np.float32)
    best = float("inf")
    for i in range(repeats + 1):
        buf = np.full(nbytes // 4, rank + 1, dtype=np.float32)
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(buf, out, op=MPI.SUM)
        took = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if not (out[0] == out[-1] == n * (n + 1) / 2):
            raise RuntimeError(f"the allreduce of {nbytes} bytes summed to {out[0]}, not {n * (n + 1) // 2}")
        if i:
            best = min(best, took)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", required=True, help="bytes of each allreduce, separated by commas")
    p.add_argument("--repeats", type=int, default=3, help="timed allreduces a size (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write [[bytes, seconds], ...] to FILE (rank 0)")
    args = p.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        p.error(str(e))
    if args.repeats < 1:
        p.error("--repeats must be 1 or more")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    measured = [[b, time_size(comm, b, args.repeats)] for b in sizes]
    if comm.Get_rank() == 0:
        for b, s in measured:
            print(f"allreduce of {b / 1e6:.2f} MB over {comm.Get_size()} processes: {s * 1e3:.1f} ms")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(measured, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
