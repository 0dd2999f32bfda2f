#!/usr/bin/env bash
# A real Slurm cluster on one machine: N network namespaces ("nodes") on a bridge, each
# with its own hostname, link-local address and slurmd; slurmctld runs on node 1, with
# a munged of its own for authentication. All nodes share this machine's filesystem, as
# an NFS home would. For tests, and for trying sbatch, srun, pre-emption and requeue
# without a cluster. Needs root (namespaces); installs Debian's slurmctld, slurmd,
# slurm-client and munge (and openmpi-bin) when they are missing. It never reads or
# touches a system Slurm's or munge's configuration, daemons or ports.
#
#   eval "$(scripts/local_slurm.sh up 2)"        # SLURM_CONF, LOCAL_SLURM_NODES, ...
#   scripts/local_slurm.sh on 1 srun -N2 -n2 hostname
#   scripts/local_slurm.sh on 1 sbatch -N2 -p "$LOCAL_SLURM_LOW" scripts/slurm/horovod_srun.sbatch ...
#   scripts/local_slurm.sh on 1 squeue
#   scripts/local_slurm.sh down                  # safe to run twice, or after a failed up
#
# Commands:
#   up N [--cpus C]    make N nodes with C CPUs each (default 2), start the daemons, wait
#                      until every node is idle, and print shell assignments for eval
#   env                print the assignments again
#   on H CMD...        run CMD on node H (its network, hostname and hosts file) with
#                      SLURM_CONF set; Slurm's commands (srun, sbatch, squeue, scontrol,
#                      scancel) reach slurmctld only from a node, so run them this way
#   down               end every daemon and every process of a job (by PID), remove every
#                      namespace, link and file that up made
#
# Partitions: "low" (the default) and "high" (a higher PriorityTier). A high job that needs
# a low job's CPUs pre-empts it: the low job's tasks get SIGTERM at once, and 20 s later
# (GraceTime) Slurm ends and requeues the job; a batch script that ends before that must
# requeue itself (scontrol requeue), or the job is over. MpiDefault is pmix.
#
# Settings (environment): LOCAL_SLURM_DIR (all state, default /tmp/cifar-slurm; munged needs
# every folder above it open to all, so not inside a private temporary folder),
# LOCAL_SLURM_NAME (prefix of namespace, node and link names, default slurm),
# LOCAL_SLURM_NET (the nodes are NET.1 .. NET.N/24; default 169.254.78, and only
# 169.254.x is allowed), LOCAL_SLURM_PORT (slurmctld's port; slurmd's is the next one;
# default 7817).
# Exit status 77: no namespaces can be made here (not root, or not permitted).
set -euo pipefail
# shellcheck source=netns.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/netns.sh"

PROG=local_slurm.sh
DIR=${LOCAL_SLURM_DIR:-/tmp/cifar-slurm}
NAME=${LOCAL_SLURM_NAME:-slurm}
NET=${LOCAL_SLURM_NET:-169.254.78}
PORT=${LOCAL_SLURM_PORT:-7817}
IFACE=slurm0            # each node's interface: the same name on every node
GRACE=20                # seconds a pre-empted low job has, from its SIGTERM, to end itself
PKGS=(slurmctld slurmd slurm-client munge)

check_settings() {
    check_name_and_net LOCAL_SLURM nodes
    [[ $PORT =~ ^[0-9]+$ ]] && ((PORT >= 1024 && PORT < 65535)) \
        || die "LOCAL_SLURM_PORT '$PORT' must be a port from 1024 to 65534"
    ((PORT != 6817 && PORT != 6818 && PORT + 1 != 6817 && PORT + 1 != 6818)) \
        || die "LOCAL_SLURM_PORT '$PORT' would use a system Slurm's default ports (6817, 6818)"
    [[ $DIR = /* && $DIR != *[[:space:]]* && $DIR != / ]] \
        || die "LOCAL_SLURM_DIR '$DIR' must be an absolute path without spaces, other than /"
}

node_name() { echo "$NAME-n$1"; }
slurmd_pid() { cat "$DIR/$(node_name "$1")/slurmd.pid" 2>/dev/null; }

# --- up ------------------------------------------------------------------------

install_packages() {
    local missing=() p
    for p in slurmctld slurmd srun munged; do
        command -v "$p" >/dev/null || { missing=("${PKGS[@]}"); break; }
    done
    command -v mpirun >/dev/null || missing+=(openmpi-bin)
    [ ${#missing[@]} -gt 0 ] || return 0
    say "installing ${missing[*]}"
    local rc=0
    apt_install "${missing[@]}" || rc=$?
    [ "$rc" -eq 0 ] || die "could not install ${missing[*]} with apt-get (status $rc)"
    for p in slurmctld slurmd srun munged mpirun; do
        command -v "$p" >/dev/null || die "$p is still missing after installing ${missing[*]}"
    done
}

check_reachable() {  # munged refuses a socket below a folder that not everyone can traverse
    local p=$DIR
    while p=$(dirname "$p") && [ "$p" != / ]; do
        [ ! -d "$p" ] || (( 8#$(stat -c %a "$p") & 1 )) \
            || die "LOCAL_SLURM_DIR '$DIR' is inside $p, which not everyone may enter (mode $(stat -c %a "$p")); munged's socket needs every folder above it open to all: choose another LOCAL_SLURM_DIR"
    done
}

start_munged() {
    local m=$DIR/munge
    mkdir -p "$m"
    # munged refuses a socket folder that not everyone can traverse, and a key others can read.
    chmod 755 "$DIR" "$m"
    (umask 077 && head -c 1024 /dev/urandom > "$m/munge.key")
    munged --socket "$m/munge.socket" --key-file "$m/munge.key" --pid-file "$m/munged.pid" \
        --log-file "$m/munged.log" --seed-file "$m/munged.seed" </dev/null >/dev/null 2>"$m/start.err" \
        || die "munged did not start: $(tail -n 1 "$m/start.err" 2>/dev/null)"
    for _ in $(seq 50); do
        [ -s "$m/munged.pid" ] && [ -S "$m/munge.socket" ] && return
        sleep 0.1
    done
    die "munged did not start: $(tail -n 3 "$m/munged.log" 2>/dev/null)"
}

write_slurm_conf() {  # nodes, cpus per node
    local n=$1 cpus=$2 i
    cat > "$DIR/slurm.conf" <<EOF
# The local Slurm cluster: $n nodes, each a network namespace; every daemon runs as root.
ClusterName=$NAME
SlurmctldHost=$(node_name 1)($NET.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again once its old credential expires: 10 s, not the default 120.
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/ctld/slurmctld.pid
SlurmctldLogFile=$DIR/ctld/slurmctld.log
SlurmdPidFile=$DIR/%n/slurmd.pid
SlurmdLogFile=$DIR/%n/slurmd.log
SlurmdSpoolDir=$DIR/%n/spool
# Per node: the nodes share one /tmp, where their PMIx folders would collide.
TmpFS=$DIR/%n/tmp
# No cgroups: the nodes are namespaces on one machine, not machines.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# The nodes declare CPUs they share with each other.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Job ids that differ from one up to the next, so a job's files (named by its id) never
# meet an earlier cluster's.
FirstJobId=$(( $(date +%s) % 10000000 + 1 ))
MpiDefault=pmix
KillWait=10
# Every second, not every 30-60 s: a requeued job starts as soon as its credential expires.
SchedulerParameters=sched_interval=1,bf_interval=1
# A higher partition's job pre-empts a lower one's: SIGTERM to its tasks at once; at the
# end of the partition's GraceTime Slurm ends the job and requeues it.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
EOF
    for i in $(seq "$n"); do
        echo "NodeName=$(node_name "$i") NodeAddr=$NET.$i CPUs=$cpus State=UNKNOWN" >> "$DIR/slurm.conf"
    done
    cat >> "$DIR/slurm.conf" <<EOF
PartitionName=low Nodes=ALL Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE MaxTime=INFINITE State=UP
PartitionName=high Nodes=ALL PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
}

start_daemon() {  # node number, pid file, daemon and its arguments...
    # Its own hostname (a UTS namespace) that resolves to its node address, as on a real
    # cluster: the cluster's hosts file over /etc/hosts, in a mount namespace of its own.
    # nsenter, not `ip netns exec`: that remounts /sys, where slurmd then finds no cgroups.
    local i=$1 pidfile=$2 ns
    shift 2
    ns=$(node_name "$i")
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation slave sh -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
        sh "$ns" "$DIR/hosts" "$@" </dev/null >/dev/null 2>>"$DIR/$ns/start.err" \
        || die "$1 did not start on $ns: $(tail -n 3 "$DIR/$ns/start.err" 2>/dev/null)"
    for _ in $(seq 100); do
        [ -s "$pidfile" ] && return
        sleep 0.1
    done
    die "$1 did not start on $ns (no $pidfile)"
}

wait_idle() {  # nodes
    local states
    for _ in $(seq 600); do
        states=$(on_node 1 sinfo -h -N -p low -o '%t' 2>/dev/null | sort | uniq -c | tr -s ' ' || true)
        [ "$states" = " $1 idle" ] && return
        sleep 0.1
    done
    die "the nodes are not idle after 60 s (sinfo:$(on_node 1 sinfo -h -N -p low -o ' %N %t' 2>&1 | tr '\n' ' ')): $(tail -n 3 "$DIR/ctld/slurmctld.log" 2>/dev/null)"
}

cmd_up() {
    local n each
    up_args nodes --cpus C 2 "$@"
    local cpus=$each i ns
    need_root "ip (iproute2), nsenter or unshare (util-linux) is missing" ip nsenter unshare
    [ ! -e "$DIR/slurm.env" ] || die "a cluster is already up in $DIR; run '$0 down' first"
    check_reachable
    install_packages
    mkdir -p "$DIR"
    # Written first, so that down finds everything even when up fails half-way.
    printf 'NAME=%s\nNET=%s\nPORT=%s\nNODES=%s\nCPUS=%s\n' "$NAME" "$NET" "$PORT" "$n" "$cpus" \
        > "$DIR/slurm.env"
    down_if_up_fails
    start_munged
    write_slurm_conf "$n" "$cpus"
    mkdir -p "$DIR/ctld"
    # The names every node resolves: this machine's, and the cluster's nodes.
    { cat /etc/hosts; for i in $(seq "$n"); do echo "$NET.$i $(node_name "$i")"; done; } > "$DIR/hosts"
    add_bridge
    for i in $(seq "$n"); do
        ns=$(node_name "$i")
        mkdir -p "$DIR/$ns/spool" "$DIR/$ns/tmp"
        add_namespace "$ns" "$i"
    done
    start_daemon 1 "$DIR/ctld/slurmctld.pid" slurmctld -f "$DIR/slurm.conf"
    for i in $(seq "$n"); do
        start_daemon "$i" "$DIR/$(node_name "$i")/slurmd.pid" slurmd -f "$DIR/slurm.conf"
    done
    wait_idle "$n"
    trap - EXIT
    cmd_env
}

cmd_env() {
    [ -f "$DIR/slurm.env" ] || die "no cluster in $DIR; run '$0 up N' first"
    # shellcheck disable=SC1091
    . "$DIR/slurm.env"
    local i nodes="" addresses=""
    for i in $(seq "$NODES"); do
        nodes="${nodes:+$nodes,}$(node_name "$i")"
        addresses="${addresses:+$addresses,}$NET.$i"
    done
    echo "SLURM_CONF=$DIR/slurm.conf"
    echo "LOCAL_SLURM_DIR=$DIR"
    echo "LOCAL_SLURM_NODES=$nodes"
    echo "LOCAL_SLURM_ADDRESSES=$addresses"
    echo "LOCAL_SLURM_CPUS=$CPUS"
    echo "LOCAL_SLURM_LOW=low"
    echo "LOCAL_SLURM_HIGH=high"
    echo "LOCAL_SLURM_GRACE_TIME=$GRACE"
    # The nodes' one interface, for Open MPI's and NCCL's interface settings.
    echo "LOCAL_SLURM_IFACE=$IFACE"
}

# --- on, down ------------------------------------------------------------------

on_node() {  # [exec] node number, command: run it there (in place of this shell with exec)
    local run=""
    [ "${1:-}" != exec ] || { run=exec; shift; }
    local i=${1:-}
    shift || true
    [ $# -gt 0 ] || die "usage: on NODE COMMAND..."
    [[ $i =~ ^[0-9]+$ ]] || die "on needs a node number, not '$i'"
    local pid
    pid=$(slurmd_pid "$i") && [ -n "$pid" ] && [ -d "/proc/$pid" ] \
        || die "node '$i' is not up in $DIR (no slurmd); run '$0 up N' first"
    $run nsenter --target "$pid" --net --uts --mount --wd="$PWD" env SLURM_CONF="$DIR/slurm.conf" "$@"
}

our_namespaces() { namespaces_of n; }

# Processes on the nodes: every one was started by up (slurmctld, slurmd) or by them
# (slurmstepd, a job's shell and tasks). All nodes at once: a job's shell that traps
# SIGTERM holds each node for the whole wait.
end_node_processes() {  # namespaces...
    local ns pids
    for _ in 1 2 3; do  # again for any that the ended ones started meanwhile
        pids=()
        for ns in "$@"; do
            mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
        done
        [ ${#pids[@]} -gt 0 ] || return 0
        end_pids "${pids[@]}"
    done
}

end_munged() {  # only the munged that serves this cluster's socket
    local m=$DIR/munge pid
    pid=$(cat "$m/munged.pid" 2>/dev/null) || return 0
    [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$m/munge.socket" \
        || return 0
    end_pids "$pid"
}

cmd_down() {
    saved_name "$DIR/slurm.env"
    local ns namespaces
    mapfile -t namespaces < <(our_namespaces)
    end_node_processes "${namespaces[@]}"
    for ns in "${namespaces[@]}"; do
        ip netns del "$ns" 2>/dev/null || true  # takes its end of the veth pair, and so the pair
    done
    end_munged
    remove_links
    if [ -d "$DIR" ]; then  # only what up writes, never the whole of an arbitrary folder
        rm -rf "$DIR/munge" "$DIR/ctld" "$DIR/$NAME"-n[0-9]*
        rm -f "$DIR"/{slurm.env,slurm.conf,hosts}
        rmdir "$DIR" 2>/dev/null || say "left $DIR: it holds files that up did not make"
    fi
    say "down: no namespace, link, process or file of cluster '$NAME' is left"
}

# on: the same process, so that signals to it reach the command.
cmd_on() { on_node exec "$@"; }

check_settings
run_command "up N [--cpus C] | env | on NODE COMMAND... | down" "$@"
