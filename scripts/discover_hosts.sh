#!/bin/sh
# Host discovery for `horovodrun --host-discovery-script` on one machine.
#
# Prints `localhost:N`, where N is read from a file each time Horovod's elastic
# driver polls (about once a second), so changing the file resizes the job:
#
#   echo 3 > /tmp/slots
#   HOROVOD_SLOTS_FILE=/tmp/slots horovodrun -np 3 --min-np 2 --max-np 3 --network-interface lo \
#       --host-discovery-script scripts/discover_hosts.sh python main_elastic.py ...
#   echo 2 > /tmp/slots     # the driver removes a slot; training goes on at np=2
#
# On one host, --network-interface lo is needed: without it the driver waits (up to
# its start timeout, 600 s by default) for an interface that a second host shares.
#
# The file is the first argument, else $HOROVOD_SLOTS_FILE, else ./slots. It
# holds either a number (the slots on localhost) or `host:slots` lines, which
# are printed as they are (e.g. `localhost:2` and `127.0.0.1:1`, two names for
# this machine that Horovod treats as two hosts). A missing or empty file
# prints nothing, which Horovod reads as "no hosts available right now".
file="${1:-${HOROVOD_SLOTS_FILE:-slots}}"
[ -f "$file" ] && [ -r "$file" ] || exit 0
content=$(tr -d ' \t\r' < "$file")
case "$content" in
    '') exit 0 ;;
    *[!0-9]*) printf '%s\n' "$content" ;;
    *) echo "localhost:$content" ;;
esac
