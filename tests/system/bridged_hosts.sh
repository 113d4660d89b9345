# bridged_hosts.sh: sourced by the tests that join three or more hosts on
# one Ethernet segment (hostile_host.sh, mckey_hosts.sh, three_hosts_soak.sh).
#
# bridge_hosts [BRIDGE_OPTION...]: makes the namespace $ns_br holding a
# bridge br0 (the options go to `ip link add br0 type bridge`), and for
# each host h of ${hosts[@]} the namespace ${ns[h]}, joined to br0 by the
# veth ${veth[h]}, with it and lo up. Addresses and routes stay the
# caller's. Returns 77 (with a SKIP line naming $name) when no network
# namespace can be made, 1 when any other step fails. $work must exist.
bridge_hosts() {
  if ! ip netns add "$ns_br" 2>"$work/err"; then
    echo "[$name] SKIP: cannot create a network namespace: $(cat "$work/err")"
    return 77
  fi
  ip -n "$ns_br" link add br0 type bridge "$@" || return 1
  ip -n "$ns_br" link set br0 up || return 1
  local h
  for h in "${hosts[@]}"; do
    ip netns add "${ns[$h]}" || return 1
    ip link add "${veth[$h]}" type veth peer name "p$h$$" || return 1
    ip link set "${veth[$h]}" netns "${ns[$h]}" && ip link set "p$h$$" netns "$ns_br" || return 1
    ip -n "$ns_br" link set "p$h$$" master br0 up || return 1
    ip -n "${ns[$h]}" link set lo up || return 1
    ip -n "${ns[$h]}" link set "${veth[$h]}" up || return 1
  done
}
