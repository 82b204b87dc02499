#!/usr/bin/env bash
# A throw-away three-node Slurm cluster on this one machine, for vigil's Slurm tests.
#
#   cluster.sh start    install slurm-wlm + munge if missing, then start munged (unless a working
#                       one runs), slurmctld and one slurmd per node; does nothing if already up
#   cluster.sh stop     cancel every job, then stop the daemons `start` started (its pid files)
#   cluster.sh status   exit 0 iff the controller answers and every node is usable
#
# Nodes n1..nN are all this host (multiple-slurmd mode: NodeAddr=127.0.0.1, one port each), so
# SLURMD_NODENAME, not `hostname`, tells them apart. Must run as root (Debian 12, slurm-wlm 22.05).
# `start` wipes the controller's state: job ids restart at 1.
#
# Environment:
#   VIGIL_SLURM_DIR     config, state, logs and pid files      (/tmp/vigil-slurm)
#   VIGIL_SLURM_NODES   number of nodes                        (3)
#   VIGIL_SLURM_CPUS    CPUs each node advertises, whatever this machine has   (8)
#   VIGIL_SLURM_KILL_WAIT  KillWait: seconds from SIGTERM to SIGKILL when a job is ended  (5)
#   VIGIL_SLURM_CTLD_PORT  slurmctld's port                    (6817)
#   VIGIL_SLURM_PORT0      slurmd of node nI listens on PORT0+I  (17000)
#   VIGIL_SLURM_CLUSTER_NAME  ClusterName                      (vigil)
# A second, private cluster (say a one-node one) runs beside the default one with its own DIR and
# ports; only the default DIR is symlinked from /etc/slurm/slurm.conf, so clients of a private one
# need SLURM_CONF=$DIR/etc/slurm.conf (jobs inherit it from sbatch's environment).
set -euo pipefail

DIR=${VIGIL_SLURM_DIR:-/tmp/vigil-slurm}
NODES=${VIGIL_SLURM_NODES:-3}
CPUS=${VIGIL_SLURM_CPUS:-8}
KILL_WAIT=${VIGIL_SLURM_KILL_WAIT:-5}
CONF=$DIR/etc/slurm.conf
RUN=$DIR/run
LOGS=$DIR/log
STATE=$DIR/state
PORT0=${VIGIL_SLURM_PORT0:-17000} # slurmd of node nI listens on PORT0+I
CTLD_PORT=${VIGIL_SLURM_CTLD_PORT:-6817}
CLUSTER_NAME=${VIGIL_SLURM_CLUSTER_NAME:-vigil}
DEFAULT_DIR=/tmp/vigil-slurm
export SLURM_CONF=$CONF

say() { echo "[cluster.sh $(date +%T)] $*"; }
STARTING=0
die() {
    echo "[cluster.sh] error: $*" >&2
    if [ $STARTING = 1 ]; then
        STARTING=0
        stop >&2 # what this failed start had started
    fi
    exit 1
}
# The pid in pid file $1 is a live process.
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
# Retries a check every 0.1 s for at most $1 seconds: waiting on external daemons that have no
# notification interface; the bound is a failure, not a timing goal.
retry() {
    local secs=$1 i
    shift
    for ((i = 0; i < secs * 10; i++)); do
        "$@" && return 0
        sleep 0.1
    done
    "$@"
}
# Each node appears once per partition in `sinfo -N`: count distinct nodes.
node_states() { sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }
# Slurm clients wait up to MessageTimeout (10 s) per try for an answer; bound every call.
sinfo() { timeout 20 sinfo "$@"; }
scontrol() { timeout 20 scontrol "$@"; }
squeue() { timeout 20 squeue "$@"; }
# Something accepts connections on 127.0.0.1:$1.
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
usable_nodes() { node_states | grep -cE ' (idle|mixed|allocated|completing)$' || true; }
idle_nodes() { node_states | grep -cE ' idle$' || true; }

# 0 iff our slurmctld and every slurmd run, the controller answers and all nodes are usable.
is_up() {
    [ -r "$CONF" ] || return 1
    running "$RUN/slurmctld.pid" || return 1
    local i
    for ((i = 1; i <= NODES; i++)); do running "$RUN/slurmd-n$i.pid" || return 1; done
    scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
    [ "$(usable_nodes)" -ge "$NODES" ]
}

install_packages() {
    local missing=0 c
    for c in slurmctld slurmd sbatch srun scontrol munged munge; do
        command -v "$c" >/dev/null || missing=1
    done
    [ $missing = 0 ] && return 0
    say "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends slurm-wlm munge ||
        { apt-get update && apt-get install -y --no-install-recommends slurm-wlm munge; } ||
        die "could not install slurm-wlm and munge with apt-get"
}

start_munge() {
    if munge_works; then
        say "munged already running"
        return 0
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    mkdir -p /var/lib/munge /var/log/munge
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged --force
    retry 5 munge_works || die "munged runs but munge/unmunge fail; see /var/log/munge/munged.log"
    cp /run/munge/munged.pid "$RUN/munged.pid" # ours: `stop` stops it
}

# Stops the processes named by the given pid files: SIGTERM, at most 10 s, then SIGKILL.
stop_pids() {
    local f p pids=()
    for f in "$@"; do
        [ -f "$f" ] || continue
        if running "$f"; then
            p=$(cat "$f")
            say "stopping $(basename "$f" .pid) (pid $p)"
            kill -TERM "$p" 2>/dev/null && pids+=("$p")
        fi
    done
    gone() {
        local p
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 1; done
        return 0
    }
    if [ ${#pids[@]} -gt 0 ] && ! retry 10 gone; then
        for p in "${pids[@]}"; do
            kill -0 "$p" 2>/dev/null && say "pid $p outlived SIGTERM: SIGKILL" && kill -KILL "$p"
        done
    fi
    rm -f "$@"
}

write_config() {
    local host
    host=$(hostname -s)
    mkdir -p "$DIR/etc"
    cat >"$CONF" <<EOF
# Written by tests/slurm/cluster.sh: nodes n1..n$NODES are all this host ($host).
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only after its credential expired: 5 s is the minimum.
AuthInfo=cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobRequeue=1
KillWait=$KILL_WAIT
# Without accounting, scontrol knows a finished job only for MinJobAge seconds.
MinJobAge=3600
ReturnToService=2
# Nodes advertise the CPUs configured here, not the machine's, so jobs shaped like GPU nodes
# (8 tasks per node) fit anywhere. Nothing binds tasks to CPUs (TaskPlugin=task/none).
SlurmdParameters=config_overrides
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=n[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT0 + 1))-$((PORT0 + NODES)) \
    CPUs=$CPUS RealMemory=1024 State=UNKNOWN
# A job in a partition of a higher PriorityTier preempts (requeues) jobs in lower ones: the
# preempted job's steps get SIGTERM (after SIGCONT), GraceTime seconds, then the requeue's kill.
# 'urgent' preempts 'debug'; 'high' preempts 'low' (and 'debug', 'urgent') with a grace long
# enough for a checkpoint at an agreed step. All four span the same nodes.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=10
PartitionName=urgent Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
PartitionName=low Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20
PartitionName=high Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
    # Plain sbatch/srun, including srun inside a job, read /etc/slurm/slurm.conf.
    [ "$DIR" = "$DEFAULT_DIR" ] || return 0
    mkdir -p /etc/slurm
    if [ -e /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" != "$CONF" ]; then
        local backup
        backup=/etc/slurm/slurm.conf.before-vigil.$(date +%s)
        say "moving the existing /etc/slurm/slurm.conf to $backup"
        mv /etc/slurm/slurm.conf "$backup"
    fi
    ln -sfn "$CONF" /etc/slurm/slurm.conf
}

start() {
    [ "$(id -u)" = 0 ] || die "must run as root (slurmd runs jobs as root here)"
    # The daemons must not inherit a descriptor of whoever started us: under
    # `flock /tmp/vigil-slurm.lock cluster.sh start` munged would hold the lock for good.
    local fd
    for fd in /proc/$$/fd/*; do
        fd=${fd##*/}
        [ "$fd" -gt 2 ] 2>/dev/null && [ "$fd" -lt 255 ] && eval "exec $fd>&-" 2>/dev/null
    done
    if is_up; then
        say "cluster already up"
        where
        return 0
    fi
    install_packages
    mkdir -p "$RUN" "$LOGS" "$STATE"
    # Leftovers of an earlier start (partly up, or stale pid files).
    stop_pids "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid"
    local port
    for port in "$CTLD_PORT" $(seq $((PORT0 + 1)) $((PORT0 + NODES))); do
        port_taken "$port" &&
            die "port $port in use (another Slurm?); needs $CTLD_PORT, $((PORT0 + 1))-$((PORT0 + NODES))"
    done
    STARTING=1
    start_munge
    rm -rf "${STATE:?}"/*
    local f i
    for f in "$LOGS"/*.log; do [ -e "$f" ] && mv -f "$f" "$f.prev"; done
    mkdir -p "$STATE/ctld"
    for ((i = 1; i <= NODES; i++)); do mkdir -p "$STATE/slurmd-n$i"; done
    write_config

    say "starting slurmctld"
    /usr/sbin/slurmctld -f "$CONF" || die "slurmctld failed to start; see $LOGS/slurmctld.log"
    ctld_up() {
        # The daemon writes its pid file a moment after `slurmctld` returns.
        if [ -s "$RUN/slurmctld.pid" ] && ! running "$RUN/slurmctld.pid"; then
            tail -n 5 "$LOGS/slurmctld.log" >&2
            die "slurmctld exited; see $LOGS/slurmctld.log"
        fi
        scontrol ping 2>/dev/null | grep -q 'is UP'
    }
    retry 20 ctld_up || die "slurmctld does not answer; see $LOGS/slurmctld.log"
    for ((i = 1; i <= NODES; i++)); do
        say "starting slurmd n$i (port $((PORT0 + i)))"
        /usr/sbin/slurmd -f "$CONF" -N "n$i" || die "slurmd n$i failed; see $LOGS/slurmd-n$i.log"
    done
    all_idle() { [ "$(idle_nodes)" -ge "$NODES" ]; }
    if ! retry 30 all_idle || ! is_up; then
        sinfo -N >&2 || true
        tail -n 20 "$LOGS"/*.log >&2 || true
        die "cluster did not come up; logs in $LOGS"
    fi
    STARTING=0
    say "cluster up"
    where
}

where() {
    sinfo -N -p debug
    echo "config:  $CONF (export SLURM_CONF=$CONF)"
    echo "logs:    $LOGS/slurmctld.log $LOGS/slurmd-n<i>.log"
    echo "state:   $STATE   pid files: $RUN"
}

stop() {
    if running "$RUN/slurmctld.pid"; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            say "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
            # shellcheck disable=SC2086
            scancel --quiet $jobs 2>/dev/null || true
            no_jobs() { [ -z "$(squeue -h -o %i 2>/dev/null)" ]; }
            retry 30 no_jobs || say "warning: jobs left: $(squeue -h -o '%i %T' | tr '\n' ' ')"
        fi
    fi
    # slurmds first, then the controller (it saves its state on SIGTERM), then munged if ours.
    stop_pids "$RUN"/slurmd-*.pid
    stop_pids "$RUN/slurmctld.pid"
    stop_pids "$RUN/munged.pid"
    say "stopped"
}

status() {
    if is_up; then
        sinfo -N -p debug
        echo "up: $NODES nodes usable (config $CONF)"
        return 0
    fi
    echo "down (or not all $NODES nodes usable); config $CONF"
    [ -r "$CONF" ] && running "$RUN/slurmctld.pid" && sinfo -N -p debug 2>/dev/null
    return 1
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
