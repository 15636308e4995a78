/*
 * Background processes: commands started by PROC_START that run beside execs and outlive the
 * request that started them. Their output is sent as events (frame id 0) while a host is
 * attached, their stdin is fed by PROC_INPUT, and a table of the live ones and the last exited
 * ones answers PROC_LIST, so a host that was away (suspend/resume, a server restart, a fork
 * child's first connection) learns what it missed.
 *
 * Like exec.c everything is driven by the main poll loop. Each process runs in its own session
 * and its own cgroup under /execs (the idle pause sees it as activity; pids.max applies), with a
 * clean signal state, stdio on pipes or on a pseudo-terminal, and no agent fd.
 */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

/* Live processes at once; one more start is refused (too_many_processes). */
#define PROC_LIVE_MAX 64
/* Exited processes kept in the table for a host that comes back; the oldest goes first. */
#define PROC_EXITED_KEPT 64
/* What the table keeps of a command line and a tag (the process itself gets all of it). */
#define PROC_ARGV_KEPT 4096
#define PROC_ARGS_KEPT 64
#define PROC_TAG_MAX 256
#define PROC_CWD_KEPT 1024
/* Input queued for a process's stdin beyond what its pipe holds (one PROC_INPUT at a time). */
#define PROC_INPUT_MAX MAX_FRAME_PAYLOAD
/* After the main process exits its output is drained like an exec's (exec.c, step 4). */
#define DRAIN_QUIET_NS (20 * NS_PER_MS)
#define DRAIN_LIMIT_NS (500 * NS_PER_MS)
/* Output read while no host is attached is only counted; the pipe is then polled in batches. */
#define DISCARD_PAUSE_NS (5 * NS_PER_MS)

enum proc_stream_kind { STREAM_STDOUT = 1, STREAM_STDERR = 2, STREAM_PTY = 3 };
enum proc_state { PROC_RUNNING, PROC_DRAINING, PROC_EXITED };

struct proc_output {
    int fd;
    uint8_t kind;
    int64_t resume_at;
};

struct proc {
    pid_t pid;
    enum proc_state state;
    bool pty;
    int wait_status;
    struct proc_output out, err; /* err unused with a pty */

    /* stdin: a pipe (STDIN_OPEN), or a dup of the pty master; -1 once closed. */
    int stdin_fd;
    bool stdin_eof_pending; /* close (pipe) or send VEOF (pty) once the queued input is written */
    uint8_t *input;
    size_t input_len, input_done;
    uint32_t input_request; /* the PROC_INPUT answered once input is written; 0 = none */
    uint32_t close_request; /* the PROC_CLOSE_STDIN answered once done; 0 = none */

    struct exec_cgroup cgroup;
    bool pids_limited;
    uint64_t stdout_bytes, stderr_bytes, output_total;
    int64_t quiet_until, drain_until;
    uint64_t started_ns, finished_ns;
    int exit_code, signal_number;

    char argv_text[PROC_ARGV_KEPT]; /* NUL-separated */
    size_t argv_len, argc;
    bool argv_truncated;
    char cwd[PROC_CWD_KEPT];
    char tag[PROC_TAG_MAX + 1];
};

/* Live ones and kept exited ones, in start order. */
static struct proc *table[PROC_LIVE_MAX + PROC_EXITED_KEPT];
static size_t table_count;
static uint8_t read_buffer[OUTPUT_CHUNK_MAX];

/* ------------------------------------------------------------------ table */

static size_t count_in_state(bool exited)
{
    size_t n = 0;
    for (size_t i = 0; i < table_count; i++)
        if ((table[i]->state == PROC_EXITED) == exited) n++;
    return n;
}

static struct proc *find(pid_t pid)
{
    for (size_t i = 0; i < table_count; i++)
        if (table[i]->pid == pid) return table[i];
    return NULL;
}

static void drop_at(size_t i)
{
    struct proc *p = table[i];
    free(p->input);
    free(p);
    memmove(table + i, table + i + 1, (table_count - i - 1) * sizeof table[0]);
    table_count--;
}

/* Keeps at most PROC_EXITED_KEPT exited entries, dropping the oldest. */
static void trim_exited(void)
{
    while (count_in_state(true) > PROC_EXITED_KEPT) {
        for (size_t i = 0; i < table_count; i++) {
            if (table[i]->state == PROC_EXITED) {
                drop_at(i);
                break;
            }
        }
    }
}

/* ---------------------------------------------------------------- requests */

struct start_request {
    size_t args, envs, text_bytes;
    bool pty, stdin_open, seeded, no_aslr;
    uint32_t cols, rows;
    uint64_t seed;
    struct tlv_field cwd, tag;
    bool has_cwd, has_tag;
};

static bool read_pid(const uint8_t *payload, size_t len, pid_t *pid)
{
    struct tlv_cursor c;
    struct tlv_field f;
    uint32_t v;
    bool found = false;
    tlv_cursor_init(&c, payload, len);
    int rc;
    while ((rc = tlv_next(&c, &f)) == 1)
        if (f.tag == TAG_PID && tlv_as_u32(&f, &v)) found = true;
    if (rc < 0 || !found || v == 0 || v > INT32_MAX) return false;
    *pid = (pid_t)v;
    return true;
}

static void put_exit_fields(struct frame_builder *b, const struct proc *p)
{
    frame_put_i32(b, TAG_EXIT_CODE, p->exit_code);
    if (p->signal_number) frame_put_u32(b, TAG_SIGNAL, (uint32_t)p->signal_number);
    frame_put_u64(b, TAG_FINISHED_NS, p->finished_ns);
    if (p->pids_limited) frame_put_u8(b, TAG_PIDS_LIMITED, 1);
}

static void put_counters(struct frame_builder *b, const struct proc *p)
{
    frame_put_u64(b, TAG_STDOUT_BYTES, p->stdout_bytes);
    frame_put_u64(b, TAG_STDERR_BYTES, p->stderr_bytes);
    frame_put_u64(b, TAG_OUTPUT_TOTAL, p->output_total);
}

/* ------------------------------------------------------------------ spawn */

enum spawn_stage { SPAWN_STAGE_SETUP = 0, SPAWN_STAGE_CWD = 1, SPAWN_STAGE_EXEC = 2, SPAWN_STAGE_USER = 3 };

struct spawn_report {
    int stage;
    int error;
};

extern char **environ;

struct spawn_plan {
    char **argv;
    char **envp;
    const char *cwd;
    const struct run_as *user; /* NULL: root */
    bool no_aslr; /* ADDR_NO_RANDOMIZE: every seeded process, and an unseeded one that asks */
    const char *pty_slave; /* NULL: pipes */
    int stdin_fd, stdout_fd, stderr_fd, report_fd;
};

static void __attribute__((noreturn)) child_fail(int report_fd, int stage, int error)
{
    struct spawn_report report = {stage, error};
    (void)!write(report_fd, &report, sizeof report);
    _exit(stage == SPAWN_STAGE_EXEC && error == ENOENT ? 127 : 126);
}

static void __attribute__((noreturn)) become_process(struct proc *p, const struct spawn_plan *plan)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
    setsid();
    exec_cgroup_enter_child(&p->cgroup);

    if (plan->pty_slave) {
        int slave = open(plan->pty_slave, O_RDWR | O_NOCTTY);
        if (slave < 0 || ioctl(slave, TIOCSCTTY, 0) != 0) child_fail(plan->report_fd, SPAWN_STAGE_SETUP, errno);
        dup2(slave, 0);
        dup2(slave, 1);
        dup2(slave, 2);
        if (slave > 2) close(slave);
    } else {
        int in = plan->stdin_fd;
        if (in < 0) in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in < 0) {
            int empty[2];
            if (pipe2(empty, O_CLOEXEC) == 0) {
                close(empty[1]);
                in = empty[0];
            }
        }
        if (in >= 0) dup2(in, 0);
        dup2(plan->stdout_fd, 1);
        dup2(plan->stderr_fd, 2);
    }
    if (plan->user) {
        int e = run_as_become(plan->user);
        if (e) child_fail(plan->report_fd, SPAWN_STAGE_USER, e);
    }
    if (chdir(plan->cwd) != 0) child_fail(plan->report_fd, SPAWN_STAGE_CWD, errno);
    if (plan->no_aslr) {
        int current = personality(0xffffffff);
        if (current != -1) personality((unsigned long)current | ADDR_NO_RANDOMIZE);
    }
    environ = plan->envp;
    execvp(plan->argv[0], plan->argv);
    child_fail(plan->report_fd, SPAWN_STAGE_EXEC, errno);
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static bool measure_start(const uint8_t *payload, size_t len, struct start_request *req, const char **why)
{
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    size_t commands = 0;
    uint8_t u8;
    memset(req, 0, sizeof *req);
    req->cols = 80;
    req->rows = 24;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        switch (f.tag) {
        case TAG_ARGV_BEGIN:
            if (++commands > 1) return *why = "PROC_START takes exactly one command", false;
            break;
        case TAG_ARG:
            if (commands == 0) return *why = "ARG before ARGV_BEGIN", false;
            if (tlv_has_nul(&f)) return *why = "ARG contains a NUL byte", false;
            req->args++;
            req->text_bytes += f.len + 1;
            break;
        case TAG_ENV: {
            const uint8_t *eq = f.len ? memchr(f.value, '=', f.len) : NULL;
            if (!eq || eq == f.value || tlv_has_nul(&f)) return *why = "ENV must be KEY=VALUE without NUL", false;
            if (++req->envs > ENV_FIELDS_MAX) return *why = "too many ENV fields", false;
            req->text_bytes += f.len + 1;
            break;
        }
        case TAG_CWD:
            if (f.len == 0 || f.len >= PROC_CWD_KEPT || tlv_has_nul(&f))
                return *why = "CWD must be a non-empty string without NUL, shorter than 1024 bytes", false;
            req->cwd = f;
            req->has_cwd = true;
            break;
        case TAG_SEED:
            if (!tlv_as_u64(&f, &req->seed)) return *why = "SEED must be a u64", false;
            req->seeded = true;
            break;
        case TAG_NO_ASLR:
            if (!tlv_as_u8(&f, &u8)) return *why = "NO_ASLR must be a u8", false;
            req->no_aslr = u8 != 0;
            break;
        case TAG_PTY:
            if (!tlv_as_u8(&f, &u8)) return *why = "PTY must be a u8", false;
            req->pty = u8 != 0;
            break;
        case TAG_STDIN_OPEN:
            if (!tlv_as_u8(&f, &u8)) return *why = "STDIN_OPEN must be a u8", false;
            req->stdin_open = u8 != 0;
            break;
        case TAG_COLS:
        case TAG_ROWS: {
            uint32_t v;
            if (!tlv_as_u32(&f, &v) || v == 0 || v > 0xffff) return *why = "COLS/ROWS must be a u32 from 1 to 65535", false;
            if (f.tag == TAG_COLS) req->cols = v;
            else req->rows = v;
            break;
        }
        case TAG_PROC_TAG:
            if (f.len > PROC_TAG_MAX || tlv_has_nul(&f)) return *why = "TAG must be at most 256 bytes without NUL", false;
            req->tag = f;
            req->has_tag = true;
            break;
        }
    }
    if (rc < 0) return *why = "PROC_START payload is truncated", false;
    if (commands == 0 || req->args == 0) return *why = "PROC_START needs one command with at least one ARG", false;
    return true;
}

/* argv and envp in one allocation, freed once the child has exec'd (or failed to). */
static char **build_argv_env(const uint8_t *payload, size_t len, const struct start_request *req, struct run_as *user,
                             char ***envp_out, size_t *env_count_out)
{
    size_t env_slots = base_environment_count + RUN_AS_ENV_ENTRIES + req->envs + SEED_ENV_ENTRIES + 1;
    size_t size = (req->args + 1 + env_slots) * sizeof(char *) + req->text_bytes;
    char **argv = malloc(size ? size : 1);
    if (!argv) return NULL;
    char **envp = argv + req->args + 1;
    char *text = (char *)(envp + env_slots);
    size_t argc = 0, env_count = base_environment_count;
    memcpy(envp, base_environment, base_environment_count * sizeof(char *));
    if (user) run_as_environment(user, envp, &env_count);
    struct tlv_cursor c;
    struct tlv_field f;
    tlv_cursor_init(&c, payload, len);
    while (tlv_next(&c, &f) == 1) {
        if (f.tag != TAG_ARG && f.tag != TAG_ENV) continue;
        memcpy(text, f.value, f.len);
        text[f.len] = '\0';
        if (f.tag == TAG_ARG) argv[argc++] = text;
        else merge_env(envp, &env_count, text);
        text += f.len + 1;
    }
    argv[argc] = NULL;
    *envp_out = envp;
    *env_count_out = env_count;
    return argv;
}

static void remember_argv(struct proc *p, char **argv)
{
    for (size_t i = 0; argv[i]; i++) {
        size_t n = strlen(argv[i]) + 1;
        if (p->argv_len + n > sizeof p->argv_text || p->argc == PROC_ARGS_KEPT) {
            p->argv_truncated = true;
            break;
        }
        memcpy(p->argv_text + p->argv_len, argv[i], n);
        p->argv_len += n;
        p->argc++;
    }
}

/* Opens a pty master sized cols x rows; the slave's path goes into slave_path. */
static int open_pty(uint32_t cols, uint32_t rows, char *slave_path, size_t cap)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0) return -1;
    char *name;
    if (grantpt(master) != 0 || unlockpt(master) != 0 || !(name = ptsname(master)) || strlen(name) >= cap) {
        int e = errno;
        close(master);
        errno = e ? e : ENAMETOOLONG;
        return -1;
    }
    snprintf(slave_path, cap, "%s", name);
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    (void)ioctl(master, TIOCSWINSZ, &ws);
    return master;
}

void proc_handle_start(uint32_t id, const uint8_t *payload, size_t len)
{
    struct start_request req;
    const char *why = NULL;
    if (!measure_start(payload, len, &req, &why)) reject_request(id, "bad_request", "%s", why);
    if (count_in_state(false) >= PROC_LIVE_MAX)
        reject_request(id, "too_many_processes", "%d background processes are running, the most a sandbox may have; wait for one to exit or signal one",
                       PROC_LIVE_MAX);

    /* Static: one start at a time, and the child reads it only before exec. */
    static struct run_as user;
    int has_user = request_run_as(id, payload, len, &user);
    if (has_user < 0) return;
    struct proc *p = calloc(1, sizeof *p);
    char **envp = NULL;
    size_t env_count = 0;
    char **argv = p ? build_argv_env(payload, len, &req, has_user ? &user : NULL, &envp, &env_count) : NULL;
    if (!argv) {
        free(p);
        reject_request(id, "spawn_failed", "out of memory preparing the process");
    }
    struct seed_environment seed_env = {.preload_entry = NULL};
    if (req.seeded) apply_seed_environment(envp, &env_count, req.seed, &seed_env);
    envp[env_count] = NULL;
    if (req.has_cwd) tlv_copy_text(&req.cwd, p->cwd, sizeof p->cwd);
    else snprintf(p->cwd, sizeof p->cwd, "%s", has_user ? user_cwd(&user) : default_cwd());
    if (req.has_tag) tlv_copy_text(&req.tag, p->tag, sizeof p->tag);
    remember_argv(p, argv);
    p->pty = req.pty;
    p->out = (struct proc_output){.fd = -1, .kind = req.pty ? STREAM_PTY : STREAM_STDOUT};
    p->err = (struct proc_output){.fd = -1, .kind = STREAM_STDERR};
    p->stdin_fd = -1;

    int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1}, report[2] = {-1, -1};
    int master = -1;
    char slave_path[128];
    const char *failure = NULL;
    int error = 0;
    struct spawn_plan plan = {.argv = argv, .envp = envp, .cwd = p->cwd, .user = has_user ? &user : NULL, .no_aslr = req.seeded || req.no_aslr, .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1};

    if (pipe2(report, O_CLOEXEC) != 0) {
        failure = "pipe";
    } else if (req.pty) {
        master = open_pty(req.cols, req.rows, slave_path, sizeof slave_path);
        if (master < 0) failure = "pseudo-terminal";
        plan.pty_slave = slave_path;
    } else if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || (req.stdin_open && pipe2(in, O_CLOEXEC) != 0)) {
        failure = "pipe";
    } else {
        plan.stdin_fd = in[0];
        plan.stdout_fd = out[1];
        plan.stderr_fd = err[1];
    }
    pid_t pid = -1;
    if (!failure) {
        error = 0;
        exec_cgroup_create(&p->cgroup);
        plan.report_fd = report[1];
        p->started_ns = realtime_ns();
        pid = fork();
        if (pid < 0) failure = "fork";
        if (pid == 0) become_process(p, &plan);
    }
    if (failure) error = errno;
    close_fd(&report[1]);
    close_fd(&out[1]);
    close_fd(&err[1]);
    close_fd(&in[0]);

    if (!failure) {
        /* The report pipe closes on a successful exec (CLOEXEC) or carries the child's errno. */
        struct spawn_report rep;
        ssize_t got;
        do got = read(report[0], &rep, sizeof rep);
        while (got < 0 && errno == EINTR);
        if (got == (ssize_t)sizeof rep) {
            int status;
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            error = rep.error;
            failure = rep.stage == SPAWN_STAGE_CWD    ? "cwd"
                      : rep.stage == SPAWN_STAGE_SETUP ? "terminal setup"
                      : rep.stage == SPAWN_STAGE_USER  ? "user"
                                                       : "exec";
        }
    }
    close_fd(&report[0]);
    free(argv);
    free(seed_env.preload_entry);

    if (failure) {
        close_fd(&out[0]);
        close_fd(&err[0]);
        close_fd(&in[1]);
        close_fd(&master);
        exec_cgroup_release(&p->cgroup);
        char cwd[PROC_CWD_KEPT];
        snprintf(cwd, sizeof cwd, "%s", p->cwd);
        char program[256];
        snprintf(program, sizeof program, "%.255s", p->argv_text);
        bool not_found = strcmp(failure, "exec") == 0 && error == ENOENT;
        free(p);
        if (strcmp(failure, "cwd") == 0) reject_request(id, "spawn_failed", "cwd %s: %s", cwd, strerror(error));
        if (strcmp(failure, "exec") == 0)
            reject_request(id, not_found ? "command_not_found" : "spawn_failed", "%s: %s", program, strerror(error));
        reject_request(id, "spawn_failed", "%s: %s", failure, strerror(error));
    }

    p->pid = pid;
    p->state = PROC_RUNNING;
    if (req.pty) {
        p->out.fd = master;
        /* A terminal's input is always open: the master, duplicated so that output and input close apart. */
        p->stdin_fd = fcntl(master, F_DUPFD_CLOEXEC, 3);
    } else {
        p->out.fd = out[0];
        p->err.fd = err[0];
        p->stdin_fd = in[1];
    }
    if (p->out.fd >= 0) fcntl(p->out.fd, F_SETFL, O_NONBLOCK);
    if (p->err.fd >= 0) fcntl(p->err.fd, F_SETFL, O_NONBLOCK);
    if (p->stdin_fd >= 0) fcntl(p->stdin_fd, F_SETFL, O_NONBLOCK);

    /* A pid the kernel gave out again replaces the exited process that had it. */
    for (size_t i = 0; i < table_count; i++) {
        if (table[i]->pid == pid) {
            drop_at(i);
            break;
        }
    }
    table[table_count++] = p;
    trim_exited();
    agent_log("process %d started (%s%s)", (int)pid, p->argv_text, p->pty ? ", pty" : "");

    struct frame_builder b;
    if (!frame_begin(&b, MSG_PROC_STARTED, id, 64)) return;
    frame_put_u32(&b, TAG_PID, (uint32_t)pid);
    frame_put_u64(&b, TAG_STARTED_NS, p->started_ns);
    frame_send(&b);
}

/* ------------------------------------------------------------------ output */

static void send_exit_event(struct proc *p)
{
    struct frame_builder b;
    if (!frame_begin(&b, MSG_PROC_EXIT, 0, 256)) return;
    frame_put_u32(&b, TAG_PID, (uint32_t)p->pid);
    put_exit_fields(&b, p);
    put_counters(&b, p);
    frame_send(&b);
}

static void answer_input(struct proc *p, const char *code, const char *message)
{
    if (p->input_request) {
        if (code) reply_error(p->input_request, code, "%s", message);
        else reply_ok(p->input_request);
    }
    p->input_request = 0;
}

/* Stops feeding stdin: queued input is dropped, waiting requests are answered with code. */
static void stdin_gone(struct proc *p, const char *code, const char *message)
{
    close_fd(&p->stdin_fd);
    free(p->input);
    p->input = NULL;
    p->input_len = p->input_done = 0;
    answer_input(p, code, message);
    if (p->close_request) reply_ok(p->close_request);
    p->close_request = 0;
    p->stdin_eof_pending = false;
}

static void process_over(struct proc *p)
{
    int status = p->wait_status;
    if (WIFSIGNALED(status)) {
        p->signal_number = WTERMSIG(status);
        p->exit_code = 128 + p->signal_number;
    } else {
        p->exit_code = WEXITSTATUS(status);
    }
    if (!p->pids_limited && exec_cgroup_limit_hit(&p->cgroup)) p->pids_limited = true;
    p->finished_ns = realtime_ns();
    p->state = PROC_EXITED;
    /* Children it left may still hold the pipes or the terminal: drained in the background. */
    if (p->out.fd >= 0) keep_pipe_in_background(p->out.fd);
    if (p->err.fd >= 0) keep_pipe_in_background(p->err.fd);
    p->out.fd = p->err.fd = -1;
    stdin_gone(p, "process_exited", "the process has exited");
    exec_cgroup_release(&p->cgroup);
    agent_log("process %d exited (code %d)", (int)p->pid, p->exit_code);
    send_exit_event(p);
    /* Exited entries leave the table in the order they exited. */
    for (size_t i = 0; i < table_count; i++) {
        if (table[i] != p) continue;
        memmove(table + i, table + i + 1, (table_count - i - 1) * sizeof table[0]);
        table[table_count - 1] = p;
        break;
    }
    trim_exited();
}

static void close_output(struct proc_output *o)
{
    close_fd(&o->fd);
    o->resume_at = 0;
}

static void read_output(struct proc *p, struct proc_output *o)
{
    uint64_t *counter = o->kind == STREAM_STDERR ? &p->stderr_bytes : &p->stdout_bytes;
    ssize_t n;
    bool attached = host_attached();
    if (!attached) {
        /* Nobody to send it to: counted and dropped, in batches. */
        n = discard_from_pipe(o->fd);
        if (n > 0) o->resume_at = monotonic_ns() + DISCARD_PAUSE_NS;
    } else {
        n = read(o->fd, read_buffer, sizeof read_buffer);
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        /* EOF, or EIO from a pty master once every slave fd is closed. */
        close_output(o);
        return;
    }
    if (attached) {
        struct frame_builder b;
        if (frame_begin(&b, MSG_PROC_OUTPUT, 0, (size_t)n + 64)) {
            frame_put_u32(&b, TAG_PID, (uint32_t)p->pid);
            frame_put_u8(&b, TAG_STREAM, o->kind);
            frame_put_u64(&b, TAG_OUTPUT_OFFSET, p->output_total);
            frame_put_bytes(&b, TAG_DATA, read_buffer, (size_t)n);
            frame_send(&b);
        }
    }
    *counter += (uint64_t)n;
    p->output_total += (uint64_t)n;
    if (p->state == PROC_DRAINING) p->quiet_until = monotonic_ns() + DRAIN_QUIET_NS;
}

/* ------------------------------------------------------------------- stdin */

static void write_input(struct proc *p)
{
    while (p->input_done < p->input_len) {
        ssize_t n = write(p->stdin_fd, p->input + p->input_done, p->input_len - p->input_done);
        if (n > 0) {
            p->input_done += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        /* EPIPE: the process closed its stdin (or, with a pty, the terminal went away). */
        stdin_gone(p, "stdin_closed", "the process closed its stdin");
        return;
    }
    free(p->input);
    p->input = NULL;
    p->input_len = p->input_done = 0;
    answer_input(p, NULL, NULL);
    if (!p->stdin_eof_pending) return;
    p->stdin_eof_pending = false;
    if (p->pty) {
        /* A terminal has no end of input of its own: the line discipline's EOF character (^D). */
        struct termios t;
        char eof = 4;
        if (tcgetattr(p->stdin_fd, &t) == 0 && t.c_cc[VEOF]) eof = (char)t.c_cc[VEOF];
        (void)!write(p->stdin_fd, &eof, 1);
        if (p->close_request) reply_ok(p->close_request);
        p->close_request = 0;
        return;
    }
    stdin_gone(p, NULL, NULL);
}

static struct proc *live_process(uint32_t id, const uint8_t *payload, size_t len, const char *what)
{
    pid_t pid;
    if (!read_pid(payload, len, &pid)) {
        reply_error(id, "bad_request", "%s needs PID (u32)", what);
        return NULL;
    }
    struct proc *p = find(pid);
    if (!p) {
        reply_error(id, "process_not_found", "no background process with pid %d", (int)pid);
        return NULL;
    }
    if (p->state != PROC_RUNNING) {
        reply_error(id, "process_exited", "process %d has exited", (int)pid);
        return NULL;
    }
    return p;
}

void proc_handle_input(uint32_t id, const uint8_t *payload, size_t len)
{
    struct tlv_cursor c;
    struct tlv_field f, data = {0};
    bool have_data = false;
    tlv_cursor_init(&c, payload, len);
    int rc;
    while ((rc = tlv_next(&c, &f)) == 1)
        if (f.tag == TAG_DATA) {
            data = f;
            have_data = true;
        }
    if (rc < 0 || !have_data) reject_request(id, "bad_request", "PROC_INPUT needs PID and DATA");
    struct proc *p = live_process(id, payload, len, "PROC_INPUT");
    if (!p) return;
    if (p->stdin_fd < 0 || p->stdin_eof_pending)
        reject_request(id, "stdin_closed", "process %d has no open stdin (start it with STDIN_OPEN, and before PROC_CLOSE_STDIN)", (int)p->pid);
    if (p->input_request) reject_request(id, "busy", "input %u for process %d is still being written", p->input_request, (int)p->pid);
    if (p->input_len - p->input_done + data.len > PROC_INPUT_MAX) reject_request(id, "busy", "process %d has too much unread input queued", (int)p->pid);
    if (data.len == 0) reject_request(id, "bad_request", "DATA is empty");
    /* What a host that went away left queued is still written first. */
    size_t pending = p->input_len - p->input_done;
    uint8_t *buffer = malloc(pending + data.len);
    if (!buffer) reject_request(id, "busy", "out of memory queueing input");
    if (pending) memcpy(buffer, p->input + p->input_done, pending);
    memcpy(buffer + pending, data.value, data.len);
    free(p->input);
    p->input = buffer;
    p->input_len = pending + data.len;
    p->input_done = 0;
    p->input_request = id;
    write_input(p);
}

void proc_handle_close_stdin(uint32_t id, const uint8_t *payload, size_t len)
{
    struct proc *p = live_process(id, payload, len, "PROC_CLOSE_STDIN");
    if (!p) return;
    if (p->stdin_fd < 0) {
        reply_ok(id);
        return;
    }
    if (p->close_request) reject_request(id, "busy", "closing stdin of process %d is under way", (int)p->pid);
    p->stdin_eof_pending = true;
    p->close_request = id;
    if (p->input_done == p->input_len) write_input(p);
}

/* ----------------------------------------------------------- signal, resize */

void proc_handle_signal(uint32_t id, const uint8_t *payload, size_t len)
{
    uint32_t sig = 0;
    bool have_signal = false;
    struct tlv_cursor c;
    struct tlv_field f;
    tlv_cursor_init(&c, payload, len);
    while (tlv_next(&c, &f) == 1)
        if (f.tag == TAG_SIGNAL && tlv_as_u32(&f, &sig)) have_signal = true;
    if (!have_signal || sig == 0 || sig >= (uint32_t)NSIG) reject_request(id, "bad_request", "PROC_SIGNAL needs SIGNAL (u32, 1-%d)", NSIG - 1);
    struct proc *p = live_process(id, payload, len, "PROC_SIGNAL");
    if (!p) return;
    /* Its process group (it leads its own session); the main process too, should it have left it. */
    int rc = kill(-p->pid, (int)sig);
    if (rc != 0) rc = kill(p->pid, (int)sig);
    if (rc != 0) reject_request(id, "process_exited", "process %d: %s", (int)p->pid, strerror(errno));
    agent_log("process %d: signal %u", (int)p->pid, sig);
    reply_ok(id);
}

void proc_handle_resize(uint32_t id, const uint8_t *payload, size_t len)
{
    uint32_t cols = 0, rows = 0;
    struct tlv_cursor c;
    struct tlv_field f;
    tlv_cursor_init(&c, payload, len);
    while (tlv_next(&c, &f) == 1) {
        if (f.tag == TAG_COLS) tlv_as_u32(&f, &cols);
        if (f.tag == TAG_ROWS) tlv_as_u32(&f, &rows);
    }
    if (cols == 0 || rows == 0 || cols > 0xffff || rows > 0xffff) reject_request(id, "bad_request", "PROC_RESIZE needs COLS and ROWS (u32, 1-65535)");
    struct proc *p = live_process(id, payload, len, "PROC_RESIZE");
    if (!p) return;
    if (!p->pty || p->stdin_fd < 0) reject_request(id, "not_a_terminal", "process %d does not run on a pseudo-terminal", (int)p->pid);
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    /* On the master: the kernel sends SIGWINCH to the terminal's foreground process group. */
    if (ioctl(p->stdin_fd, TIOCSWINSZ, &ws) != 0) reject_request(id, "not_a_terminal", "TIOCSWINSZ: %s", strerror(errno));
    reply_ok(id);
}

/* ------------------------------------------------------------------- list */

void proc_handle_list(uint32_t id, const uint8_t *payload, size_t len)
{
    if (!tlv_well_formed(payload, len)) reject_request(id, "bad_request", "PROC_LIST payload is not valid TLV");
    /* Each entry: its argv (a 6-byte field header per argument), cwd, tag and 17 small fields. With
       at most 64 arguments and 4 KiB of argv kept, 128 entries stay well inside one frame. */
    size_t cap = 64;
    for (size_t i = 0; i < table_count; i++)
        cap += 512 + table[i]->argv_len + 6 * table[i]->argc + strlen(table[i]->cwd) + strlen(table[i]->tag);
    struct frame_builder b;
    if (!frame_begin(&b, MSG_PROC_TABLE, id, cap)) reject_request(id, "busy", "out of memory listing processes");
    for (size_t i = 0; i < table_count; i++) {
        const struct proc *p = table[i];
        frame_put_bytes(&b, TAG_PROC_ENTRY, NULL, 0);
        frame_put_u32(&b, TAG_PID, (uint32_t)p->pid);
        for (size_t at = 0; at < p->argv_len; at += strlen(p->argv_text + at) + 1) frame_put_text(&b, TAG_ARG, p->argv_text + at);
        if (p->argv_truncated) frame_put_u8(&b, TAG_ARGV_TRUNCATED, 1);
        frame_put_text(&b, TAG_CWD, p->cwd);
        if (p->tag[0]) frame_put_text(&b, TAG_PROC_TAG, p->tag);
        frame_put_u8(&b, TAG_PTY, p->pty);
        frame_put_u8(&b, TAG_STDIN_OPEN, p->stdin_fd >= 0 && !p->stdin_eof_pending);
        frame_put_u64(&b, TAG_STARTED_NS, p->started_ns);
        frame_put_u8(&b, TAG_EXITED, p->state == PROC_EXITED);
        if (p->state == PROC_EXITED) put_exit_fields(&b, p);
        put_counters(&b, p);
    }
    frame_send(&b);
}

/* ------------------------------------------------------------- poll loop */

bool proc_child_exited(pid_t pid, int status)
{
    struct proc *p = find(pid);
    if (!p || p->state != PROC_RUNNING) return false;
    p->state = PROC_DRAINING;
    p->wait_status = status;
    int64_t now = monotonic_ns();
    p->quiet_until = now + DRAIN_QUIET_NS;
    p->drain_until = now + DRAIN_LIMIT_NS;
    return true;
}

static bool pause_over(int64_t *resume_at, int64_t now)
{
    if (*resume_at > now) return false;
    *resume_at = 0;
    return true;
}

void proc_add_poll_fds(struct poll_set *ps)
{
    if (table_count == 0) return;
    int64_t now = monotonic_ns();
    /* A backlog for the host stops the reading (the process blocks on its writes), as for an exec;
       with no host attached output is only counted, which costs no queue space. */
    bool hold = output_backpressured() && host_attached();
    for (size_t i = 0; i < table_count; i++) {
        struct proc *p = table[i];
        if (p->state == PROC_EXITED) continue;
        if (!hold) {
            if (p->out.fd >= 0 && pause_over(&p->out.resume_at, now)) poll_set_add(ps, p->out.fd, POLLIN, POLL_PROC_OUTPUT);
            if (p->err.fd >= 0 && pause_over(&p->err.resume_at, now)) poll_set_add(ps, p->err.fd, POLLIN, POLL_PROC_OUTPUT);
        }
        if (p->stdin_fd >= 0 && p->input_done < p->input_len) poll_set_add(ps, p->stdin_fd, POLLOUT, POLL_PROC_STDIN);
        if (p->cgroup.pids_events_fd >= 0 && !p->pids_limited) poll_set_add(ps, p->cgroup.pids_events_fd, POLLPRI, POLL_PROC_PIDS);
    }
}

void proc_handle_poll(enum poll_owner owner, int fd, short revents)
{
    for (size_t i = 0; i < table_count; i++) {
        struct proc *p = table[i];
        if (p->state == PROC_EXITED) continue;
        switch (owner) {
        case POLL_PROC_OUTPUT:
            if (p->out.fd == fd) return read_output(p, &p->out);
            if (p->err.fd == fd) return read_output(p, &p->err);
            break;
        case POLL_PROC_STDIN:
            if (p->stdin_fd == fd) {
                if (revents & (POLLERR | POLLHUP) && !(revents & POLLOUT)) return stdin_gone(p, "stdin_closed", "the process closed its stdin");
                return write_input(p);
            }
            break;
        case POLL_PROC_PIDS:
            if (p->cgroup.pids_events_fd == fd) {
                if (!p->pids_limited && exec_cgroup_limit_hit(&p->cgroup)) {
                    p->pids_limited = true;
                    agent_log("process %d hit its process limit (%u); killing its cgroup", (int)p->pid, exec_pids_max());
                    exec_cgroup_kill(&p->cgroup);
                }
                return;
            }
            break;
        default: return;
        }
    }
}

int64_t proc_next_deadline_ns(void)
{
    int64_t deadline = -1;
    for (size_t i = 0; i < table_count; i++) {
        struct proc *p = table[i];
        if (p->state == PROC_EXITED) continue;
        int64_t ts[] = {p->out.fd >= 0 ? p->out.resume_at : 0, p->err.fd >= 0 ? p->err.resume_at : 0,
                        p->state == PROC_DRAINING ? (p->quiet_until < p->drain_until ? p->quiet_until : p->drain_until) : 0};
        for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++)
            if (ts[k] > 0 && (deadline < 0 || ts[k] < deadline)) deadline = ts[k];
    }
    return deadline;
}

void proc_tick(void)
{
    int64_t now = monotonic_ns();
    bool hold = output_backpressured() && host_attached();
    /* process_over reorders (and trims) the table: walk a copy. */
    struct proc *draining[PROC_LIVE_MAX + PROC_EXITED_KEPT];
    size_t count = 0;
    for (size_t i = 0; i < table_count; i++)
        if (table[i]->state == PROC_DRAINING) draining[count++] = table[i];
    for (size_t i = 0; i < count; i++) {
        struct proc *p = draining[i];
        if (hold) {
            /* Not reading while the host catches up is not silence. */
            p->quiet_until = now + DRAIN_QUIET_NS;
            if (p->drain_until < p->quiet_until) p->drain_until = p->quiet_until;
        }
        bool at_eof = p->out.fd < 0 && p->err.fd < 0;
        if (at_eof || now >= p->quiet_until || now >= p->drain_until) process_over(p);
    }
}

void proc_detach(void)
{
    /* Their answers could not reach anyone; queued input is still written. */
    for (size_t i = 0; i < table_count; i++) {
        table[i]->input_request = 0;
        table[i]->close_request = 0;
    }
}
