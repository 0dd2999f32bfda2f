"""The environment the tests and the benchmarks start the real trainers in, and how they find
the trainers' processes: the one module both import (tests/helpers.py, benchmarks/trainer_runs.py).

Standard library only: scripts/gpu_check.py runs from any python3 before the set-up.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Open MPI refuses root without these; oversubscription lets 3 ranks share 2 cores.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def env(extra=None, python=sys.executable):
    """A trainer's environment: `python`'s folder first on PATH (its horovodrun, torchrun),
    unbuffered output, Open MPI's root settings, then `extra`."""
    e = dict(os.environ, PYTHONUNBUFFERED="1",
             PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
    e.update(MPI_ENV)
    e.update(extra or {})
    return e


def trainer_pids(script, marker=None, **env_match):
    """{pid: environment} of running `script` processes whose command line holds `marker`
    and whose environment has every NAME=value of env_match, found through /proc. A process's
    fork not yet turned into another program (a subprocess it is starting) has its command line
    and environment: it is left out, as its parent is the trainer."""
    found, cmds, parents = {}, {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                penv = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
        if script.encode() not in cmd or (marker and marker.encode() not in cmd):
            continue
        penv = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in penv.items()}
        if all(penv.get(k) == str(v) for k, v in env_match.items()):
            found[int(pid)], cmds[int(pid)], parents[int(pid)] = penv, cmd, parent
    return {pid: e for pid, e in found.items() if cmds.get(parents[pid]) != cmds[pid]}


def rank_pids(script, marker=None, **env_match):
    """{rank: pid} of a job's trainer processes, by the rank their launcher gave them
    (HOROVOD_RANK from horovodrun, OMPI_COMM_WORLD_RANK from mpirun, RANK from torchrun)."""
    ranks = {pid: e.get("HOROVOD_RANK", e.get("OMPI_COMM_WORLD_RANK", e.get("RANK")))
             for pid, e in trainer_pids(script, marker, **env_match).items()}
    return {int(rank): pid for pid, rank in ranks.items() if rank is not None}
