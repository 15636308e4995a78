/*
 * Guest cgroups: the agent above everything it runs, and every exec's processes in a
 * cgroup of their own with a process limit.
 *
 * At boot the agent mounts cgroup v2 at /sys/fs/cgroup, enables the cpu and pids
 * controllers, moves itself into /agent (cpu.weight 10000, nice -10) and makes /execs
 * (cpu.weight 100). Each exec gets /execs/exec-N with pids.max; its first process moves
 * itself there before it execs, so everything the exec starts is counted, and starts at
 * nice 0. A fork bomb then hits its cgroup's limit (the kernel refuses the fork), its
 * processes share one weight-100 slice of the CPU against the agent's 10000, and the
 * agent sees the limit being hit (pids.events changes, which poll() reports as POLLPRI)
 * and kills the cgroup (cgroup.kill).
 *
 * An exec's cgroup outlives the exec while processes it left in the background run (they
 * survive the exec by design). Such a cgroup stays watched: if it hits its limit later
 * (a fork bomb started with `&`), it is killed then; once it is empty (cgroup.events says
 * populated 0) it is removed.
 *
 * Without cgroup v2 (test mode, or a kernel without it) everything here is a no-op and
 * execs run as before.
 */
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define CGROUP_ROOT "/sys/fs/cgroup"
#define AGENT_CGROUP CGROUP_ROOT "/agent"
#define EXECS_CGROUP CGROUP_ROOT "/execs"
/* cpu.weight ranges over 1..10000; the default is 100. */
#define AGENT_CPU_WEIGHT "10000"
#define EXECS_CPU_WEIGHT "100"
#define AGENT_NICE (-10)
#define EXEC_NICE 0
/* Per exec; lowered to half the kernel's threads-max where that is smaller (a 256 MiB
   guest allows ~1900 tasks in all), so one exec can never use up the whole guest. */
#define EXEC_PIDS_MAX_DEFAULT 1024u
#define EXEC_PIDS_MAX_FLOOR 64u
/* Cgroups of finished execs still watched for their limit and for becoming empty. */
#define LINGERING_MAX 32

static struct {
    bool available;
    uint32_t pids_max;
    uint64_t next_seq;
    /* A lingering cgroup was dropped from the watch list: sweep the directory for empty ones. */
    bool sweep_needed;
} limits = {.pids_max = EXEC_PIDS_MAX_DEFAULT, .next_seq = 1};

struct lingering_cgroup {
    uint64_t seq;
    int pids_events_fd;
    int cgroup_events_fd;
};

static struct lingering_cgroup lingering[LINGERING_MAX];
static size_t lingering_count;

/* ---------------------------------------------------------------- helpers */

static bool write_text_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        agent_log("open %s: %s", path, strerror(errno));
        return false;
    }
    bool ok = write_all(fd, text, strlen(text));
    if (!ok) agent_log("write %s to %s: %s", text, path, strerror(errno));
    close(fd);
    return ok;
}

static void exec_cgroup_path(uint64_t seq, const char *file, char *buf, size_t cap)
{
    if (file) snprintf(buf, cap, EXECS_CGROUP "/exec-%llu/%s", (unsigned long long)seq, file);
    else snprintf(buf, cap, EXECS_CGROUP "/exec-%llu", (unsigned long long)seq);
}

static int open_exec_cgroup_file(uint64_t seq, const char *file, int flags)
{
    char path[128];
    exec_cgroup_path(seq, file, path, sizeof path);
    return open(path, flags | O_CLOEXEC);
}

/* Reads a small cgroup file from the start (which also re-arms its poll notification). */
static bool read_cgroup_file(int fd, char *buf, size_t cap)
{
    ssize_t n;
    do n = pread(fd, buf, cap - 1, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) return false;
    buf[n] = '\0';
    return true;
}

/* The value of `key` in a flat-keyed file ("max 3\n", "populated 0\n..."), or -1. */
static long long keyed_value(const char *text, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, key, n) == 0 && p[n] == ' ') return strtoll(p + n + 1, NULL, 10);
    }
    return -1;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static uint32_t pids_max_for_this_guest(void)
{
    uint32_t max = EXEC_PIDS_MAX_DEFAULT;
    char text[32];
    int fd = open("/proc/sys/kernel/threads-max", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, text, sizeof text - 1);
        close(fd);
        if (n > 0) {
            text[n] = '\0';
            unsigned long threads = strtoul(text, NULL, 10);
            if (threads / 2 < max) max = (uint32_t)(threads / 2);
        }
    }
    return max < EXEC_PIDS_MAX_FLOOR ? EXEC_PIDS_MAX_FLOOR : max;
}

/* ------------------------------------------------------------------- boot */

void limits_init(void)
{
    make_directories(CGROUP_ROOT, 0755);
    /* favordynmods: moving a task between cgroups (once per exec) must not wait for an RCU
       grace period, which is slow under TCG; forks and exits pay a little instead. */
    if (mount("cgroup2", CGROUP_ROOT, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "favordynmods") != 0 &&
        mount("cgroup2", CGROUP_ROOT, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0 && errno != EBUSY) {
        agent_log("mount cgroup2 on %s: %s; execs run without process limits", CGROUP_ROOT, strerror(errno));
        return;
    }
    if (!write_text_file(CGROUP_ROOT "/cgroup.subtree_control", "+cpu +pids")) {
        agent_log("no cpu/pids controllers; execs run without process limits");
        return;
    }
    if (make_directories(AGENT_CGROUP, 0755) != 0 || make_directories(EXECS_CGROUP, 0755) != 0) {
        agent_log("mkdir under %s: %s; execs run without process limits", CGROUP_ROOT, strerror(errno));
        return;
    }
    write_text_file(AGENT_CGROUP "/cpu.weight", AGENT_CPU_WEIGHT);
    write_text_file(EXECS_CGROUP "/cpu.weight", EXECS_CPU_WEIGHT);
    if (!write_text_file(AGENT_CGROUP "/cgroup.procs", "0")) return;
    if (!write_text_file(EXECS_CGROUP "/cgroup.subtree_control", "+cpu +pids")) return;
    if (setpriority(PRIO_PROCESS, 0, AGENT_NICE) != 0) agent_log("setpriority: %s", strerror(errno));
    limits.pids_max = pids_max_for_this_guest();
    limits.available = true;
    agent_log("exec cgroups under %s, pids.max %u", EXECS_CGROUP, limits.pids_max);
}

uint32_t exec_pids_max(void) { return limits.pids_max; }

/* ------------------------------------------------------- lingering cgroups */

static void forget_lingering(size_t i)
{
    close_fd(&lingering[i].pids_events_fd);
    close_fd(&lingering[i].cgroup_events_fd);
    memmove(lingering + i, lingering + i + 1, (lingering_count - i - 1) * sizeof lingering[0]);
    lingering_count--;
}

static bool remove_exec_cgroup(uint64_t seq)
{
    char path[128];
    exec_cgroup_path(seq, NULL, path, sizeof path);
    return rmdir(path) == 0 || errno == ENOENT;
}

static void kill_exec_cgroup(uint64_t seq)
{
    char path[128];
    exec_cgroup_path(seq, "cgroup.kill", path, sizeof path);
    write_text_file(path, "1");
}

/* Whether pids.events counts a refused fork. A file that cannot be read any more (root in the
   guest removed the cgroup, say) would poll as changed forever: it is closed instead. */
static bool limit_was_hit(int *pids_events_fd)
{
    char text[64];
    if (*pids_events_fd < 0) return false;
    if (!read_cgroup_file(*pids_events_fd, text, sizeof text)) {
        close_fd(pids_events_fd);
        return false;
    }
    return keyed_value(text, "max") > 0;
}

/* Removes every empty exec cgroup no longer watched (rmdir fails on populated ones). */
static void sweep_exec_cgroups(void)
{
    DIR *dir = opendir(EXECS_CGROUP);
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, "exec-", 5) != 0) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, EXECS_CGROUP "/%s", e->d_name);
        (void)rmdir(path);
    }
    closedir(dir);
    limits.sweep_needed = false;
}

void limits_add_poll_fds(struct poll_set *ps)
{
    for (size_t i = 0; i < lingering_count; i++) {
        if (lingering[i].pids_events_fd >= 0) poll_set_add(ps, lingering[i].pids_events_fd, POLLPRI, POLL_CGROUP_PIDS);
        poll_set_add(ps, lingering[i].cgroup_events_fd, POLLPRI, POLL_CGROUP_EVENTS);
    }
}

void limits_handle_poll(enum poll_owner owner, int fd, short revents)
{
    if (!(revents & (POLLPRI | POLLERR))) return;
    for (size_t i = 0; i < lingering_count; i++) {
        struct lingering_cgroup *l = &lingering[i];
        if (owner == POLL_CGROUP_PIDS && l->pids_events_fd == fd) {
            if (limit_was_hit(&l->pids_events_fd)) {
                /* A process tree left behind by a finished exec hit the limit: a fork bomb
                   started in the background. Nobody waits for a result any more. */
                agent_log("exec cgroup %llu hit its process limit after its exec ended; killing it", (unsigned long long)l->seq);
                kill_exec_cgroup(l->seq);
                close_fd(&l->pids_events_fd);
            }
            return;
        }
        if (owner == POLL_CGROUP_EVENTS && l->cgroup_events_fd == fd) {
            /* Unreadable: the cgroup is gone already (a sweep, or root in the guest). */
            char text[128];
            bool readable = read_cgroup_file(fd, text, sizeof text);
            if (!readable || (keyed_value(text, "populated") == 0 && remove_exec_cgroup(l->seq))) forget_lingering(i);
            return;
        }
    }
}

/* ------------------------------------------------------------ per exec */

bool exec_cgroup_create(struct exec_cgroup *cg)
{
    cg->seq = 0;
    cg->procs_fd = cg->pids_events_fd = -1;
    if (!limits.available) return false;
    if (limits.sweep_needed) sweep_exec_cgroups();
    char path[128];
    for (;;) {
        cg->seq = limits.next_seq++;
        exec_cgroup_path(cg->seq, NULL, path, sizeof path);
        if (mkdir(path, 0755) == 0) break;
        if (errno == EEXIST) continue;
        agent_log("mkdir %s: %s; this exec runs without a process limit", path, strerror(errno));
        cg->seq = 0;
        return false;
    }
    char value[16];
    snprintf(value, sizeof value, "%u", limits.pids_max);
    exec_cgroup_path(cg->seq, "pids.max", path, sizeof path);
    cg->procs_fd = open_exec_cgroup_file(cg->seq, "cgroup.procs", O_WRONLY);
    cg->pids_events_fd = open_exec_cgroup_file(cg->seq, "pids.events", O_RDONLY);
    if (!write_text_file(path, value) || cg->procs_fd < 0) {
        close_fd(&cg->procs_fd);
        close_fd(&cg->pids_events_fd);
        remove_exec_cgroup(cg->seq);
        cg->seq = 0;
        return false;
    }
    return true;
}

void exec_cgroup_enter_child(const struct exec_cgroup *cg)
{
    if (!limits.available) return;
    /* The agent runs at AGENT_NICE; what it starts must not inherit that. */
    (void)setpriority(PRIO_PROCESS, 0, EXEC_NICE);
    if (cg->procs_fd >= 0) (void)!write(cg->procs_fd, "0", 1);
}

bool exec_cgroup_limit_hit(struct exec_cgroup *cg) { return cg->seq && limit_was_hit(&cg->pids_events_fd); }

void exec_cgroup_kill(const struct exec_cgroup *cg)
{
    if (cg->seq) kill_exec_cgroup(cg->seq);
}

void exec_cgroup_release(struct exec_cgroup *cg)
{
    if (!cg->seq) return;
    close_fd(&cg->procs_fd);
    if (remove_exec_cgroup(cg->seq)) {
        close_fd(&cg->pids_events_fd);
        cg->seq = 0;
        return;
    }
    /* Still populated: background processes of this exec live on. Watch it. */
    if (lingering_count == LINGERING_MAX) {
        forget_lingering(0);
        limits.sweep_needed = true;
    }
    int events_fd = open_exec_cgroup_file(cg->seq, "cgroup.events", O_RDONLY);
    if (events_fd < 0) {
        close_fd(&cg->pids_events_fd);
        limits.sweep_needed = true;
    } else {
        lingering[lingering_count++] = (struct lingering_cgroup){cg->seq, cg->pids_events_fd, events_fd};
        /* It may have emptied between the rmdir and the open: check now, not at the next event. */
        limits_handle_poll(POLL_CGROUP_EVENTS, events_fd, POLLPRI);
    }
    cg->pids_events_fd = -1;
    cg->seq = 0;
}
