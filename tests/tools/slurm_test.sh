#!/usr/bin/env bash
# tests/tools/slurm_test.sh — mpengine inside a real Slurm allocation (issue 30, item 2): Debian's
# slurm-wlm (slurmctld, one slurmd per test host) and munge on two test hosts of
# tests/support/netns_cluster.sh, 4 ranks per host at (dp, pp, tp) = (2, 2, 2). What works with
# Debian 12's Slurm 22.05 and Open MPI 4.1, each step's losses equal to the one-host run's:
#   - `mpengine run` with no hostfile inside `salloc` and inside `sbatch` (examples/slurm/
#     train.sbatch): mpirun reads the allocation and starts its daemons through srun;
#   - `srun --mpi=pmix mpengine run`: one task per rank, direct launch through Slurm's PMIx;
# and what does not, with its error: `srun --mpi=pmi2` (Debian's Open MPI has no PMI-2 client).
# docs/slurm.md says why. Skips, by name and saying why, where namespaces or Slurm are missing.
set -uo pipefail
mpengine=$(realpath "${1:-${MPENGINE:-tools/mpengine}}")
plan=$(realpath "${2:-examples/plans/tiny-gpt-dp2-pp2-tp2.json}")
sbatch_example=$(realpath "${3:-examples/slurm/train.sbatch}")
support=$(dirname "${BASH_SOURCE[0]}")/../support
source "$support/netns_cluster.sh" || { echo "FAIL: cannot load netns_cluster.sh"; exit 1; }
source "$support/netns_slurm.sh" || { echo "FAIL: cannot load netns_slurm.sh"; exit 1; }
netns_sandbox "$0" "$@"
netns_slurm_check

tmp=${TEST_TMPDIR:-$(mktemp -d)}/slurm
rm -rf "$tmp" && mkdir -p "$tmp"
export NETNS_DIR=$tmp/netns
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

netns_cluster_up 2
netns_slurm_up 2 || { echo "FAIL: Slurm did not start on the test hosts"; exit 1; }
# Inside an allocation nothing reaches the hosts but Slurm: no rsh agent, no hostfile.
unset OMPI_MCA_plm_rsh_agent
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# mpirun as root (Slurm's tasks here run as root): .bazelrc sets these for bazel test.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$tmp" || exit 1

losses() { grep -o '^step [0-9]*/[0-9]* | loss [0-9.]*' "$1"; }

# The one-host run the others must equal.
timeout 120 "$mpengine" run --config "$plan" --steps 3 > one_host.log 2>&1 ||
  { cat one_host.log; echo "FAIL: the one-host run failed"; exit 1; }
want=$(losses one_host.log)
[ "$(echo "$want" | wc -l)" = 3 ] || { cat one_host.log; echo "FAIL: no 3 steps in the one-host run"; exit 1; }

check_run() { # check_run NAME LOG: the log holds the one-host run's losses, step for step
  local got
  got=$(losses "$2")
  if [ "$got" = "$want" ]; then
    echo "ok: $1: the one-host run's losses"
  else
    tail -n 30 "$2"
    fail "$1: losses differ from the one-host run's: want
$want
got
$got"
  fi
}

# sbatch_wait SCRIPT_ARGS...: submits, waits (60 s at most) and prints the job's id
sbatch_wait() {
  local id tries
  id=$(sbatch --parsable "$@") || return 1
  for ((tries = 0; tries < 300; ++tries)); do
    [ -z "$(squeue -h -j "$id" 2>/dev/null)" ] && break
    sleep 0.2
  done
  echo "$id"
}

# Slurm itself: a step on both hosts, each under its own name.
hosts=$(timeout 30 srun -N2 hostname 2>&1 | sort | tr '\n' ' ')
[ "$hosts" = "node1 node2 " ] || fail "srun -N2 hostname printed '$hosts', not node1 and node2"

# (a) salloc, mpirun placing by the allocation (4 slots per host).
placed=$(timeout 60 salloc -N2 --ntasks-per-node=4 mpirun hostname 2>/dev/null | sort | uniq -c |
  awk '{print $2 "x" $1}' | tr '\n' ' ')
[ "$placed" = "node1x4 node2x4 " ] || fail "salloc mpirun hostname placed '$placed', not 4 per host"

# (a) salloc, mpengine run with no hostfile and no Open MPI setting: the launcher sees the
# allocation and leaves transports and slots to Open MPI (one machine's self,vader would reach no
# other host).
env -u OMPI_MCA_btl timeout 120 salloc -N2 --ntasks-per-node=4 \
  "$mpengine" run --config "$plan" --steps 3 > salloc.log 2>&1
check_run "salloc -N2 --ntasks-per-node=4 mpengine run" salloc.log

# (a) and (b) through the shipped example, as a user submits it. The test hosts have no GPUs
# (no GresTypes in their slurm.conf), so the example's --gpus-per-node line goes.
sed '/^#SBATCH --gpus-per-node/d' "$sbatch_example" > train.sbatch
for launch in mpirun srun; do
  id=$(MPENGINE=$mpengine PLAN=$plan LAUNCH=$launch IFACE=eth0 \
    sbatch_wait --output="$tmp/sbatch-$launch.log" train.sbatch --steps 3)
  if [ -z "$id" ]; then
    fail "sbatch examples/slurm/train.sbatch (LAUNCH=$launch) was refused"
    continue
  fi
  grep -q "on node\[1-2\] (8 tasks: 4(x2) per node), launch by $launch" "sbatch-$launch.log" ||
    fail "sbatch (LAUNCH=$launch): the job did not name its allocation node[1-2], 4 tasks per node"
  check_run "sbatch examples/slurm/train.sbatch (LAUNCH=$launch)" "sbatch-$launch.log"
done

# (b) srun direct launch through Slurm's PMIx.
timeout 120 srun -N2 --ntasks-per-node=4 --mpi=pmix \
  "$mpengine" run --config "$plan" --steps 3 > srun_pmix.log 2>&1
check_run "srun --mpi=pmix mpengine run" srun_pmix.log

# What cannot work: srun --mpi=pmi2. Debian's Open MPI has PMIx (ext3x) but no PMI-1/PMI-2 client
# (no s1/s2 component), so MPI_Init fails in every rank, at once.
timeout 60 srun -N2 --ntasks-per-node=4 --mpi=pmi2 \
  "$mpengine" run --config "$plan" --steps 3 > srun_pmi2.log 2>&1
code=$?
if [ "$code" = 0 ] || [ "$code" = 124 ]; then
  fail "srun --mpi=pmi2: exit $code, not a failure at start-up (docs/slurm.md says it cannot work: update it)"
elif ! grep -q "OMPI was not built with SLURM's PMI support" srun_pmi2.log; then
  tail -n 20 srun_pmi2.log
  fail "srun --mpi=pmi2 failed without Open MPI's 'not built with SLURM's PMI support'"
else
  echo "ok: srun --mpi=pmi2 fails at MPI_Init: OMPI was not built with SLURM's PMI support"
fi

# What cannot work and is refused: srun without PMIx (--mpi=none). Its tasks are no MPI ranks;
# each would start an mpirun of its own and wait for the CPUs the step holds. Every task says so
# and exits 2, at once.
timeout 60 srun -N2 --ntasks-per-node=2 --mpi=none \
  "$mpengine" run --config "$plan" --steps 3 > srun_none.log 2>&1
code=$?
if [ "$code" = 124 ]; then
  fail "srun --mpi=none mpengine run: hung (timeout 60 s), not refused"
elif [ "$code" = 0 ]; then
  fail "srun --mpi=none mpengine run: exit 0, not refused"
elif [ "$(grep -c "of 4 of a Slurm job step (srun) was started without PMIx, so it is no MPI rank" srun_none.log)" != 4 ]; then
  tail -n 20 srun_none.log
  fail "srun --mpi=none: want the refusal from each of the 4 tasks"
else
  echo "ok: srun --mpi=none is refused by every task: $(grep -m1 "without PMIx" srun_none.log)"
fi

if [ "$failures" -ne 0 ]; then
  netns_slurm_logs
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS"
