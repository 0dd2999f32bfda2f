# shellcheck shell=bash
# What scripts/local_cluster.sh (hosts with sshd) and scripts/local_slurm.sh (Slurm
# nodes) share in making a cluster of network namespaces on one machine: messages, the
# checks of the settings and of root, a quiet apt-get install, the bridge and each
# namespace's veth link, ending processes, removing the links, and running the command
# that the command line names. Both source it; sourcing defines functions and nothing else.
#
# The functions read the caller's globals: PROG (the script's name, for messages), NAME
# (prefix of namespace and link names), NET (169.254.X: namespace I is NET.I/24) and
# IFACE (the name of the interface inside every namespace). The links on this machine
# are NAME-br (the bridge) and NAME-vI (namespace I's end of its veth pair). Each command
# of a script is its function cmd_<command> (cmd_up, cmd_env, cmd_on, cmd_down, ...).

die() { printf '%s: error: %s\n' "$PROG" "$1" >&2; exit "${2:-1}"; }
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# --- settings and root -----------------------------------------------------------

check_name_and_net() {  # prefix of the settings' names (CLUSTER), what the namespaces are (hosts)
    [[ $NAME =~ ^[a-z][a-z0-9]{0,9}$ ]] \
        || die "$1_NAME '$NAME' must be 1-10 lower-case letters and digits (it prefixes link names)"
    [[ $NET =~ ^169\.254\.([1-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-4])$ ]] \
        || die "$1_NET '$NET' must be 169.254.X with X in 1..254: $2 get link-local addresses only"
}

need_root() {  # what to say when a command is missing, the commands
    local missing=$1
    shift
    [ "$(id -u)" -eq 0 ] || die "must run as root to make network namespaces" 77
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null || die "$missing" 77
    done
    local probe="$NAME-probe$$"
    ip netns add "$probe" 2>/dev/null || die "cannot create network namespaces here (ip netns add failed)" 77
    ip netns del "$probe"
}

apt_install() {  # packages: apt-get's status
    # Install without starting the system's daemons: a policy-rc.d that says no, only
    # for the length of the install when the machine has none.
    local policy=/usr/sbin/policy-rc.d made_policy=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
    fi
    local rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } >&2 || rc=$?
    [ -z "$made_policy" ] || rm -f "$policy"
    return "$rc"
}

# --- links -------------------------------------------------------------------------

quiet_ipv6() {  # namespace ("" for this one), device: no IPv6 chatter on the cluster's links
    local f=/proc/sys/net/ipv6/conf/$2/disable_ipv6
    if [ -z "$1" ]; then
        [ -w "$f" ] && echo 1 > "$f" || true
    else
        ip netns exec "$1" sh -c "[ -w $f ] && echo 1 > $f" || true
    fi
}

add_bridge() {
    ip link add "$NAME-br" type bridge
    quiet_ipv6 "" "$NAME-br"
    ip link set "$NAME-br" up
}

add_namespace() {  # namespace, its number I: on the bridge, with the address NET.I on IFACE
    local ns=$1 i=$2
    ip netns add "$ns"
    ip link add "$NAME-v$i" type veth peer name "$IFACE" netns "$ns"
    ip link set "$NAME-v$i" master "$NAME-br"
    quiet_ipv6 "" "$NAME-v$i"
    ip link set "$NAME-v$i" up
    quiet_ipv6 "$ns" "$IFACE"
    ip -n "$ns" addr add "$NET.$i/24" dev "$IFACE"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$IFACE" up
}

namespaces_of() {  # letter between NAME- and the number (h, n): those of this cluster, by name
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-$1[0-9]+$" || true
}

remove_links() {  # the bridge and any veth left: a namespace's removal takes its own pair
    local link
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 \
                  | grep -E "^$NAME-(br|v[0-9]+)$" || true); do
        ip link del "$link" 2>/dev/null || true
    done
}

# --- processes -----------------------------------------------------------------------

running() {  # pid: it exists and has not exited (a zombie waiting for its parent has)
    local state
    state=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null) && [ -n "$state" ] && [ "$state" != Z ]
}

end_pids() {  # pids: TERM, then KILL what is left after 3 s
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    local p alive
    for _ in $(seq 30); do
        alive=()
        for p in "$@"; do running "$p" && alive+=("$p"); done
        [ ${#alive[@]} -gt 0 ] || return 0
        sleep 0.1
    done
    kill -KILL "${alive[@]}" 2>/dev/null || true
}

# --- up and the command line ---------------------------------------------------------

up_args() {  # what up makes (hosts), its option (--slots), the option's letter (S), its default, up's arguments
    # Sets n (how many) and each (the option's value): the caller declares both local.
    local what=$1 option=$2 letter=$3
    each=$4
    shift 4
    n=${1:-}
    shift || true
    while [ $# -gt 0 ]; do
        case $1 in
            "$option") each=${2:-}; shift 2 || die "$option needs a number" ;;
            *) die "unknown option '$1' (usage: up N [$option $letter])" ;;
        esac
    done
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 64)) || die "up needs a number of $what from 1 to 64, not '$n'"
    [[ $each =~ ^[0-9]+$ ]] && ((each >= 1)) || die "$option must be a positive number, not '$each'"
}

down_if_up_fails() {  # up calls it once it has written what down needs to find everything
    trap 'rc=$?; [ $rc -eq 0 ] || { say "up failed; removing what it made"; cmd_down >/dev/null 2>&1; }' EXIT
}

saved_name() {  # the file that up wrote (NAME=...): down removes what up made, under up's NAME
    if [ -f "$1" ]; then
        # shellcheck disable=SC1090
        NAME=$(. "$1" && echo "$NAME")
    fi
}

run_command() {  # usage, command line: the command is the caller's function cmd_<command>
    local usage=$1
    shift
    local cmd=${1:-}
    shift || true
    [[ $cmd =~ ^[a-z]+$ ]] && declare -F "cmd_$cmd" >/dev/null || die "usage: $0 $usage" 2
    "cmd_$cmd" "$@"
}
