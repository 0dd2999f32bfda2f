#!/usr/bin/env bash
# The MPIJob's pods (deploy/kubernetes/horovod/mpijob.yaml) and the MPI TrainJob's
# (deploy/kubernetes/trainer-horovod/trainingruntime.yaml), as any non-root user of the image.
#
#   mpi-pod.sh worker              run sshd on SSH_PORT, taking the job's key as authorized
#   mpi-pod.sh launcher CMD...     wait until every host of the operator's hostfile accepts ssh,
#                                  then run CMD (mpirun ...) with ssh set up for it (Open MPI 4
#                                  or 5) and the container's NCCL_* variables forwarded
#
# The MPI Operator (or the Trainer's MPI plugin) mounts the job's ssh Secret at the job's
# sshAuthMountPath (SSH_DIR here: id_rsa, id_rsa.pub, authorized_keys, root's files, the key
# readable by all or by the pod's fsGroup) and its hostfile at /etc/mpi/hostfile
# (OMPI_MCA_orte_default_hostfile). A non-root sshd cannot use the system's host keys or port
# 22, so it runs on a key and a configuration of its own, made at start in a private folder.
# Settings (environment): SSH_DIR (default /etc/cifar-ssh), SSH_PORT (default 2222),
# SSH_WAIT_SECONDS (how long the launcher waits for the workers, default 600).
set -euo pipefail

SSH_DIR=${SSH_DIR:-/etc/cifar-ssh}
SSH_PORT=${SSH_PORT:-2222}
SSH_WAIT_SECONDS=${SSH_WAIT_SECONDS:-600}
HOSTFILE=${OMPI_MCA_orte_default_hostfile:-/etc/mpi/hostfile}

die() { echo "mpi-pod.sh: $*" >&2; exit 2; }

ssh_options() {
    # Pods get new host keys on every start: nothing to check them against.
    echo "-p $SSH_PORT -i $SSH_DIR/id_rsa -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null" \
         "-o LogLevel=ERROR -o BatchMode=yes -o ConnectionAttempts=10"
}

worker() {
    [ -r "$SSH_DIR/authorized_keys" ] ||
        die "no $SSH_DIR/authorized_keys: set SSH_DIR to the MPIJob's sshAuthMountPath"
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/sshd.XXXXXX")
    ssh-keygen -q -t ed25519 -N "" -f "$dir/host_key"
    cat >"$dir/sshd_config" <<EOF
Port $SSH_PORT
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $SSH_DIR/authorized_keys
# The Secret's files are root's, as the operator mounts them.
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
EOF
    exec /usr/sbin/sshd -D -e -f "$dir/sshd_config"
}

launcher() {
    [ $# -gt 0 ] || die "usage: mpi-pod.sh launcher mpirun ..."
    [ -r "$HOSTFILE" ] || die "no hostfile at $HOSTFILE (the operator mounts it at /etc/mpi/hostfile)"
    [ -r "$SSH_DIR/id_rsa" ] || die "no $SSH_DIR/id_rsa: set SSH_DIR to the MPIJob's sshAuthMountPath"
    local opts host deadline=$((SECONDS + SSH_WAIT_SECONDS))
    opts=$(ssh_options)
    # shellcheck disable=SC2086  # opts is a list of words
    for host in $(awk '!/^[[:space:]]*(#|$)/ {print $1}' "$HOSTFILE"); do
        until ssh $opts -o ConnectTimeout=5 "$host" true 2>/dev/null; do
            [ $SECONDS -lt $deadline ] ||
                die "$host did not accept ssh on port $SSH_PORT within $SSH_WAIT_SECONDS s; is its worker running?"
            sleep 2
        done
    done
    # ssh to the workers, for Open MPI 4 (ORTE; this overrides the operator's own
    # OMPI_MCA_plm_rsh_args) and Open MPI 5 (PRRTE, which reads neither ORTE variable); the
    # hostfile's names kept whole, as the operator's Services resolve them.
    export OMPI_MCA_plm_rsh_args="$opts" PRTE_MCA_plm_ssh_args="$opts"
    export OMPI_MCA_orte_keep_fqdn_hostnames=true PRTE_MCA_prte_keep_fqdn_hostnames=true
    local first=$1
    shift
    if [ "$first" != mpirun ]; then
        exec "$first" "$@"
    fi
    # mpirun by its full path: Open MPI then finds its orted on the workers under the same prefix.
    first=$(command -v mpirun) || die "no mpirun on PATH"
    # The ranks run under the workers' sshd, not in the launcher's environment: every NCCL_*
    # variable of this container goes with them, unless CMD already names it after -x.
    local name forward=()
    for name in $(compgen -e | grep '^NCCL_' || true); do
        forwarded "$name" "$@" || forward+=(-x "$name")
    done
    exec "$first" "${forward[@]}" "$@"
}

# forwarded NAME ARG...: whether ARG... holds `-x NAME` or `-x NAME=...`.
forwarded() {
    local name=$1 prev=""
    shift
    for arg in "$@"; do
        if [ "$prev" = -x ] && { [ "$arg" = "$name" ] || [[ $arg == "$name="* ]]; }; then
            return 0
        fi
        prev=$arg
    done
    return 1
}

case "${1:-}" in
    worker) shift; worker "$@" ;;
    launcher) shift; launcher "$@" ;;
    *) die "usage: mpi-pod.sh worker | mpi-pod.sh launcher mpirun ..." ;;
esac
