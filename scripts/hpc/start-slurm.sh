#!/usr/bin/env bash
# A single-node Slurm cluster on this host, for `make test-slurm`: this host is the controller
# and the only compute node. Idempotent: installs slurm-wlm and munge only when missing, writes
# the config only when it changed, starts only the daemons that are not running, and returns
# once `sinfo` shows the node idle. Needs root; no systemd (the daemons are started directly).
# scripts/hpc/stop-slurm.sh stops what this starts.
set -euo pipefail

CONF_DIR=/etc/slurm
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
PARTITION=${RAAS_SLURM_PARTITION:-debug}

log() { echo "start-slurm: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    log "needs root (apt-get, /etc/slurm, the daemons)"
    exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
fi

# munge authenticates every Slurm message; the key must exist before munged starts.
if [ ! -s /etc/munge/munge.key ]; then
    log "creating the munge key"
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# The node line comes from the hardware slurmd sees, so the config never claims more CPUs or
# memory than there are (slurmd would mark the node invalid).
node=$(hostname -s)
hw=$(slurmd -C | head -n 1)
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
# RealMemory a little below what is free to the OS: slurmd drains a node that reports less.
mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
mem=$((mem * 95 / 100))
mkdir -p "$CONF_DIR" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR" "$RUN_DIR"
conf=$(cat <<CONF
# Written by raas scripts/hpc/start-slurm.sh: a single-node test cluster.
ClusterName=raas-test
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# Process tracking by the process tree: works without systemd-managed cgroups.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# How long jobs get between SIGTERM and SIGKILL on scancel or at the time limit.
KillWait=30
MinJobAge=300
SlurmdTimeout=60
InactiveLimit=0
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
)
changed=0
if [ "$(cat "$CONF_DIR/slurm.conf" 2>/dev/null)" != "$conf" ]; then
    printf '%s\n' "$conf" >"$CONF_DIR/slurm.conf"
    changed=1
fi

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if running "$RUN_DIR/slurmctld.pid" && [ $changed -eq 1 ]; then
    scontrol reconfigure || true
fi
if ! running "$RUN_DIR/slurmctld.pid"; then
    log "starting slurmctld"
    slurmctld
fi
if ! running "$RUN_DIR/slurmd.pid"; then
    log "starting slurmd"
    slurmd
fi

for _ in $(seq 300); do
    state=$(sinfo -h -n "$node" -o '%T' 2>/dev/null | head -n 1 || true)
    case "$state" in
        idle|mixed|allocated) exit 0 ;;
        down*|drain*|fail*) scontrol update NodeName="$node" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.2
done
log "node $node is not idle after 60 s (state: ${state:-none}); see $LOG_DIR/slurm*.log"
exit 1
