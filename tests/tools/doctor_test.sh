#!/bin/bash
# tests/tools/doctor_test.sh — `mpengine doctor` on two test hosts in network namespaces
# (tests/support/netns_cluster.sh, issue 30): healthy hosts pass within 60 s and --out writes a
# cluster that plan reads; a rejecting pair, a dropping pair and another build on node2 each fail
# naming the hosts and the check; bad input exits 2.
set -u
mpengine=$(realpath "${1:-${MPENGINE:-tools/mpengine}}")
source "$(dirname "${BASH_SOURCE[0]}")/../support/netns_cluster.sh" ||
  { echo "cannot load netns_cluster.sh"; exit 1; }
netns_sandbox "$0" "$@"
export MPENGINE_CALIBRATION= OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_MCA_btl
work=${TEST_TMPDIR:-$(mktemp -d)}/doctor
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Bad input first: no namespaces needed.
printf 'node1 slots=2\nnode2 slots two\n' > "$work/bad_hosts"
"$mpengine" doctor --hostfile "$work/bad_hosts" > "$work/out" 2>&1
code=$?
[ $code = 2 ] || fail "a malformed hostfile line: exit $code, not 2"
grep -q "bad_hosts:2" "$work/out" || fail "a malformed hostfile line is not named by FILE:LINE: $(cat "$work/out")"
env -u SLURM_JOB_NODELIST "$mpengine" doctor > "$work/out" 2>&1
code=$?
[ $code = 2 ] || fail "no --hostfile outside Slurm: exit $code, not 2"
grep -q -- "--hostfile" "$work/out" || fail "no --hostfile outside Slurm does not say to give it: $(cat "$work/out")"

NETNS_DIR=$work/netns netns_cluster_up 2
printf 'node1 slots=2\nnode2 slots=2\n' > "$work/hosts"

doctor() { # doctor NAME [options]: runs doctor on the hostfile, output in $work/NAME
  local name=$1
  shift
  local start=$SECONDS
  timeout 90 "$mpengine" doctor --hostfile "$work/hosts" "$@" > "$work/$name" 2>&1
  code=$?
  seconds=$((SECONDS - start))
  echo "--- doctor ($name): exit $code in ${seconds}s"
  cat "$work/$name"
  [ "$seconds" -le 60 ] || fail "$name: doctor took ${seconds}s, more than 60"
}

doctor healthy --out "$work/cluster.json"
[ $code = 0 ] || fail "healthy hosts: exit $code, not 0"
grep -q '^FAIL' "$work/healthy" && fail "healthy hosts: a FAIL line"
for check in build open-mpi nccl cuda-driver resolve tcp gpus memory clock links all-reduce; do
  grep -q "^PASS $check " "$work/healthy" || fail "healthy hosts: no PASS line for $check"
done
"$mpengine" plan examples/models/tiny-gpt.json --gpus 4 --cluster "$work/cluster.json" > "$work/plan" 2>&1 ||
  fail "plan does not accept doctor's cluster: $(cat "$work/plan")"

netns_block node1 node2 reject
doctor reject
netns_unblock node1 node2
[ $code = 1 ] || fail "rejecting pair: exit $code, not 1"
grep -q '^FAIL tcp .*node1 -> node2: .* on node1.s eth0 .*no route' "$work/reject" ||
  fail "rejecting pair: no 'FAIL tcp node1 -> node2 ... no route' line"

netns_block node1 node2 drop
doctor drop
netns_unblock node1 node2
[ $code = 1 ] || fail "dropping pair: exit $code, not 1"
grep -q '^FAIL tcp .*node1 -> node2: .*timed out' "$work/drop" ||
  fail "dropping pair: no 'FAIL tcp node1 -> node2 ... timed out' line"

# Another build on node2: a copy of the binary with one byte appended (another hash, the same
# version), which node2's agent runs because MPENGINE_DOCTOR_BIN is set in node2's environment
# only: a remote shell that sets it for node2 and hands over to the test hosts' agent.
cp "$mpengine" "$work/mpengine-other"
printf 'x' >> "$work/mpengine-other"
cat > "$work/agent-other" <<AGENT
#!/bin/bash
if [ "\$1" = node2 ]; then export MPENGINE_DOCTOR_BIN=$work/mpengine-other; fi
exec $OMPI_MCA_plm_rsh_agent "\$@"
AGENT
chmod +x "$work/agent-other"
OMPI_MCA_plm_rsh_agent="$work/agent-other" doctor other-build
[ $code = 1 ] || fail "another build on node2: exit $code, not 1"
grep -q '^FAIL build .*node1: 0.1.0 build [0-9a-f]*; node2: 0.1.0 build ' "$work/other-build" ||
  fail "another build on node2: no 'FAIL build' line naming node1 and node2"

if [ $failures -gt 0 ]; then
  echo "$failures failures"
  exit 1
fi
echo "PASS"
