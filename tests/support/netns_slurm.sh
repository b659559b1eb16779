# tests/support/netns_slurm.sh — a real Slurm (munged, slurmctld, one slurmd per test host) on the
# test hosts of tests/support/netns_cluster.sh; sourced by a test's bash script after that file.
#
#   netns_slurm_check          skips the test (by name, saying why) where Debian's slurm-wlm or
#                              munge is missing, or where the test does not run as root (slurmd
#                              starts the tasks as their user; SlurmUser=root here)
#   netns_slurm_up N           after `netns_cluster_up N`: a munge key and munged, a slurm.conf
#                              (NodeName per host with its address, no cgroups), slurmctld in the
#                              test's own namespace (the "launcher" host, 10.88.0.1) and a slurmd
#                              in every host's namespace under that host's name; exports
#                              SLURM_CONF; waits until every node is idle
#   netns_slurm_down           ends the jobs, then the daemons, then whatever is left in the
#                              hosts' namespaces; netns_slurm_up sets it as the EXIT trap (and
#                              turns SIGTERM/SIGINT into an exit), so a test that needs a trap of
#                              its own calls it there. The daemons run in the foreground as
#                              children of the script, with SIGKILL as their parent-death signal:
#                              none outlives a test that is killed.
#   netns_slurm_logs           prints the daemons' logs (for a failing test)
#
# Everything lives under $NETNS_SLURM_DIR: $NETNS_DIR/slurm, or, where that path is too long for
# the Unix sockets of munged and slurmstepd (108 bytes), a directory of mktemp's in /tmp that
# netns_slurm_down removes. The daemons listen only on the bridge of the test's own network
# namespace; munged's socket is passed to Slurm through AuthInfo=socket=... (slurm.conf) and to
# munge's clients through NETNS_SLURM_MUNGE_SOCKET.
NETNS_SLURM_DIR=${NETNS_SLURM_DIR:-}
NETNS_SLURM_TMP=
NETNS_SLURM_PIDS=
NETNS_SLURM_HOSTS=

netns_slurm_check() {
  local tool
  for tool in munged slurmctld slurmd srun sbatch salloc sinfo squeue scancel setpriv; do
    command -v "$tool" >/dev/null 2>&1 ||
      netns_skip "$tool is missing: install Debian's slurm-wlm and munge (tools/setup.sh)"
  done
  [ "$(id -u)" = 0 ] ||
    netns_skip "Slurm's daemons here run as root (SlurmUser=root, slurmd starts tasks as their user): not root"
}

netns_slurm_logs() {
  local log
  for log in "$NETNS_SLURM_DIR"/log/*; do
    [ -f "$log" ] || continue
    echo "---- $log"
    tail -n 40 "$log"
  done
}

netns_slurm_down() {
  [ -n "$NETNS_SLURM_DIR" ] || return 0
  # Jobs first (their slurmstepds end with them), then the daemons, then whatever is left in the
  # hosts' network namespaces (a slurmstepd still cleaning up): all of it the test's own.
  scancel --quiet --full --user=root 2>/dev/null
  local pid tries host
  for ((tries = 0; tries < 25; ++tries)); do
    [ -z "$(squeue -h 2>/dev/null)" ] && break
    sleep 0.2
  done
  for pid in $NETNS_SLURM_PIDS; do kill "$pid" 2>/dev/null; done
  for pid in $NETNS_SLURM_PIDS; do
    for ((tries = 0; tries < 25; ++tries)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null
  done
  for host in $NETNS_SLURM_HOSTS; do
    for pid in $(ip netns pids "$host" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  wait 2>/dev/null
  NETNS_SLURM_PIDS=
  if [ -n "$NETNS_SLURM_TMP" ]; then
    rm -rf "$NETNS_SLURM_TMP"
    NETNS_SLURM_TMP=
  fi
}

# netns_slurm_daemon LOG COMMAND...: COMMAND in the foreground of a child of this script, ended
# with SIGKILL should the script die without netns_slurm_down (setpriv --pdeathsig).
netns_slurm_daemon() {
  local log=$1
  shift
  "$@" >>"$log" 2>&1 &
  NETNS_SLURM_PIDS="$NETNS_SLURM_PIDS $!"
}

netns_slurm_up() {
  local count=$1 i
  NETNS_SLURM_DIR=$NETNS_DIR/slurm
  if [ "${#NETNS_SLURM_DIR}" -gt 48 ]; then
    NETNS_SLURM_TMP=$(mktemp -d /tmp/mpslurm.XXXXXX)
    NETNS_SLURM_DIR=$NETNS_SLURM_TMP
  fi
  trap netns_slurm_down EXIT
  trap 'exit 143' TERM INT
  local dir=$NETNS_SLURM_DIR
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/tmp" "$dir/nodetmp"
  chmod 0700 "$dir/munge"
  chmod 0755 "$dir/run"
  # munge: a key of the test's own, munged on a socket of the test's own.
  head -c 1024 /dev/urandom > "$dir/munge/munge.key"
  chmod 0400 "$dir/munge/munge.key"
  export NETNS_SLURM_MUNGE_SOCKET=$dir/run/munge.socket
  netns_slurm_daemon "$dir/log/munged.out" setpriv --pdeathsig KILL \
    munged --foreground --force --socket="$NETNS_SLURM_MUNGE_SOCKET" \
    --key-file="$dir/munge/munge.key" --pid-file="$dir/run/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" --origin="$NETNS_SUBNET.1"
  for ((i = 0; i < 50; ++i)); do
    [ -S "$NETNS_SLURM_MUNGE_SOCKET" ] && break
    sleep 0.1
  done
  [ -S "$NETNS_SLURM_MUNGE_SOCKET" ] || {
    echo "netns_slurm_up: munged did not start" >&2
    netns_slurm_logs >&2
    return 1
  }
  local cpus
  cpus=${NETNS_SLURM_CPUS:-4}
  {
    echo "ClusterName=mpengine"
    echo "SlurmctldHost=launcher($NETNS_SUBNET.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$NETNS_SLURM_MUNGE_SOCKET"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides"
    echo "StateSaveLocation=$dir/state"
    echo "TmpFS=$dir/nodetmp"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
    echo "SlurmdPidFile=$dir/run/slurmd.%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd.%n.log"
    echo "MailProg=/bin/true"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    echo "InactiveLimit=0"
    echo "KillWait=2"
    echo "MinJobAge=10"
    echo "Waittime=0"
    for ((i = 1; i <= count; ++i)); do
      echo "NodeName=node$i NodeAddr=$NETNS_SUBNET.$((10 + i)) CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } > "$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf
  # slurmctld on the launcher: its own UTS namespace, named as SlurmctldHost says.
  netns_slurm_daemon "$dir/log/slurmctld.out" unshare --uts /bin/bash -c \
    'hostname launcher; exec setpriv --pdeathsig KILL slurmctld -D -i -f "$0"' "$SLURM_CONF"
  for ((i = 1; i <= count; ++i)); do
    mkdir -p "$dir/spool/node$i" "$dir/tmp/node$i"
    # `ip netns exec` mounts a fresh /sys, without /sys/fs/cgroup, and slurmd 22.05 will not start
    # without a cgroup file system there ("No filesystem mounted on /sys/fs/cgroup") even with
    # proctrack/linuxproc and task/none: an empty tmpfs in the host's own mount namespace is enough
    # (with name=systemd's cgroup v1 hierarchy mounted in it, slurmd takes it for cgroup v1 and,
    # with these plugins, creates nothing in it). TmpFS, where slurmstepd's PMIx server makes its
    # directories (/tmp/spmix_appdir_<uid>_<job>.<step>), is a directory of each host's own: the
    # hosts share one file system, and two slurmstepds of one step would collide in one /tmp
    # ("pmixp_mkdir: Cannot create directory ...: File exists").
    netns_slurm_daemon "$dir/log/slurmd.node$i.out" ip netns exec "node$i" unshare --uts /bin/bash -c \
      'hostname "$0"
       mount -t tmpfs cgroup /sys/fs/cgroup
       mkdir /sys/fs/cgroup/systemd
       mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
       mount --bind "$2/tmp/$0" "$2/nodetmp"
       exec setpriv --pdeathsig KILL slurmd -D -N "$0" -f "$1"' \
      "node$i" "$SLURM_CONF" "$dir"
    NETNS_SLURM_HOSTS="$NETNS_SLURM_HOSTS node$i"
  done
  # Every node idle, within 20 s.
  local tries
  for ((tries = 0; tries < 100; ++tries)); do
    if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" = "$count" ]; then return 0; fi
    sleep 0.2
  done
  echo "netns_slurm_up: the nodes did not come up idle within 20 s:" >&2
  sinfo -N >&2
  netns_slurm_logs >&2
  return 1
}
