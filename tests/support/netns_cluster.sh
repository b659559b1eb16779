# tests/support/netns_cluster.sh — several test hosts on one machine, for the tests of what crosses
# a network (run --hostfile, doctor, lost hosts); sourced by a test's bash script.
#
# Each host is a network namespace with its own address on a private bridge, its own hostname
# (a UTS namespace of its own), and an entry in /etc/hosts; mpirun (and doctor) reach a host
# through an rsh agent script that enters its namespaces instead of calling ssh. Everything is
# built inside a network, mount and UTS namespace of the test's own, so no packet can leave the
# test and nothing of it outlives the test's process.
#
#   netns_sandbox "$0" "$@"     first thing in the script: re-executes the script inside
#                                `unshare --net --mount --uts --fork` (sets NETNS_SANDBOX=1),
#                                or, where the machine forbids namespaces, reports the test as
#                                skipped (with the reason, in Bazel's XML) and exits 0
#   netns_cluster_up N          hosts node1 .. nodeN at 10.88.0.11 .. 10.88.0.(10+N)/24 on bridge
#                                br-mp, which itself has 10.88.0.1 (where mpirun runs: the test's
#                                own namespace); writes $NETNS_DIR/hosts and the agent
#                                $NETNS_DIR/agent, and exports OMPI_MCA_plm_rsh_agent to it
#   netns_run HOST CMD...       runs CMD on HOST (its namespaces, its hostname)
#   netns_block A B reject|drop makes A's packets to B fail at once (a prohibit route in A) or
#                                vanish (an iptables DROP rule in A's output chain)
#   netns_unblock A B           removes both
#
# The addresses are private ones inside the test's own network namespace: no other machine can
# see them, and the test reaches no address but these.
NETNS_SUBNET=10.88.0
NETNS_DIR=${NETNS_DIR:-}

netns_skip() { # netns_skip REASON: the test as skipped, for tools/test.sh's count
  echo "SKIP: $1"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    cat > "$XML_OUTPUT_FILE" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="${TEST_TARGET:-netns}" tests="1" failures="0" skipped="1">
<testcase name="${TEST_TARGET:-netns}" result="skipped"><skipped message="$1"/></testcase>
</testsuite></testsuites>
EOF
  fi
  exit 0
}

netns_sandbox() {
  if [ "${NETNS_SANDBOX:-}" = 1 ]; then return 0; fi
  local script=$1
  shift
  for tool in unshare ip; do
    command -v "$tool" >/dev/null 2>&1 || netns_skip "$tool is missing (Debian's util-linux, iproute2)"
  done
  if ! unshare --net --mount --uts --fork true 2>/dev/null; then
    netns_skip "this machine forbids network namespaces (unshare --net --mount --uts failed): the test hosts cannot be built"
  fi
  NETNS_SANDBOX=1 exec unshare --net --mount --uts --fork bash "$script" "$@"
}

netns_cluster_up() {
  local count=$1
  NETNS_DIR=${NETNS_DIR:-${TEST_TMPDIR:-$(mktemp -d)}/netns}
  mkdir -p "$NETNS_DIR"
  # Nothing mounted here propagates back to the machine.
  mount --make-rprivate /
  mkdir -p /run/netns && mount -t tmpfs netns /run/netns
  ip link set lo up
  ip link add br-mp type bridge
  ip addr add "$NETNS_SUBNET.1/24" dev br-mp
  ip link set br-mp up
  {
    echo "127.0.0.1 localhost"
    echo "$NETNS_SUBNET.1 launcher"
  } > "$NETNS_DIR/hosts"
  local i
  for ((i = 1; i <= count; ++i)); do
    local host=node$i address=$NETNS_SUBNET.$((10 + i))
    ip netns add "$host"
    ip link add "veth$i" type veth peer name eth0 netns "$host"
    ip link set "veth$i" master br-mp up
    ip netns exec "$host" ip addr add "$address/24" dev eth0
    ip netns exec "$host" ip link set eth0 up
    ip netns exec "$host" ip link set lo up
    echo "$address $host" >> "$NETNS_DIR/hosts"
  done
  mount --bind "$NETNS_DIR/hosts" /etc/hosts
  # The rsh agent: `agent HOST COMMAND...` as ssh would run COMMAND on HOST (a shell command
  # line), in HOST's network namespace with HOST as its hostname.
  cat > "$NETNS_DIR/agent" <<'EOF'
#!/bin/bash
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/bash -c 'hostname "$0"; eval "$1"' "$host" "$*"
EOF
  chmod +x "$NETNS_DIR/agent"
  export OMPI_MCA_plm_rsh_agent="$NETNS_DIR/agent"
  # Open MPI's out-of-band and TCP transports over the bridge only.
  export OMPI_MCA_oob_tcp_if_include=$NETNS_SUBNET.0/24
  export OMPI_MCA_btl_tcp_if_include=$NETNS_SUBNET.0/24
}

netns_run() {
  local host=$1
  shift
  "$NETNS_DIR/agent" "$host" "$(printf '%q ' "$@")"
}

netns_address() { getent hosts "$1" | awk '{print $1}'; }

netns_block() {
  local from=$1 to=$2 how=$3 address
  address=$(netns_address "$to")
  case "$how" in
    reject) ip netns exec "$from" ip route add prohibit "$address/32" ;;
    drop) ip netns exec "$from" iptables -A OUTPUT -d "$address" -j DROP ;;
    *) echo "netns_block: reject or drop, not '$how'" >&2; return 2 ;;
  esac
}

netns_unblock() {
  local from=$1 to=$2 address
  address=$(netns_address "$to")
  ip netns exec "$from" ip route del prohibit "$address/32" 2>/dev/null
  ip netns exec "$from" iptables -D OUTPUT -d "$address" -j DROP 2>/dev/null
  return 0
}
