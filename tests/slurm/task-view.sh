#!/usr/bin/env bash
# What a task inherits under `sbatch --htc`: its view of itself (`ls -l /proc/self/fd`,
# `grep -E 'Sig(Ign|Blk)' /proc/self/status`) must equal that of `sh -c` started from a plain
# shell on the same machine, as the job's user: descriptors 0, 1 and 2 only, no signal ignored,
# none blocked. And while the job runs, no descriptor of its leader (`htc-agent lead`, in the
# batch step) or agents (`htc-agent work`, in the srun step) that belongs to the run — the
# ledger, the lock, stream files, its sockets — is inheritable by what they start.
#
#   tests/slurm/task-view.sh          (as root, after cargo build --release --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-test}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

bin=$HTC_CLUSTER_DIR/htc-bin

# The reference is `setsid env -i sh -c LINE` as the job's user. This script cannot simply start
# it: whatever started the script may have left it signals ignored (a Rust program's
# posix_spawn leaves glibc's 32 and 33 ignored; nohup, CI runners) and descriptors open, and bash
# can neither un-ignore a signal it was started with nor see every stray descriptor. So a tiny
# helper first puts back what a login shell on a terminal gives the commands it starts: every
# signal at its default (by the raw system call: glibc refuses 32 and 33), an empty mask, and
# nothing open above 2.
plain=$HTC_CLUSTER_DIR/plain-exec
build_plain() {
    cc -O -o "$plain" -x c - <<'EOF' && chmod 0755 "$plain"
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    unsigned long dfl[8];                 /* kernel struct sigaction: SIG_DFL, no flags, no mask */
    memset(dfl, 0, sizeof dfl);
    for (int s = 1; s <= 64; s++)
        if (s != SIGKILL && s != SIGSTOP) syscall(SYS_rt_sigaction, s, dfl, NULL, 8);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int fd = 3; fd < 65536; fd++) close(fd);
    if (argc > 1) execvp(argv[1], argv + 1);
    return 127;
}
EOF
}

# `ls -l /proc/self/fd` on stdin -> one "fd mode target" line per descriptor, by fd. The mode is
# the link's permission bits, i.e. how the descriptor was opened (r-x read, -wx write). Targets
# that necessarily differ are reduced to their kind: stdout and stderr are regular files in both
# (the task's are unnamed files of its own, which /proc shows as "/tmp/#INODE (deleted)" or
# "/memfd:… (deleted)", and which the agent appends to its slot's stream files when the task
# ends; the reference's are files of this test), the
# directory `ls` reads is /proc/<its pid>/fd, and pipes, sockets and anonymous inodes differ in
# their inode number only. Every other target, /dev/null included, is kept as it is.
fd_view() {
    local line left target kind
    while IFS= read -r line; do
        [[ $line == *' -> '* ]] || continue
        left=${line%% -> *} target=${line#* -> }
        case $target in
            /proc/[0-9]*/fd) kind=/proc/PID/fd ;;
            *:\[*\]) kind="${target%%:\[*}:[…]" ;;
            */\#*' (deleted)'|/memfd:*' (deleted)') kind="regular file" ;;
            *) if [[ -f $target ]]; then kind="regular file"; else kind=$target; fi ;;
        esac
        printf '%s %s %s\n' "${left##* }" "${left%% *}" "$kind"
    done | sort -n
}

same() { # LABEL EXPECTED ACTUAL: equal, or both shown
    if [[ $2 == "$3" ]]; then ok "$1"; else bad "$1"; printf -- '--- expected:\n%s\n--- got:\n%s\n' "$2" "$3"; fi
}

# Descriptors above 2 of PID that are not close-on-exec, as "fd -> target".
inheritable() {
    local f fd flags
    for f in /proc/"$1"/fd/*; do
        fd=${f##*/}
        ((fd > 2)) || continue
        flags=$(awk '/^flags:/ {print $2}' "/proc/$1/fdinfo/$fd" 2>/dev/null) || continue
        [[ -n $flags ]] || continue
        # O_CLOEXEC is 02000000 (octal) in the flags fdinfo shows.
        (((8#$flags & 8#2000000) == 0)) && printf '%s -> %s\n' "$fd" "$(readlink "$f")"
    done
}

ls_line='ls -l /proc/self/fd'
sig_line="grep -E 'Sig(Ign|Blk)' /proc/self/status"

echo "== 1 node"
"$root/tests/cluster/start-cluster.sh" -n 1 -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
install_htc
build_plain || { echo "cannot build the plain-shell helper (cc)"; exit 1; }

w=$(cluster_workdir task-view)
# Task 3 keeps the job running while the leader's and agents' descriptors are looked at.
printf '%s\n%s\nsleep 6\n' "$ls_line" "$sig_line" >"$w/tasks.txt"
printf '#!/bin/bash\n:\n' >"$w/job.sh"
chown -R "$HTC_CLUSTER_USER" "$w"
out=$(as_user -C "$w" sbatch --parsable --htc=tasks.txt job.sh 2>&1) || { bad "submit: $out"; out=; }
j=$(tail -n 1 <<<"$out" | cut -d';' -f1)

if [[ -n $j ]]; then
    # The engine's processes while task 3 runs, all as the user: the leader (`htc-agent lead`),
    # the agent's guard and the agent (`htc-agent work`, the agent being the parent of the task).
    # A wait that runs out is a failure: what was found by then need not include the agent.
    pids= seen=0
    for ((i = 0; i < 600; i++)); do
        # By process name: the srun processes' argv names htc-agent too, but srun is not ours.
        pids=$(pgrep -u "$HTC_CLUSTER_USER" -x htc-agent | tr '\n' ' ')
        task=$(pgrep -u "$HTC_CLUSTER_USER" -fx 'sleep 6' | head -n 1)
        agent=${task:+$(awk '/^PPid:/ { print $2 }' "/proc/$task/status" 2>/dev/null)}
        leads=0 works=0
        for p in $pids; do
            case $(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | sed -n 2p) in
                lead) leads=$((leads + 1)) ;;
                work) works=$((works + 1)) ;;
            esac
        done
        if [[ -n $agent && " $pids" == *" $agent "* && $leads -ge 1 && $works -ge 2 ]]; then
            seen=1
            break
        fi
        sleep 0.1
    done
    check "leader, guard and agent found while a task runs, within 60 s ($pids; task ${task:-none}, its parent ${agent:-none})" \
        test "$seen" = 1
    runs="$w/.htc/$j"
    for p in $pids; do
        what=$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -d' ' -f1-2)
        leak=$(inheritable "$p")
        # Descriptors slurmstepd itself leaves to the processes it starts are reported, not
        # failed: the executor's closefrom keeps them from tasks (checked below). The run's
        # own files and the engine's sockets and event descriptors must be close-on-exec.
        [[ -n $leak ]] && printf '     %s (pid %s) holds, inherited or not: %s\n' "$what" "$p" "$(tr '\n' ' ' <<<"$leak")"
        own=$(grep -E -- "-> ($runs|socket:|anon_inode:)" <<<"$leak")
        check "$what (pid $p): nothing of the run is inheritable${own:+: $own}" test -z "$own"
    done

    state=$(wait_job "$j" 120)
    check "job $j COMPLETED (was $state)" test "$state" = COMPLETED
    task_ls=$(as_user -C "$w" "$bin/htc" output "$j" 1)
    task_sig=$(as_user -C "$w" "$bin/htc" output "$j" 2)

    # The reference, with stdin from /dev/null and stdout/stderr to files like a task's.
    as_user -C "$w" "$plain" setsid env -i sh -c "$ls_line" </dev/null >"$w/ref-ls.out" 2>"$w/ref-ls.err"
    as_user -C "$w" "$plain" setsid env -i sh -c "$sig_line" </dev/null >"$w/ref-sig.out" 2>"$w/ref-sig.err"
    ref_ls=$(<"$w/ref-ls.out") ref_sig=$(<"$w/ref-sig.out")

    # The reference is what a shell on a terminal shows.
    same "plain sh -c: nothing ignored or blocked" $'SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000' "$ref_sig"
    same "plain sh -c: 0-2 and the directory ls reads" \
        $'0 lr-x------ /dev/null\n1 l-wx------ regular file\n2 l-wx------ regular file\n3 lr-x------ /proc/PID/fd' \
        "$(fd_view <<<"$ref_ls")"
    # The task's view equals it: Sig lines exactly, descriptors by number, mode and target.
    same "task's Sig lines equal plain sh -c's" "$ref_sig" "$task_sig"
    same "task's descriptors equal plain sh -c's" "$(fd_view <<<"$ref_ls")" "$(fd_view <<<"$task_ls")"
    [[ $failed == 0 ]] || printf -- '--- task 1 (ls -l /proc/self/fd):\n%s\n--- slurm-%s.out:\n%s\n' \
        "$task_ls" "$j" "$(tail -n 20 "$w/slurm-$j.out")"
fi

[[ $failed == 0 ]] || cluster_logs 20
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
