/*
 * rawloop: the physical limit for running many small commands on one machine.
 *
 *   rawloop [-f] [-a] [-P N] [-o DIR] [FILE]   (FILE omitted or "-": read stdin)
 *
 * Runs each non-empty line of FILE as a command: the line is split on spaces,
 * the program is looked up in PATH once (and cached), and it is exec'd directly
 * (no shell). At most N children run at once (default 1). Each child gets
 * stdin from /dev/null and stdout+stderr appended to its slot's output file
 * DIR/slot-<i> (default DIR: ./rawloop-out), like htc's per-slot stream files.
 * Children are reaped with waitpid(-1).
 *
 * Spawning uses posix_spawn (glibc >= 2.24: clone(CLONE_VM|CLONE_VFORK), no
 * page-table copy). With -f it uses fork()+execv() instead, for reference.
 * With -a, slot i's children are pinned to CPU (i mod online CPUs): the loop sets
 * its own affinity right before spawning and the child inherits it (what htc's
 * executor does), to tell the effect of pinning apart from everything else.
 *
 * Exit status: 0 when every command exited 0, 1 otherwise (2 on usage error).
 * A summary line (tasks, failures, wall seconds, tasks/s) goes to stderr.
 *
 * Build: gcc -O2 -o rawloop rawloop.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- PATH lookup, cached ---- */
struct cache_ent { char *name; char *path; /* NULL: not found */ };
static struct cache_ent *cache;
static size_t cache_len, cache_cap;
static char *path_env;

static const char *resolve(const char *prog)
{
    if (strchr(prog, '/'))
        return prog;
    for (size_t i = 0; i < cache_len; i++)
        if (strcmp(cache[i].name, prog) == 0)
            return cache[i].path;
    char *found = NULL;
    const char *p = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
    while (*p && !found) {
        const char *e = strchr(p, ':');
        size_t dl = e ? (size_t)(e - p) : strlen(p);
        char buf[4096];
        if (dl == 0)
            snprintf(buf, sizeof buf, "./%s", prog);
        else
            snprintf(buf, sizeof buf, "%.*s/%s", (int)dl, p, prog);
        struct stat st;
        if (access(buf, X_OK) == 0 && stat(buf, &st) == 0 && S_ISREG(st.st_mode))
            found = strdup(buf);
        p = e ? e + 1 : p + dl;
    }
    if (cache_len == cache_cap) {
        cache_cap = cache_cap ? 2 * cache_cap : 16;
        cache = realloc(cache, cache_cap * sizeof *cache);
    }
    cache[cache_len].name = strdup(prog);
    cache[cache_len].path = found;
    cache_len++;
    return found;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
    fprintf(stderr, "usage: rawloop [-f] [-a] [-P N] [-o DIR] [FILE]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int use_fork = 0, pin = 0, par = 1, opt;
    const char *outdir = "rawloop-out";
    while ((opt = getopt(argc, argv, "faP:o:")) != -1) {
        switch (opt) {
        case 'f': use_fork = 1; break;
        case 'a': pin = 1; break;
        case 'P': par = atoi(optarg); if (par < 1) usage(); break;
        case 'o': outdir = optarg; break;
        default: usage();
        }
    }
    if (argc - optind > 1)
        usage();
    FILE *in = stdin;
    if (optind < argc && strcmp(argv[optind], "-") != 0) {
        in = fopen(argv[optind], "r");
        if (!in) { perror(argv[optind]); return 2; }
    }
    path_env = getenv("PATH");

    if (mkdir(outdir, 0755) != 0 && errno != EEXIST) { perror(outdir); return 2; }
    int *slot_fd = calloc(par, sizeof *slot_fd);
    pid_t *slot_pid = calloc(par, sizeof *slot_pid);
    posix_spawn_file_actions_t *fa = calloc(par, sizeof *fa);
    for (int i = 0; i < par; i++) {
        char name[4096];
        snprintf(name, sizeof name, "%s/slot-%d", outdir, i);
        slot_fd[i] = open(name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (slot_fd[i] < 0) { perror(name); return 2; }
        /* Per-slot file actions, built once: stdin </dev/null, 1 and 2 >>slot file.
         * dup2 clears FD_CLOEXEC on the target, so the O_CLOEXEC slot fds themselves
         * are not inherited. */
        posix_spawn_file_actions_init(&fa[i]);
        posix_spawn_file_actions_addopen(&fa[i], 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_adddup2(&fa[i], slot_fd[i], 1);
        posix_spawn_file_actions_adddup2(&fa[i], slot_fd[i], 2);
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC); /* for the fork path */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    int pinned_to = -1;

    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    char **av = NULL;
    size_t av_cap = 0;
    long tasks = 0, failed = 0;
    int running = 0;
    double t0 = now();

    for (;;) {
        /* Fill free slots. */
        int eof = 0;
        while (running < par) {
            len = getline(&line, &cap, in);
            if (len < 0) { eof = 1; break; }
            if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
            size_t ac = 0;
            for (char *tok = strtok(line, " "); tok; tok = strtok(NULL, " ")) {
                if (ac + 2 > av_cap) {
                    av_cap = av_cap ? 2 * av_cap : 16;
                    av = realloc(av, av_cap * sizeof *av);
                }
                av[ac++] = tok;
            }
            if (ac == 0) continue;
            av[ac] = NULL;
            tasks++;
            int slot = 0;
            while (slot_pid[slot] != 0) slot++;
            const char *prog = resolve(av[0]);
            if (!prog) {
                dprintf(slot_fd[slot], "rawloop: %s: command not found\n", av[0]);
                failed++;
                continue;
            }
            if (pin && pinned_to != slot % ncpu) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(slot % ncpu, &set);
                if (sched_setaffinity(0, sizeof set, &set) == 0)
                    pinned_to = slot % ncpu;
                else
                    { perror("sched_setaffinity"); pin = 0; }
            }
            pid_t pid;
            if (use_fork) {
                pid = fork();
                if (pid == 0) {
                    dup2(devnull, 0);
                    dup2(slot_fd[slot], 1);
                    dup2(slot_fd[slot], 2);
                    execve(prog, av, environ);
                    _exit(127);
                }
                if (pid < 0) { perror("fork"); failed++; continue; }
            } else {
                int rc = posix_spawn(&pid, prog, &fa[slot], NULL, av, environ);
                if (rc != 0) {
                    dprintf(slot_fd[slot], "rawloop: %s: %s\n", prog, strerror(rc));
                    failed++;
                    continue;
                }
            }
            slot_pid[slot] = pid;
            running++;
        }
        if (running == 0 && eof)
            break;
        /* Reap one child (block), then any others already exited. */
        int status, flags = 0;
        pid_t pid;
        while ((pid = waitpid(-1, &status, flags)) > 0) {
            for (int i = 0; i < par; i++)
                if (slot_pid[i] == pid) { slot_pid[i] = 0; running--; break; }
            if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
                failed++;
            flags = WNOHANG;
        }
        if (pid < 0 && errno != ECHILD && errno != EINTR) { perror("waitpid"); return 2; }
        if (eof && running == 0)
            break;
    }
    double dt = now() - t0;
    fprintf(stderr, "rawloop(%s%s, P=%d): %ld tasks, %ld failed, %.3f s, %.0f tasks/s\n",
            use_fork ? "fork" : "posix_spawn", pin ? ", pinned" : "", par, tasks, failed, dt, dt > 0 ? tasks / dt : 0.0);
    return failed ? 1 : 0;
}
