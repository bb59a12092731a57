#!/usr/bin/env bash
# Stops what scripts/hpc/start-slurm.sh started (slurmd, slurmctld, munged), by the pids in
# their pid files. Jobs still running are cancelled first so that their servers drain.
set -uo pipefail
RUN_DIR=/run/slurm

stop() {  # name, pid file
    local pid
    [ -s "$2" ] && pid=$(cat "$2") && kill -0 "$pid" 2>/dev/null || return 0
    echo "stop-slurm: stopping $1 ($pid)" >&2
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    echo "stop-slurm: $1 did not stop in 10 s: killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
}

if command -v squeue >/dev/null && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 400); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
fi
stop slurmd "$RUN_DIR/slurmd.pid"
stop slurmctld "$RUN_DIR/slurmctld.pid"
stop munged /run/munge/munged.pid
