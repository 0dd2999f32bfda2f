"""deploy/kubernetes/mpi-pod.sh's launcher, run here as the MPIJob's launcher pod runs it, on a
hostfile of no hosts (none to wait for) and with a script in mpirun's place that prints what it
is given: the ssh settings for Open MPI 4 and 5 and the NCCL variables it forwards. mpirun itself,
over ssh into the workers, runs in tests/test_container.py."""
import os
import subprocess

from test_kubernetes import DEPLOY


def mpi_pod_launcher(tmp_path, *args, **env):
    """What mpi-pod.sh's launcher runs for `mpi-pod.sh launcher mpirun ARGS...`, as it runs here:
    on a hostfile of no hosts (none to wait for), with a script in mpirun's place that prints its
    arguments and environment: (mpirun's arguments, its variables)."""
    for d in ("ssh", "bin"):
        (tmp_path / d).mkdir()
    (tmp_path / "ssh" / "id_rsa").write_text("")
    (tmp_path / "hostfile").write_text("# no hosts\n")
    (tmp_path / "bin" / "mpirun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"; echo ---; env\n')
    (tmp_path / "bin" / "mpirun").chmod(0o755)
    r = subprocess.run(["bash", os.path.join(DEPLOY, "mpi-pod.sh"), "launcher", "mpirun", *args],
                       capture_output=True, text=True, timeout=60,
                       env=dict(env, PATH=f"{tmp_path}/bin:{os.environ['PATH']}", SSH_DIR=str(tmp_path / "ssh"),
                                OMPI_MCA_orte_default_hostfile=str(tmp_path / "hostfile")))
    assert r.returncode == 0, r.stderr
    argv, _, variables = r.stdout.partition("---\n")
    return argv.splitlines(), dict(ln.split("=", 1) for ln in variables.splitlines() if "=" in ln)


def test_the_launcher_sets_ssh_for_open_mpi_4_and_5_and_forwards_nccls_settings(tmp_path):
    argv, got = mpi_pod_launcher(tmp_path, "-x", "NCCL_DEBUG", "python", "t.py", NCCL_DEBUG="WARN",
                                 NCCL_SOCKET_IFNAME="eth0", NCCL_IB_HCA="mlx5", OTHER="1")
    ssh = got["OMPI_MCA_plm_rsh_args"]
    assert f"-p 2222 -i {tmp_path}/ssh/id_rsa" in ssh and "StrictHostKeyChecking=no" in ssh
    assert got["PRTE_MCA_plm_ssh_args"] == ssh
    assert got["OMPI_MCA_orte_keep_fqdn_hostnames"] == got["PRTE_MCA_prte_keep_fqdn_hostnames"] == "true"
    # Every NCCL_* variable not named already, before the arguments given.
    assert argv == ["-x", "NCCL_IB_HCA", "-x", "NCCL_SOCKET_IFNAME", "-x", "NCCL_DEBUG", "python", "t.py"]
