#!/usr/bin/env bash
# Developer aid (raas will get its own `raas datasets check`): checks Harbor tasks without
# Docker, in chroots of the base root filesystem that `raas/harbor-base:bookworm` is made from
# (scripts/images/make-base-rootfs.sh). For each task it builds the environment twice by
# applying its Dockerfile by hand (FROM, WORKDIR, COPY, ENV, RUN, CMD only) to a copy of that
# root filesystem, starts the CMD (if any) in the background, and runs the verifier
#   - on the untouched environment (a no-op agent): the reward must be 0;
#   - after the gold solution (bash /solution/solve.sh from the WORKDIR): the reward must be 1.
# The reward is reward.txt, or reward.json's "reward" key. Prints a table, exits non-zero if a
# task is wrong. Needs root (chroot, mount).
#
# Usage: scripts/harbor/check-tasks-chroot.sh TASKS_DIR [TASK_NAME...]
# Env: RAAS_HARBOR_BASE_ROOTFS (default: $RAAS_CACHE_DIR or ~/.cache/raas, + swe-images/base-rootfs),
#      RAAS_HARBOR_SERVICE_WAIT (seconds to let a CMD start, default 2).
set -euo pipefail

die() { echo "check-tasks-chroot: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: $0 TASKS_DIR [TASK_NAME...]"
[ "$(id -u)" = 0 ] || die "needs root (chroot, mount --bind /proc)"
TASKS_DIR=$(cd "$1" && pwd)
shift
BASE="${RAAS_HARBOR_BASE_ROOTFS:-${RAAS_CACHE_DIR:-$HOME/.cache/raas}/swe-images/base-rootfs}"
[ -e "$BASE/.raas-complete" ] || die "no base root filesystem at $BASE (run scripts/images/make-base-rootfs.sh)"
SERVICE_WAIT="${RAAS_HARBOR_SERVICE_WAIT:-2}"
HOST_PY=$(command -v python3) || die "needs python3 on the host (to read JSON)"

WORK=$(mktemp -d /tmp/raas-harbor-check.XXXXXX)
SERVICE_PID=""
ROOT=""

# Stops the service we started (its own process group, made by setsid), unmounts /proc and
# removes the root filesystem copy. Never removes a tree that still has a mount inside.
teardown_root() {
    if [ -n "$SERVICE_PID" ]; then
        kill -TERM -- "-$SERVICE_PID" 2>/dev/null || true
        sleep 0.2
        kill -KILL -- "-$SERVICE_PID" 2>/dev/null || true
        wait "$SERVICE_PID" 2>/dev/null || true
        SERVICE_PID=""
    fi
    if [ -n "$ROOT" ]; then
        if mountpoint -q "$ROOT/proc"; then
            umount "$ROOT/proc" || umount -l "$ROOT/proc" || true
        fi
        if mountpoint -q "$ROOT/proc"; then
            echo "check-tasks-chroot: $ROOT/proc is still mounted; leaving $ROOT in place" >&2
        else
            rm -rf --one-file-system "$ROOT"
        fi
        ROOT=""
    fi
}
cleanup() {
    teardown_root
    if ! grep -q " $WORK/" /proc/mounts; then
        rm -rf --one-file-system "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# in_root SECONDS CMD: runs a shell command in the chroot, with the image's environment and
# working directory, for at most SECONDS.
in_root() {
    local seconds=$1 cmd=$2
    env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        "${ENVS[@]}" RAAS_CHECK_WD="$WD" RAAS_CHECK_CMD="$cmd" \
        timeout "$seconds" chroot "$ROOT" /bin/bash -c 'cd "$RAAS_CHECK_WD" && eval "$RAAS_CHECK_CMD"'
}

# Resolves a path in the image against the current WORKDIR.
abs_in_image() { case "$1" in /*) echo "$1" ;; *) echo "${WD%/}/$1" ;; esac; }

# Applies the task's Dockerfile to $ROOT; sets WD, ENVS and CMD_ARGS.
apply_dockerfile() {
    local env_dir=$1 line instr args
    WD=/
    ENVS=()
    CMD_ARGS=()
    local joined=""
    while IFS= read -r line || [ -n "$line" ]; do
        # Continuation lines (a trailing backslash) are joined before parsing.
        if [[ "$line" == *\\ ]]; then joined+="${line%\\} "; continue; fi
        line="$joined$line"
        joined=""
        [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
        line="${line#"${line%%[![:space:]]*}"}"
        instr=${line%%[[:space:]]*}
        args=${line#"$instr"}
        args="${args#"${args%%[![:space:]]*}"}"
        case "${instr^^}" in
        FROM)
            [ "$args" = "raas/harbor-base:bookworm" ] || { echo "unsupported base image: $args"; return 1; } ;;
        WORKDIR)
            WD=$(abs_in_image "$args")
            mkdir -p "$ROOT$WD" ;;
        ENV)
            if [[ "${args%%[[:space:]]*}" == *=* ]]; then
                [[ "$args" != *[\"\']* ]] || { echo "quoted ENV values are not supported: $args"; return 1; }
                # shellcheck disable=SC2206  # word splitting is the point: K=V pairs
                ENVS+=($args)
            else
                ENVS+=("${args%%[[:space:]]*}=${args#*[[:space:]]}")
            fi ;;
        COPY)
            [[ "$args" != --* ]] || { echo "COPY flags are not supported: $args"; return 1; }
            local -a parts
            read -r -a parts <<<"$args"
            local dest src target n=${#parts[@]}
            [ "$n" -ge 2 ] || { echo "bad COPY: $args"; return 1; }
            dest=$(abs_in_image "${parts[$((n - 1))]}")
            for src in "${parts[@]:0:$((n - 1))}"; do
                [[ "$src" != *..* && "$src" != /* ]] || { echo "COPY source outside the context: $src"; return 1; }
                [ -e "$env_dir/$src" ] || { echo "COPY source missing: $src"; return 1; }
                if [ -d "$env_dir/$src" ]; then
                    # Like Docker: a directory's contents are copied into the destination.
                    mkdir -p "$ROOT$dest"
                    cp -a "$env_dir/$src/." "$ROOT$dest/"
                elif [[ "$dest" == */ ]] || [ "$n" -gt 2 ] || [ -d "$ROOT$dest" ]; then
                    mkdir -p "$ROOT$dest"
                    cp -a "$env_dir/$src" "$ROOT${dest%/}/"
                else
                    mkdir -p "$(dirname "$ROOT$dest")"
                    cp -a "$env_dir/$src" "$ROOT$dest"
                fi
            done ;;
        RUN)
            in_root 600 "$args" || { echo "RUN failed: $args"; return 1; } ;;
        CMD)
            if [[ "$args" == \[* ]]; then
                mapfile -d '' CMD_ARGS < <("$HOST_PY" -c 'import json,sys; sys.stdout.write("".join(a + "\0" for a in json.loads(sys.argv[1])))' "$args")
            else
                CMD_ARGS=(/bin/sh -c "$args")
            fi ;;
        *)
            echo "unsupported Dockerfile instruction: $instr"; return 1 ;;
        esac
    done <"$env_dir/Dockerfile"
}

# Prints the reward of the last verifier run in $ROOT, or "none".
read_reward() {
    local dir=$ROOT/logs/verifier
    if [ -f "$dir/reward.txt" ]; then
        tr -d '[:space:]' <"$dir/reward.txt"
    elif [ -f "$dir/reward.json" ]; then
        "$HOST_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["reward"])' "$dir/reward.json" 2>/dev/null || echo none
    else
        echo none
    fi
}

# run_case TASK_DIR MODE(noop|gold) LOG: sets REWARD. (Not run in a $(...) subshell, so that
# the traps see the root and the service it makes.)
run_case() {
    local task=$1 mode=$2 log=$3
    ROOT=$(mktemp -d "$WORK/root.XXXXXX")
    cp -a "$BASE/." "$ROOT/"
    REWARD=build-failed
    apply_dockerfile "$task/environment" >>"$log" 2>&1 || { teardown_root; return 0; }
    if [ ${#CMD_ARGS[@]} -gt 0 ]; then
        mount --bind /proc "$ROOT/proc"
        # setsid: the service gets its own process group, which teardown stops as a whole.
        env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${ENVS[@]}" \
            setsid chroot "$ROOT" /bin/sh -c 'cd "$0" && exec "$@"' "$WD" "${CMD_ARGS[@]}" >>"$log" 2>&1 </dev/null &
        SERVICE_PID=$!
        sleep "$SERVICE_WAIT"
        kill -0 "$SERVICE_PID" 2>/dev/null || { echo "the CMD exited early" >>"$log"; }
    fi
    if [ "$mode" = gold ]; then
        cp -a "$task/solution" "$ROOT/solution"
        echo "--- solve.sh" >>"$log"
        in_root 600 'bash /solution/solve.sh' >>"$log" 2>&1 \
            || echo "solve.sh exited with $?" >>"$log"
        rm -rf "$ROOT/solution"
    fi
    rm -rf "$ROOT/tests" "$ROOT/logs/verifier"
    cp -a "$task/tests" "$ROOT/tests"
    echo "--- test.sh" >>"$log"
    in_root 120 'bash /tests/test.sh' >>"$log" 2>&1 \
        || echo "test.sh exited with $?" >>"$log"
    REWARD=$(read_reward)
    teardown_root
}

if [ $# -gt 0 ]; then
    names=("$@")
else
    names=()
    for t in "$TASKS_DIR"/*/; do [ -f "$t/task.toml" ] && names+=("$(basename "$t")"); done
fi
[ ${#names[@]} -gt 0 ] || die "no tasks (directories with task.toml) in $TASKS_DIR"

failed=0
printf '%-20s %-8s %-8s %s\n' TASK NO-OP GOLD RESULT
for name in "${names[@]}"; do
    task=$TASKS_DIR/$name
    noop_log=$WORK/$name.noop.log
    gold_log=$WORK/$name.gold.log
    run_case "$task" noop "$noop_log"
    noop=$REWARD
    run_case "$task" gold "$gold_log"
    gold=$REWARD
    ok=$("$HOST_PY" -c 'import sys
def num(s):
    try: return float(s)
    except ValueError: return None
print("ok" if num(sys.argv[1]) == 0 and num(sys.argv[2]) == 1 else "WRONG")' "$noop" "$gold")
    printf '%-20s %-8s %-8s %s\n' "$name" "$noop" "$gold" "$ok"
    if [ "$ok" != ok ]; then
        failed=1
        for f in "$noop_log" "$gold_log"; do
            echo "  --- $(basename "$f") (last 30 lines)" >&2
            tail -n 30 "$f" | sed 's/^/  /' >&2
        done
    fi
done
exit "$failed"
