#!/bin/sh
# listener_gone.sh: a REQ to a host where the listener has gone, and no
# softhca process is left, is refused (REJ 8, "invalid service ID") by the
# host's CM agent, as the kernel's CM refuses it, rather than met with
# silence until the client's retries run out (UNREACHABLE).
#
#   listener_gone.sh server ADDR FLAG   rping serves one client, exits, then creates FLAG
#   listener_gone.sh client ADDR FLAG   rping once (must pass), waits (10 s at most) for
#                                       FLAG, then rping again: it must be REJECTED
# The server's rping, once connected to another host, has started the
# host's agent; after it exits the agent holds port 4791 for the host.
mode=$1 addr=$2 flag=$3
case $mode in
  server)
    rm -f "$flag"
    rping -s -a "$addr" -C 1 -v || exit 1
    touch "$flag"
    ;;
  client)
    rping -c -a "$addr" -C 1 -v || { echo "listener_gone: the first rping failed"; exit 1; }
    i=0
    while [ ! -e "$flag" ]; do
      i=$((i + 1))
      [ $i -le 200 ] || { echo "listener_gone: the server never finished"; exit 1; }
      sleep 0.05
    done
    rping -c -a "$addr" -C 1 -v
    echo "listener_gone: the second rping exited $?"
    ;;
  *) echo "usage: listener_gone.sh server|client ADDR FLAG" >&2; exit 2 ;;
esac
