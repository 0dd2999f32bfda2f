#!/usr/bin/env bash
# A real cluster on one machine: N network namespaces ("hosts") on a bridge, each
# with its own hostname and an sshd on its own link-local address. All hosts share
# this machine's filesystem, as an NFS home would. For tests, and for trying
# multi-host runs without a second machine. Needs root (namespaces); installs
# Debian's openssh-server when sshd is missing.
#
#   eval "$(scripts/local_cluster.sh up 2)"      # CLUSTER_HOSTFILE, CLUSTER_HOSTS, ...
#   scripts/local_cluster.sh on 1 mpirun -np 2 --hostfile "$CLUSTER_HOSTFILE" \
#       "${CLUSTER_MPIRUN_ARGS[@]}" .venv/bin/python main_horovod.py ...
#   scripts/local_cluster.sh on 1 .venv/bin/horovodrun -np 2 -H "$CLUSTER_HOSTS" \
#       "${CLUSTER_HOROVODRUN_ARGS[@]}" .venv/bin/python main_horovod.py ...
#   scripts/local_cluster.sh down                # safe to run twice, or after a failed up
#
# Commands:
#   up N [--slots S] [--rate R]
#                      make N hosts with S slots each in the hostfile (default 1) and
#                      print shell assignments for eval (two of them are bash arrays);
#                      with --rate (tc's form: 200mbit, 1gbit), every host's link carries
#                      at most R each way (a token bucket, tbf, on both ends of its veth)
#   env                print the assignments again
#   on H CMD...        run CMD on host H (its network and hostname), with an ssh on PATH
#                      that knows the hosts' keys; launchers run this way from host 1
#   reap               end every process on the hosts except their sshd
#   down               remove every namespace, link, process and file that up made
#
# Settings (environment): CLUSTER_DIR (all state, default /tmp/cifar-cluster),
# CLUSTER_NAME (prefix of namespace and link names, default cifar), CLUSTER_NET (the
# hosts are CLUSTER_NET.1 .. CLUSTER_NET.N/24; default 169.254.77, and only
# 169.254.x is allowed), CLUSTER_SSH_PORT (default 2222).
# Exit status 77: no namespaces can be made here (not root, or not permitted).
set -euo pipefail
# shellcheck source=netns.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/netns.sh"

PROG=local_cluster.sh
DIR=${CLUSTER_DIR:-/tmp/cifar-cluster}
NAME=${CLUSTER_NAME:-cifar}
NET=${CLUSTER_NET:-169.254.77}
PORT=${CLUSTER_SSH_PORT:-2222}
IFACE=cluster0          # each host's interface: the same name on every host
SSHD=/usr/sbin/sshd

check_settings() {
    check_name_and_net CLUSTER hosts
    [[ $PORT =~ ^[0-9]+$ ]] && ((PORT > 0 && PORT < 65536)) || die "CLUSTER_SSH_PORT '$PORT' is not a port"
    [[ $DIR = /* && $DIR != *[[:space:]]* && $DIR != / ]] \
        || die "CLUSTER_DIR '$DIR' must be an absolute path without spaces, other than /"
}

host_ns() { echo "$NAME-h$1"; }
sshd_pid() { cat "$DIR/h$1/sshd.pid" 2>/dev/null; }

# --- up ------------------------------------------------------------------------

install_sshd() {
    [ -x "$SSHD" ] && return
    say "installing openssh-server (sshd is missing)"
    local rc=0
    apt_install openssh-server || rc=$?
    [ "$rc" -eq 0 ] && [ -x "$SSHD" ] || die "could not install openssh-server with apt-get (status $rc)"
}

write_sshd_config() {  # host number
    local h=$DIR/h$1
    cat > "$h/sshd_config" <<EOF
# sshd of host $1 of the local cluster: key login on its own address only.
ListenAddress $NET.$1
Port $PORT
HostKey $h/ssh_host_ed25519_key
PidFile $h/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The keys live under $DIR, which may sit in a world-writable /tmp.
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
# Launchers open several connections at once.
MaxStartups 100
MaxSessions 100
LogLevel ERROR
EOF
}

start_host() {  # host number
    local i=$1 ns h
    ns=$(host_ns "$i")
    h=$DIR/h$i
    mkdir -p "$h"
    add_namespace "$ns" "$i"
    ssh-keygen -q -t ed25519 -N '' -C "$ns" -f "$h/ssh_host_ed25519_key"
    printf '[%s]:%s,[%s]:%s %s\n' "$NET.$i" "$PORT" "$ns" "$PORT" \
        "$(cut -d' ' -f1,2 "$h/ssh_host_ed25519_key.pub")" \
        >> "$DIR/known_hosts"
    write_sshd_config "$i"
    "$SSHD" -t -f "$h/sshd_config" || die "sshd rejects $h/sshd_config"
    # A hostname of its own (a UTS namespace) that resolves to its cluster address, as
    # on a real cluster: the cluster's hosts file over /etc/hosts, in a mount namespace
    # of its own. sshd daemonizes, and writes its pid file once it listens.
    ip netns exec "$ns" unshare --uts --mount --propagation slave sh -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && exec "$3" -f "$4" -E "$5"' \
        sh "$ns" "$DIR/hosts" "$SSHD" "$h/sshd_config" "$h/sshd.log"
    for _ in $(seq 50); do
        [ -s "$h/sshd.pid" ] && return
        sleep 0.1
    done
    die "sshd of host $i did not start: $(tail -3 "$h/sshd.log" 2>/dev/null)"
}

write_client_files() {
    mkdir -p "$DIR/bin"
    cat > "$DIR/ssh_config" <<EOF
# ssh to the local cluster's hosts: its key, its port, its host keys; nothing of ~/.ssh.
Host *
    Port $PORT
    IdentityFile $DIR/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $DIR/known_hosts
    GlobalKnownHostsFile /dev/null
    BatchMode yes
    LogLevel ERROR
EOF
    # Launchers call plain `ssh`: this one, first on PATH under `on`, reads that config.
    printf '#!/bin/sh\nexec /usr/bin/ssh -F %s "$@"\n' "$DIR/ssh_config" > "$DIR/bin/ssh"
    chmod +x "$DIR/bin/ssh"
}

# Bytes a link's token bucket holds: 10 ms at the rate, at least a few full-size frames.
tbf_burst() {  # rate as tc takes it (NUMBER followed by kbit, mbit or gbit)
    local number=${1%[kmg]bit} unit=${1: -4:1} scale
    case $unit in k) scale=1000 ;; m) scale=1000000 ;; g) scale=1000000000 ;; esac
    awk -v r="$number" -v s="$scale" 'BEGIN { b = int(r * s / 8 / 100); print (b < 16000 ? 16000 : b) }'
}

shape_link() {  # host number, rate: a tbf on each end of the host's veth, one per direction
    local i=$1 rate=$2 burst
    burst=$(tbf_burst "$rate")
    ip netns exec "$(host_ns "$i")" tc qdisc add dev "$IFACE" root tbf rate "$rate" burst "$burst" latency 400ms
    tc qdisc add dev "$NAME-v$i" root tbf rate "$rate" burst "$burst" latency 400ms
}

cmd_up() {
    local n each rate="" args=()
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) rate=${2:-}; shift 2 || die "--rate needs a rate, e.g. 200mbit" ;;
            *) args+=("$1"); shift ;;
        esac
    done
    up_args hosts --slots S 1 "${args[@]}"
    [ -z "$rate" ] || [[ $rate =~ ^[0-9]+(\.[0-9]+)?[kmg]bit$ ]] \
        || die "--rate takes a rate as tc does, a number and kbit, mbit or gbit (e.g. 200mbit), not '$rate'"
    local slots=$each i
    need_root "the ip command (iproute2) is missing" ip
    [ -z "$rate" ] || command -v tc >/dev/null || die "--rate needs tc (iproute2)" 77
    [ ! -e "$DIR/cluster.env" ] || die "a cluster is already up in $DIR; run '$0 down' first"
    install_sshd
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    # Written first, so that down finds everything even when up fails half-way.
    printf 'NAME=%s\nNET=%s\nPORT=%s\nHOSTS=%s\nSLOTS=%s\nRATE=%s\n' "$NAME" "$NET" "$PORT" "$n" "$slots" \
        "$rate" > "$DIR/cluster.env"
    down_if_up_fails
    mkdir -p /run/sshd  # sshd's privilege separation folder (Debian's service makes it)
    ssh-keygen -q -t ed25519 -N '' -C "$NAME-cluster" -f "$DIR/id_ed25519"
    cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
    : > "$DIR/known_hosts"
    : > "$DIR/hostfile"
    write_client_files
    # The names every host resolves: this machine's, and the cluster's hosts.
    { cat /etc/hosts; for i in $(seq "$n"); do echo "$NET.$i $(host_ns "$i")"; done; } > "$DIR/hosts"
    add_bridge
    for i in $(seq "$n"); do
        start_host "$i"
        [ -z "$rate" ] || shape_link "$i" "$rate"
        echo "$NET.$i slots=$slots" >> "$DIR/hostfile"
    done
    # Every host must answer ssh from host 1, where the launchers run.
    for i in $(seq "$n"); do
        on_host 1 ssh -o ConnectTimeout=10 "$NET.$i" true \
            || die "host 1 cannot ssh to $NET.$i: $(tail -3 "$DIR/h$i/sshd.log" 2>/dev/null)"
    done
    trap - EXIT
    cmd_env
}

cmd_env() {
    [ -f "$DIR/cluster.env" ] || die "no cluster in $DIR; run '$0 up N' first"
    # shellcheck disable=SC1091
    . "$DIR/cluster.env"
    local i hosts=""
    for i in $(seq "$HOSTS"); do
        hosts="${hosts:+$hosts,}$NET.$i:$SLOTS"
    done
    local ssh_args="-p $PORT -i $DIR/id_ed25519 -o UserKnownHostsFile=$DIR/known_hosts -o BatchMode=yes"
    echo "CLUSTER_DIR=$DIR"
    echo "CLUSTER_RATE=${RATE:-}"
    echo "CLUSTER_HOSTFILE=$DIR/hostfile"
    echo "CLUSTER_HOSTS=$hosts"
    # The hosts share this machine's cores: --bind-to none keeps mpirun from binding
    # every host's first rank to the same core. The cluster runs as root.
    echo "CLUSTER_MPIRUN_ARGS=(--allow-run-as-root --bind-to none -mca plm_rsh_args '$ssh_args'" \
         "-mca btl_tcp_if_include $IFACE -mca oob_tcp_if_include $IFACE" \
         "-x PATH -x PYTHONUNBUFFERED -x OMP_NUM_THREADS -x NCCL_SOCKET_IFNAME=$IFACE)"
    echo "CLUSTER_HOROVODRUN_ARGS=(--ssh-port $PORT --ssh-identity-file $DIR/id_ed25519" \
         "--network-interface $IFACE --disable-cache)"
}

# --- on, reap, down ------------------------------------------------------------

on_host() {  # [exec] host number, command: run it there (in place of this shell with exec)
    local run=""
    [ "${1:-}" != exec ] || { run=exec; shift; }
    local i=${1:-}
    shift || true
    [ $# -gt 0 ] || die "usage: on HOST COMMAND..."
    local pid
    pid=$(sshd_pid "$i") && [ -n "$pid" ] && [ -d "/proc/$pid" ] \
        || die "host '$i' is not up in $DIR (no sshd); run '$0 up N' first"
    $run nsenter --target "$pid" --net --uts --mount --wd="$PWD" env PATH="$DIR/bin:$PATH" "$@"
}

our_namespaces() { namespaces_of h; }

# Processes on a host: every one was started by up (its sshd) or through it.
end_processes() {  # namespace, pids to keep
    local ns=$1 keep=" ${2:-} " pids=() p
    for p in $(ip netns pids "$ns" 2>/dev/null); do
        [[ $keep == *" $p "* ]] || pids+=("$p")
    done
    end_pids "${pids[@]}"
}

cmd_reap() {
    local ns i
    for ns in $(our_namespaces); do
        i=${ns##*-h}
        end_processes "$ns" "$(sshd_pid "$i")"
    done
}

cmd_down() {
    saved_name "$DIR/cluster.env"
    local ns
    for ns in $(our_namespaces); do
        end_processes "$ns"
        ip netns del "$ns" 2>/dev/null || true  # takes its end of the veth pair, and so the pair
    done
    remove_links
    if [ -d "$DIR" ]; then  # only what up writes, never the whole of an arbitrary folder
        rm -rf "$DIR"/h[0-9]* "$DIR/bin"
        rm -f "$DIR"/{cluster.env,hosts,hostfile,id_ed25519,id_ed25519.pub,authorized_keys} \
              "$DIR"/{known_hosts,ssh_config}
        rmdir "$DIR" 2>/dev/null || say "left $DIR: it holds files that up did not make"
    fi
    say "down: no namespace, link, process or file of cluster '$NAME' is left"
}

# on: the same process, so that signals to it reach the command.
cmd_on() { on_host exec "$@"; }

check_settings
run_command "up N [--slots S] [--rate R] | env | on HOST COMMAND... | reap | down" "$@"
