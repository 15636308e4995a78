/*
 * EXEC: write files, then run the commands one after another (stopping at the
 * first failure), streaming their output. Everything here is driven by the main
 * poll loop; nothing blocks except the few microseconds between fork() and the
 * child's exec().
 */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../seed/seed_env.h"

_Static_assert(sizeof(((struct seed_environment *)0)->seed_entry) == COLLIMATE_SEED_ENTRY_MAX, "seed entry buffers");

/* After the main process exits, output still in flight must arrive within this quiet gap... */
#define DRAIN_QUIET_NS (20 * NS_PER_MS)
/* ...and draining ends after this long regardless, so a background process that keeps
   writing to the inherited pipe cannot hold the exec open forever. */
#define DRAIN_LIMIT_NS (500 * NS_PER_MS)
/* Pipes still held open by background processes; beyond this the oldest is closed
   (its writers would then get SIGPIPE, which is the lesser evil versus leaking fds). */
#define BACKGROUND_PIPES_MAX 256
/* Output that is only counted (past the cap, or from background processes) is spliced into
   /dev/null, never copied into the agent, and taken in batches: the agent outranks what it runs
   (limits.c), so waking it for each of a writer's small writes would cost more than the bytes.
   After a drain that found the pipe less than half full, the pipe is left alone for
   DISCARD_PAUSE_NS, and it is enlarged so that the writer can go on meanwhile. */
#define DISCARD_PIPE_SIZE (1024 * 1024)
#define DISCARD_PAUSE_NS (5 * NS_PER_MS)
/* The glibc loader: only where it exists can the (glibc) seed library be preloaded. A
   dynamically linked musl program (an Alpine image) would fail to start with it. */
#define GLIBC_LOADER_PATH "/lib64/ld-linux-x86-64.so.2"

struct output_stream {
    int fd;
    uint16_t frame_type;
    uint64_t total;
    uint64_t forwarded;
    bool truncated;
    bool enlarged;     /* the pipe was grown to DISCARD_PIPE_SIZE */
    int64_t resume_at; /* monotonic ns before which the pipe is not polled (discarding), 0 = now */
};

struct background_pipe {
    int fd;
    int64_t resume_at;
};

struct exec_run {
    uint32_t request_id;

    /* The request, all pointing into arena. */
    void *arena;
    char ***commands;
    size_t command_count;
    char **envp;
    const char *cwd;
    uint8_t *stdin_data;
    size_t stdin_len;
    bool has_stdin;
    uint64_t max_output;
    uint32_t timeout_ms;
    bool seeded;
    uint64_t seed;
    struct seed_environment seed_env;
    bool has_user;
    struct run_as user;

    /* Progress. */
    size_t current;
    pid_t pid;  /* main process of the current command, 0 once it has been reaped */
    pid_t pgid; /* kept after the leader is reaped: group members may live on */
    bool main_exited;
    int wait_status;
    int stdin_fd;
    size_t stdin_written;
    struct output_stream out, err;
    int64_t timeout_at; /* monotonic ns, 0 = none */
    bool timed_out;
    int64_t quiet_until, drain_until;
    struct exec_cgroup cgroup;
    bool pids_limited;
    int exit_code;
    int signal_number;
    uint64_t started_ns;
    char error_text[600];
};

static struct exec_run *run;
static struct background_pipe background_pipes[BACKGROUND_PIPES_MAX];
static size_t background_pipe_count;
static uint8_t read_scratch[OUTPUT_CHUNK_MAX];
static int null_fd = -1;

/* ------------------------------------------------------ discarding output */

/* Drops what the pipe holds: bytes dropped, 0 at EOF, -1 with errno (EAGAIN: nothing there now). */
ssize_t discard_from_pipe(int fd)
{
    if (null_fd < 0) null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd >= 0) {
        ssize_t n = splice(fd, NULL, null_fd, NULL, DISCARD_PIPE_SIZE, SPLICE_F_NONBLOCK);
        if (n >= 0 || errno != EINVAL) return n;
    }
    return read(fd, read_scratch, sizeof read_scratch);
}

/* When to poll a discarding pipe again after a drain of n bytes. */
static int64_t discard_resume_at(ssize_t n)
{
    return n < DISCARD_PIPE_SIZE / 2 ? monotonic_ns() + DISCARD_PAUSE_NS : 0;
}

/* ------------------------------------------------------- background pipes */

void keep_pipe_in_background(int fd)
{
    if (background_pipe_count == BACKGROUND_PIPES_MAX) {
        close(background_pipes[0].fd);
        memmove(background_pipes, background_pipes + 1, (BACKGROUND_PIPES_MAX - 1) * sizeof background_pipes[0]);
        background_pipe_count--;
    }
    background_pipes[background_pipe_count++] = (struct background_pipe){fd, 0};
}

static void drain_background_pipe(int fd, short revents)
{
    size_t i = 0;
    while (i < background_pipe_count && background_pipes[i].fd != fd) i++;
    if (i == background_pipe_count) return;
    if (!(revents & (POLLIN | POLLHUP | POLLERR))) return;
    ssize_t n = discard_from_pipe(fd);
    if (n > 0) {
        background_pipes[i].resume_at = discard_resume_at(n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    close(fd);
    memmove(background_pipes + i, background_pipes + i + 1, (background_pipe_count - i - 1) * sizeof background_pipes[0]);
    background_pipe_count--;
}

/* ------------------------------------------------------------- parsing */

struct exec_shape {
    size_t commands, args, envs, text_bytes, stdin_bytes;
    bool has_stdin;
};

#define reject_shape(reason) \
    do {                      \
        *why = (reason);      \
        return false;         \
    } while (0)

static bool measure_request(const uint8_t *payload, size_t len, struct exec_shape *shape, const char **why)
{
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    size_t args_in_current = 0;
    bool in_file = false;
    uint32_t ignored;

    memset(shape, 0, sizeof *shape);
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        switch (f.tag) {
        case TAG_ARGV_BEGIN:
            if (shape->commands > 0 && args_in_current == 0) reject_shape("a command has no arguments");
            shape->commands++;
            args_in_current = 0;
            break;
        case TAG_ARG:
            if (shape->commands == 0) reject_shape("ARG before ARGV_BEGIN");
            if (tlv_has_nul(&f)) reject_shape("ARG contains a NUL byte");
            shape->args++;
            args_in_current++;
            shape->text_bytes += f.len + 1;
            break;
        case TAG_ENV: {
            const uint8_t *eq = f.len ? memchr(f.value, '=', f.len) : NULL;
            if (!eq || eq == f.value || tlv_has_nul(&f)) reject_shape("ENV must be KEY=VALUE without NUL");
            if (++shape->envs > ENV_FIELDS_MAX) reject_shape("too many ENV fields");
            shape->text_bytes += f.len + 1;
            break;
        }
        case TAG_CWD:
            if (f.len == 0 || tlv_has_nul(&f)) reject_shape("CWD must be a non-empty string without NUL");
            shape->text_bytes += f.len + 1;
            break;
        case TAG_STDIN:
            shape->has_stdin = true;
            shape->stdin_bytes += f.len;
            break;
        case TAG_FILE_PATH:
            if (f.len == 0 || f.len >= PATH_MAX || tlv_has_nul(&f)) reject_shape("FILE_PATH must be a non-empty path without NUL");
            in_file = true;
            break;
        case TAG_FILE_MODE:
            if (!in_file) reject_shape("FILE_MODE before FILE_PATH");
            if (!tlv_as_u32(&f, &ignored)) reject_shape("FILE_MODE must be a u32");
            break;
        case TAG_FILE_DATA:
            if (!in_file) reject_shape("FILE_DATA before FILE_PATH");
            break;
        case TAG_TIMEOUT_MS:
        case TAG_MAX_OUTPUT:
            if (!tlv_as_u32(&f, &ignored)) reject_shape("TIMEOUT_MS/MAX_OUTPUT must be a u32");
            break;
        case TAG_SEED: {
            uint64_t seed;
            if (!tlv_as_u64(&f, &seed)) reject_shape("SEED must be a u64");
            break;
        }
        }
    }
    if (rc < 0) reject_shape("EXEC payload is truncated");
    if (shape->commands == 0) reject_shape("EXEC has no commands");
    if (args_in_current == 0) reject_shape("a command has no arguments");
    return true;
}

static char *copy_text(char **cursor, const struct tlv_field *f)
{
    char *s = *cursor;
    memcpy(s, f->value, f->len);
    s[f->len] = '\0';
    *cursor += f->len + 1;
    return s;
}

void merge_env(char **envp, size_t *count, char *entry)
{
    size_t key_len = (size_t)(strchr(entry, '=') - entry) + 1;
    for (size_t i = 0; i < *count; i++) {
        if (strncmp(envp[i], entry, key_len) == 0) {
            envp[i] = entry;
            return;
        }
    }
    envp[(*count)++] = entry;
}

const char *default_cwd(void) { return access("/root", X_OK) == 0 ? "/root" : "/"; }

static bool env_key_is(const char *entry, const char *key)
{
    size_t n = strlen(key);
    return strncmp(entry, key, n) == 0 && entry[n] == '=';
}

static void remove_env(char **envp, size_t *count, const char *key)
{
    size_t kept = 0;
    for (size_t i = 0; i < *count; i++)
        if (!env_key_is(envp[i], key)) envp[kept++] = envp[i];
    *count = kept;
}

static const char *env_value(char *const *envp, size_t count, const char *key)
{
    for (size_t i = 0; i < count; i++)
        if (env_key_is(envp[i], key)) return envp[i] + strlen(key) + 1;
    return NULL;
}

/*
 * A seeded exec (docs/determinism.md): every command's environment gets
 * COLLIMATE_SEED=<seed> (replacing any value from ENV or the base environment),
 * PYTHONHASHSEED from seed_env.h unless ENV or the base environment set one,
 * LD_PRELOAD=<library>[:<the value it would otherwise have>] if the library and the
 * glibc loader exist in the guest, and loses the library's own bookkeeping variables.
 */
void apply_seed_environment(char **envp, size_t *count, uint64_t seed, struct seed_environment *s)
{
    remove_env(envp, count, "COLLIMATE_SEED");
    remove_env(envp, count, "COLLIMATE_SEED_LINEAGE");
    remove_env(envp, count, "COLLIMATE_SEED_NODE_ARG");
    collimate_seed_env_entries(seed, s->seed_entry, s->hash_entry);
    envp[(*count)++] = s->seed_entry;
    if (!env_value(envp, *count, "PYTHONHASHSEED")) envp[(*count)++] = s->hash_entry;
    if (access(SEED_LIBRARY_GUEST_PATH, R_OK) != 0 || access(GLIBC_LOADER_PATH, X_OK) != 0) return;
    const char *existing = env_value(envp, *count, "LD_PRELOAD");
    size_t cap = sizeof "LD_PRELOAD=" + sizeof SEED_LIBRARY_GUEST_PATH + (existing ? strlen(existing) + 1 : 0);
    s->preload_entry = malloc(cap);
    if (!s->preload_entry) return;
    snprintf(s->preload_entry, cap, "LD_PRELOAD=%s%s%s", SEED_LIBRARY_GUEST_PATH, existing && *existing ? ":" : "", existing ? existing : "");
    merge_env(envp, count, s->preload_entry);
}

/* Lays the whole request out in one allocation so a run is freed with one free(). */
static struct exec_run *build_run(uint32_t id, const uint8_t *payload, size_t len, const struct exec_shape *shape, const struct run_as *user)
{
    size_t env_slots = base_environment_count + RUN_AS_ENV_ENTRIES + shape->envs + SEED_ENV_ENTRIES + 1;
    size_t arena_size = shape->commands * sizeof(char **) + (shape->args + shape->commands) * sizeof(char *) +
                        env_slots * sizeof(char *) + shape->text_bytes + shape->stdin_bytes;
    struct exec_run *r = calloc(1, sizeof *r);
    void *arena = malloc(arena_size ? arena_size : 1);
    if (!r || !arena) {
        free(r);
        free(arena);
        return NULL;
    }
    r->arena = arena;
    r->request_id = id;
    r->commands = arena;
    char **argv_slot = (char **)(r->commands + shape->commands);
    r->envp = argv_slot + shape->args + shape->commands;
    char *text = (char *)(r->envp + env_slots);
    r->stdin_data = (uint8_t *)text + shape->text_bytes;
    r->has_stdin = shape->has_stdin;
    r->command_count = shape->commands;
    r->cwd = default_cwd();
    r->max_output = DEFAULT_MAX_OUTPUT;
    r->stdin_fd = r->out.fd = r->err.fd = -1;
    r->out.frame_type = MSG_STDOUT;
    r->err.frame_type = MSG_STDERR;

    size_t env_count = base_environment_count;
    memcpy(r->envp, base_environment, base_environment_count * sizeof(char *));
    if (user) {
        r->has_user = true;
        r->user = *user;
        r->cwd = user_cwd(&r->user);
        run_as_environment(&r->user, r->envp, &env_count);
    }

    struct tlv_cursor c;
    struct tlv_field f;
    size_t command = 0;
    uint32_t u32;
    tlv_cursor_init(&c, payload, len);
    while (tlv_next(&c, &f) == 1) {
        switch (f.tag) {
        case TAG_ARGV_BEGIN:
            if (command > 0) *argv_slot++ = NULL;
            r->commands[command++] = argv_slot;
            break;
        case TAG_ARG: *argv_slot++ = copy_text(&text, &f); break;
        case TAG_ENV: merge_env(r->envp, &env_count, copy_text(&text, &f)); break;
        case TAG_CWD: r->cwd = copy_text(&text, &f); break;
        case TAG_STDIN:
            memcpy(r->stdin_data + r->stdin_len, f.value, f.len);
            r->stdin_len += f.len;
            break;
        case TAG_TIMEOUT_MS:
            tlv_as_u32(&f, &r->timeout_ms);
            break;
        case TAG_MAX_OUTPUT:
            tlv_as_u32(&f, &u32);
            r->max_output = u32;
            break;
        case TAG_SEED:
            r->seeded = tlv_as_u64(&f, &r->seed);
            break;
        }
    }
    *argv_slot = NULL;
    if (r->seeded) apply_seed_environment(r->envp, &env_count, r->seed, &r->seed_env);
    r->envp[env_count] = NULL;
    return r;
}

static void free_run(void)
{
    if (!run) return;
    exec_cgroup_release(&run->cgroup);
    if (run->stdin_fd >= 0) close(run->stdin_fd);
    if (run->out.fd >= 0) close(run->out.fd);
    if (run->err.fd >= 0) close(run->err.fd);
    free(run->seed_env.preload_entry);
    free(run->arena);
    free(run);
    run = NULL;
}

/* ---------------------------------------------------------------- files */

static bool finish_file(int fd, uint32_t mode, const char *path, char *why, size_t why_cap)
{
    bool ok = fchmod(fd, (mode_t)(mode & 07777)) == 0;
    if (!ok) snprintf(why, why_cap, "%s: chmod: %s", path, strerror(errno));
    if (close(fd) != 0 && ok) {
        snprintf(why, why_cap, "%s: close: %s", path, strerror(errno));
        ok = false;
    }
    return ok;
}

static bool write_request_files(const uint8_t *payload, size_t len, char *why, size_t why_cap)
{
    struct tlv_cursor c;
    struct tlv_field f;
    char path[PATH_MAX];
    int fd = -1;
    uint32_t mode = 0644;

    tlv_cursor_init(&c, payload, len);
    while (tlv_next(&c, &f) == 1) {
        if (f.tag == TAG_FILE_PATH) {
            if (fd >= 0 && !finish_file(fd, mode, path, why, why_cap)) return false;
            tlv_copy_text(&f, path, sizeof path);
            mode = 0644;
            make_parent_directories(path);
            /* A new file stays owner-only until the final chmod: the umask never decides
               its mode, and a secret is not briefly world-readable while being written. */
            fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
            struct stat st;
            if (fd < 0) {
                snprintf(why, why_cap, "%s: %s", path, strerror(errno));
                return false;
            }
            if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                snprintf(why, why_cap, "%s: not a regular file", path);
                return false;
            }
            own_fd(fd);
        } else if (f.tag == TAG_FILE_MODE) {
            tlv_as_u32(&f, &mode);
        } else if (f.tag == TAG_FILE_DATA) {
            if (!write_all(fd, f.value, f.len)) {
                snprintf(why, why_cap, "%s: %s", path, strerror(errno));
                close(fd);
                return false;
            }
        }
    }
    return fd < 0 || finish_file(fd, mode, path, why, why_cap);
}

/* ---------------------------------------------------------------- results */

static void send_result(struct exec_run *r)
{
    struct frame_builder b;
    if (!frame_begin(&b, MSG_EXEC_RESULT, r->request_id, 256 + sizeof r->error_text)) return;
    frame_put_i32(&b, TAG_EXIT_CODE, r->timed_out ? 124 : r->exit_code);
    if (r->signal_number && !r->timed_out) frame_put_u32(&b, TAG_SIGNAL, (uint32_t)r->signal_number);
    frame_put_u8(&b, TAG_TIMED_OUT, r->timed_out);
    frame_put_u8(&b, TAG_STDOUT_TRUNCATED, r->out.truncated);
    frame_put_u8(&b, TAG_STDERR_TRUNCATED, r->err.truncated);
    frame_put_u64(&b, TAG_STDOUT_BYTES, r->out.total);
    frame_put_u64(&b, TAG_STDERR_BYTES, r->err.total);
    frame_put_u32(&b, TAG_FAILED_INDEX, (uint32_t)r->current);
    frame_put_u64(&b, TAG_STARTED_NS, r->started_ns);
    frame_put_u64(&b, TAG_FINISHED_NS, realtime_ns());
    if (r->pids_limited) frame_put_u8(&b, TAG_PIDS_LIMITED, 1);
    if (r->error_text[0]) frame_put_text(&b, TAG_ERROR_TEXT, r->error_text);
    frame_send(&b);
}

/* The exec's processes reached its cgroup's pids.max: kill them all, and say so. */
static void note_pids_limit(struct exec_run *r)
{
    if (r->pids_limited || !exec_cgroup_limit_hit(&r->cgroup)) return;
    r->pids_limited = true;
    agent_log("exec %u hit its process limit (%u); killing its cgroup", r->request_id, exec_pids_max());
    exec_cgroup_kill(&r->cgroup);
    snprintf(r->error_text, sizeof r->error_text,
             "the exec hit its process limit (%u processes in the sandbox's exec cgroup, pids.max): a fork bomb or runaway "
             "forking; all of its processes were killed",
             exec_pids_max());
}

static void finish_run(void)
{
    /* Also catches a limit hit in the same poll round as the exit. */
    note_pids_limit(run);
    send_result(run);
    free_run();
}

/* -------------------------------------------------------------- spawning */

enum spawn_stage { SPAWN_STAGE_CWD = 1, SPAWN_STAGE_EXEC = 2, SPAWN_STAGE_USER = 3 };

struct spawn_report {
    int stage;
    int error;
};

extern char **environ;

static void __attribute__((noreturn)) become_command(struct exec_run *r, char **argv, int stdin_fd, int stdout_fd, int stderr_fd, int report_fd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    exec_cgroup_enter_child(&r->cgroup);

    if (stdin_fd < 0) stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (stdin_fd < 0) {
        /* No /dev/null (broken image): an empty pipe gives the same immediate EOF. */
        int empty[2];
        if (pipe2(empty, O_CLOEXEC) == 0) {
            close(empty[1]);
            stdin_fd = empty[0];
        }
    }
    if (stdin_fd >= 0) dup2(stdin_fd, 0);
    dup2(stdout_fd, 1);
    dup2(stderr_fd, 2);

    struct spawn_report report = {SPAWN_STAGE_USER, 0};
    if (r->has_user && (report.error = run_as_become(&r->user)) != 0) {
        (void)!write(report_fd, &report, sizeof report);
        _exit(126);
    }
    report.stage = SPAWN_STAGE_CWD;
    if (chdir(r->cwd) != 0) {
        report.error = errno;
        (void)!write(report_fd, &report, sizeof report);
        _exit(126);
    }
    /* Seeded: addresses are part of what replays (docs/determinism.md, ASLR). Inherited
       by everything the command starts. */
    if (r->seeded) {
        int current = personality(0xffffffff);
        if (current != -1) personality((unsigned long)current | ADDR_NO_RANDOMIZE);
    }
    /* execvp searches the PATH of the environment it runs in: make that the command's. */
    environ = r->envp;
    execvp(argv[0], argv);
    report.stage = SPAWN_STAGE_EXEC;
    report.error = errno;
    (void)!write(report_fd, &report, sizeof report);
    _exit(errno == ENOENT ? 127 : 126);
}

static void close_pair(int p[2])
{
    if (p[0] >= 0) close(p[0]);
    if (p[1] >= 0) close(p[1]);
    p[0] = p[1] = -1;
}

static void spawn_failed(struct exec_run *r, int exit_code, const char *fmt, const char *subject, int error)
{
    r->exit_code = exit_code;
    r->signal_number = 0;
    snprintf(r->error_text, sizeof r->error_text, fmt, subject, strerror(error));
}

/* Starts r->current; returns false if it could not be started (the result is then final). */
static bool spawn_current(struct exec_run *r)
{
    char **argv = r->commands[r->current];
    int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1}, report[2] = {-1, -1};
    bool feed_stdin = r->current == 0 && r->has_stdin;

    if (r->current == 0) r->started_ns = realtime_ns();
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(report, O_CLOEXEC) != 0 ||
        (feed_stdin && pipe2(in, O_CLOEXEC) != 0)) {
        spawn_failed(r, 126, "%s: pipe: %s", argv[0], errno);
        goto fail;
    }
    pid_t pid = fork();
    if (pid < 0) {
        spawn_failed(r, 126, "%s: fork: %s", argv[0], errno);
        goto fail;
    }
    if (pid == 0) become_command(r, argv, in[0], out[1], err[1], report[1]);

    close(out[1]);
    close(err[1]);
    close(report[1]);
    out[1] = err[1] = report[1] = -1;
    if (in[0] >= 0) close(in[0]);
    in[0] = -1;

    /* The report pipe closes on a successful exec (CLOEXEC) or carries the child's errno. */
    struct spawn_report rep;
    ssize_t got;
    do got = read(report[0], &rep, sizeof rep);
    while (got < 0 && errno == EINTR);
    close(report[0]);
    report[0] = -1;
    if (got == (ssize_t)sizeof rep) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (rep.stage == SPAWN_STAGE_CWD) spawn_failed(r, 126, "cwd %s: %s", r->cwd, rep.error);
        else if (rep.stage == SPAWN_STAGE_USER) spawn_failed(r, 126, "becoming %s: %s", r->user.name, rep.error);
        else spawn_failed(r, rep.error == ENOENT ? 127 : 126, "%s: %s", argv[0], rep.error);
        goto fail;
    }

    r->pid = r->pgid = pid;
    r->main_exited = false;
    r->out.fd = out[0];
    r->err.fd = err[0];
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    if (feed_stdin) {
        if (r->stdin_len == 0) {
            close(in[1]);
        } else {
            r->stdin_fd = in[1];
            fcntl(in[1], F_SETFL, O_NONBLOCK);
        }
    }
    return true;

fail:
    close_pair(out);
    close_pair(err);
    close_pair(in);
    close_pair(report);
    return false;
}

/* A command is over: decide whether the run goes on. Its pipes may still be held by
   background processes, which keep them; we read and discard from then on. */
static void command_finished(struct exec_run *r)
{
    if (r->out.fd >= 0) keep_pipe_in_background(r->out.fd);
    if (r->err.fd >= 0) keep_pipe_in_background(r->err.fd);
    r->out.fd = r->err.fd = -1;
    if (r->stdin_fd >= 0) close(r->stdin_fd);
    r->stdin_fd = -1;

    int status = r->wait_status;
    if (WIFSIGNALED(status)) {
        r->signal_number = WTERMSIG(status);
        r->exit_code = 128 + r->signal_number;
    } else {
        r->signal_number = 0;
        r->exit_code = WEXITSTATUS(status);
    }
    r->pid = 0;

    if (!r->timed_out && r->timeout_at && monotonic_ns() >= r->timeout_at) r->timed_out = true;
    if (r->timed_out || r->exit_code != 0 || r->current + 1 == r->command_count) {
        finish_run();
        return;
    }
    r->current++;
    if (!spawn_current(r)) finish_run();
}

/* ------------------------------------------------------------- pipe I/O */

/* Counts what a read or splice of the pipe took; false when it took nothing: not yet (EAGAIN),
   or the pipe reached its end (then it is closed). */
static bool took_output(struct output_stream *s, ssize_t n)
{
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    if (n <= 0) {
        close(s->fd);
        s->fd = -1;
        return false;
    }
    s->total += (uint64_t)n;
    return true;
}

/* Past the cap: count and drop (see DISCARD_PIPE_SIZE). */
static void discard_output(struct exec_run *r, struct output_stream *s)
{
    if (!s->enlarged) {
        s->enlarged = true;
        (void)fcntl(s->fd, F_SETPIPE_SZ, DISCARD_PIPE_SIZE);
    }
    ssize_t n = discard_from_pipe(s->fd);
    if (!took_output(s, n)) return;
    s->truncated = true;
    s->resume_at = discard_resume_at(n);
    if (r->main_exited) r->quiet_until = monotonic_ns() + DRAIN_QUIET_NS;
}

static void forward_output(struct exec_run *r, struct output_stream *s)
{
    if (s->forwarded >= r->max_output) {
        discard_output(r, s);
        return;
    }
    ssize_t n = read(s->fd, read_scratch, sizeof read_scratch);
    if (!took_output(s, n)) return;
    uint64_t room = r->max_output > s->forwarded ? r->max_output - s->forwarded : 0;
    size_t forward = (uint64_t)n < room ? (size_t)n : (size_t)room;
    if (forward < (size_t)n) s->truncated = true;
    if (forward) {
        send_simple_frame(s->frame_type, r->request_id, read_scratch, forward);
        s->forwarded += forward;
    }
    if (r->main_exited) r->quiet_until = monotonic_ns() + DRAIN_QUIET_NS;
}

static void feed_stdin(struct exec_run *r)
{
    ssize_t n = write(r->stdin_fd, r->stdin_data + r->stdin_written, r->stdin_len - r->stdin_written);
    if (n > 0) r->stdin_written += (size_t)n;
    else if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    /* Done, or the command closed its stdin (EPIPE): either way we stop feeding. */
    if (n <= 0 || r->stdin_written == r->stdin_len) {
        close(r->stdin_fd);
        r->stdin_fd = -1;
    }
}

/* --------------------------------------------------------------- public */

void exec_handle_request(uint32_t id, const uint8_t *payload, size_t len)
{
    if (run) reject_request(id, "busy", "exec %u is still running", run->request_id);

    struct exec_shape shape;
    const char *why = NULL;
    if (!measure_request(payload, len, &shape, &why)) reject_request(id, "bad_request", "%s", why);

    /* Static: one exec at a time; build_run copies it into the run. */
    static struct run_as user;
    int has_user = request_run_as(id, payload, len, &user);
    if (has_user < 0) return;

    /* The request's files, and the directories made for them, are the user's. */
    char file_error[PATH_MAX + 128] = "";
    if (has_user) run_as_own(&user);
    bool files_written = write_request_files(payload, len, file_error, sizeof file_error);
    run_as_disown();
    if (!files_written) reject_request(id, "file_write_failed", "%s", file_error);

    run = build_run(id, payload, len, &shape, has_user ? &user : NULL);
    if (!run) {
        /* Report it like a spawn failure: the request itself was fine. */
        struct exec_run oom = {.request_id = id, .exit_code = 126, .started_ns = realtime_ns()};
        snprintf(oom.error_text, sizeof oom.error_text, "out of memory preparing the exec");
        send_result(&oom);
        return;
    }
    if (run->timeout_ms) run->timeout_at = monotonic_ns() + (int64_t)run->timeout_ms * NS_PER_MS;
    exec_cgroup_create(&run->cgroup);
    if (!spawn_current(run)) finish_run();
}

void exec_child_exited(pid_t pid, int status)
{
    if (!run || pid != run->pid || run->main_exited) return;
    run->main_exited = true;
    run->wait_status = status;
    int64_t now = monotonic_ns();
    run->quiet_until = now + DRAIN_QUIET_NS;
    run->drain_until = now + DRAIN_LIMIT_NS;
    /* Nobody reads the rest of stdin now; background processes do not inherit the feed. */
    if (run->stdin_fd >= 0) close(run->stdin_fd);
    run->stdin_fd = -1;
}

/* A pause that is over is cleared, so that it stops counting as a deadline. */
static bool pause_over(int64_t *resume_at, int64_t now)
{
    if (*resume_at > now) return false;
    *resume_at = 0;
    return true;
}

static bool stream_wants_input(struct output_stream *s, bool backpressured, uint64_t cap, int64_t now)
{
    /* Past the cap we only count and drop, which costs no queue space, but in batches. */
    return s->fd >= 0 && (!backpressured || s->forwarded >= cap) && pause_over(&s->resume_at, now);
}

void exec_add_poll_fds(struct poll_set *ps)
{
    int64_t now = monotonic_ns();
    for (size_t i = 0; i < background_pipe_count; i++)
        if (pause_over(&background_pipes[i].resume_at, now)) poll_set_add(ps, background_pipes[i].fd, POLLIN, POLL_BACKGROUND);
    limits_add_poll_fds(ps);
    if (!run) return;
    bool backpressured = output_backpressured();
    if (stream_wants_input(&run->out, backpressured, run->max_output, now)) poll_set_add(ps, run->out.fd, POLLIN, POLL_EXEC_STDOUT);
    if (stream_wants_input(&run->err, backpressured, run->max_output, now)) poll_set_add(ps, run->err.fd, POLLIN, POLL_EXEC_STDERR);
    if (run->stdin_fd >= 0) poll_set_add(ps, run->stdin_fd, POLLOUT, POLL_EXEC_STDIN);
    if (run->cgroup.pids_events_fd >= 0 && !run->pids_limited) poll_set_add(ps, run->cgroup.pids_events_fd, POLLPRI, POLL_EXEC_PIDS);
}

void exec_handle_poll(enum poll_owner owner, int fd, short revents)
{
    /* Slots are built before poll(); an earlier event in the same round may have
       finished or detached the run, so only act on fds that are still ours. */
    switch (owner) {
    case POLL_BACKGROUND: drain_background_pipe(fd, revents); break;
    case POLL_EXEC_STDOUT:
        if (run && run->out.fd == fd) forward_output(run, &run->out);
        break;
    case POLL_EXEC_STDERR:
        if (run && run->err.fd == fd) forward_output(run, &run->err);
        break;
    case POLL_EXEC_STDIN:
        if (run && run->stdin_fd == fd) feed_stdin(run);
        break;
    case POLL_EXEC_PIDS:
        if (run && run->cgroup.pids_events_fd == fd) note_pids_limit(run);
        break;
    case POLL_CGROUP_PIDS:
    case POLL_CGROUP_EVENTS: limits_handle_poll(owner, fd, revents); break;
    default: break;
    }
}

static int64_t earlier(int64_t deadline, int64_t t)
{
    return t > 0 && (deadline < 0 || t < deadline) ? t : deadline;
}

int64_t exec_next_deadline_ns(void)
{
    int64_t deadline = -1;
    for (size_t i = 0; i < background_pipe_count; i++) deadline = earlier(deadline, background_pipes[i].resume_at);
    if (!run) return deadline;
    if (run->timeout_at && !run->timed_out) deadline = earlier(deadline, run->timeout_at);
    if (run->out.fd >= 0) deadline = earlier(deadline, run->out.resume_at);
    if (run->err.fd >= 0) deadline = earlier(deadline, run->err.resume_at);
    if (run->main_exited) {
        int64_t drain_end = run->quiet_until < run->drain_until ? run->quiet_until : run->drain_until;
        if (deadline < 0 || drain_end < deadline) deadline = drain_end;
    }
    return deadline;
}

void exec_tick(void)
{
    if (!run) return;
    int64_t now = monotonic_ns();
    if (run->timeout_at && !run->timed_out && now >= run->timeout_at) {
        run->timed_out = true;
        agent_log("exec %u timed out; killing process group %d", run->request_id, (int)run->pgid);
        if (run->pgid > 0) kill(-run->pgid, SIGKILL);
        /* And whatever else it started, in other process groups or sessions. */
        exec_cgroup_kill(&run->cgroup);
    }
    if (!run->main_exited) return;
    if (output_backpressured()) {
        /* We are not reading while the host catches up; that is not silence. */
        run->quiet_until = now + DRAIN_QUIET_NS;
        if (run->drain_until < run->quiet_until) run->drain_until = run->quiet_until;
    }
    bool at_eof = run->out.fd < 0 && run->err.fd < 0;
    if (at_eof || now >= run->quiet_until || now >= run->drain_until) command_finished(run);
}

void exec_detach(void)
{
    if (!run) return;
    agent_log("host left during exec %u; its processes continue unobserved", run->request_id);
    if (run->out.fd >= 0) keep_pipe_in_background(run->out.fd);
    if (run->err.fd >= 0) keep_pipe_in_background(run->err.fd);
    run->out.fd = run->err.fd = -1;
    free_run();
}
