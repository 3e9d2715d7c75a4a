# shellcheck shell=bash
# Network of the dev cluster. Sourced by scripts/devcluster (needs node_ip from config.sh and the
# constants BRIDGE NS_PREFIX VETH_PREFIX CTL_IP CTL_HOST HOSTS_TAG NODES).
#
#   root netns: bridge ddlbr0 = 10.77.0.1/24 (controller "ddlctl" + login side)
#   netns ddl-nodeI: eth0 = 10.77.0.(10+I)/24, veth peer ddlvethI in the bridge, no default route
#
# Nothing can leave the machine: ip_forward is untouched, the namespaces have no default route, and
# "unreachable 10.77.0.0/16" catches any other 10.77.x.y instead of the default route.

ns_name() { echo "$NS_PREFIX$1"; }

# ddl-node namespaces that exist now (also ones left over from a run with more nodes).
existing_namespaces() {
  local f
  for f in /run/netns/"$NS_PREFIX"*; do [ -e "$f" ] && basename "$f"; done
  return 0
}

# hosts_lines: the /etc/hosts lines we own; every one ends with the tag so that down can find them.
hosts_lines() {
  local i
  echo "$CTL_IP $CTL_HOST $HOSTS_TAG"
  for ((i = 1; i <= NODES; i++)); do echo "$(node_ip "$i") node$i $HOSTS_TAG"; done
}

# write_hosts WANTED: replace our tagged lines by WANTED (may be empty). Rewrites the file in place
# (cat >, not sed -i / mv) so that a bind-mounted /etc/hosts (containers) keeps working, and only
# when something changes.
write_hosts() {
  local want=$1 cur rest
  cur=$(grep -F -- "$HOSTS_TAG" /etc/hosts || true)
  [ "$cur" = "$want" ] && return 0
  rest=$(grep -v -F -- "$HOSTS_TAG" /etc/hosts || true)
  { [ -n "$rest" ] && printf '%s\n' "$rest"; [ -n "$want" ] && printf '%s\n' "$want"; } >/etc/hosts.ddl-tmp
  cat /etc/hosts.ddl-tmp >/etc/hosts
  rm -f /etc/hosts.ddl-tmp
}

# kill_ns_members NS [KEEP_PID...]: SIGKILL every process in that namespace (slurmd, slurmstepd,
# job tasks) except KEEP_PIDs. They are ours by construction: only the dev cluster starts processes
# in ddl-node namespaces.
kill_ns_members() {
  local p keep=" ${*:2} "
  for p in $(ip netns pids "$1" 2>/dev/null); do
    [[ "$keep" == *" $p "* ]] || kill -9 "$p" 2>/dev/null || true
  done
}

delete_ns() {
  local ns=$1 i=${1#"$NS_PREFIX"}
  kill_ns_members "$ns"
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$VETH_PREFIX$i" 2>/dev/null || true # normally gone with the namespace already
}

# Idempotent (pitfall 12: namespaces, bridge and hosts lines outlive a SIGKILL of every process,
# so they are reused as found).
net_up() {
  local i ns veth ip
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  # (captured, not piped into grep -q: with pipefail an early grep exit can fail the pipe)
  [[ "$(ip -4 addr show dev "$BRIDGE")" == *" $CTL_IP/24 "* ]] || ip addr add "$CTL_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  [[ "$(ip route show)" == *"unreachable 10.77.0.0/16"* ]] || ip route add unreachable 10.77.0.0/16
  for ((i = 1; i <= NODES; i++)); do
    ns=$(ns_name "$i") veth=$VETH_PREFIX$i ip=$(node_ip "$i")
    if [ ! -e "/run/netns/$ns" ]; then
      ip link del "$veth" 2>/dev/null || true
      ip netns add "$ns"
      ip link add "$veth" type veth peer name eth0 netns "$ns"
      ip -n "$ns" addr add "$ip/24" dev eth0
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
  # fewer nodes than last time: drop the surplus namespaces
  for ns in $(existing_namespaces); do
    i=${ns#"$NS_PREFIX"}
    if ! [[ "$i" =~ ^[0-9]+$ ]] || [ "$i" -gt "$NODES" ]; then delete_ns "$ns"; fi
  done
  # names used by slurmctld (SlurmctldHost), srun, and torch (MASTER_ADDR=node1)
  write_hosts "$(hosts_lines)"
}

net_down() {
  local ns
  for ns in $(existing_namespaces); do delete_ns "$ns"; done
  ip link del "$BRIDGE" 2>/dev/null || true # the veths went away with their namespaces
  ip route del unreachable 10.77.0.0/16 2>/dev/null || true
  write_hosts ""
}
