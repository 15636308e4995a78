/*
 * Collimate guest agent: shared declarations.
 *
 * The wire contract lives in docs/agent-protocol.md; the constants below must
 * stay identical to src/guest/protocol.ts.
 */
#ifndef COLLIMATE_AGENT_H
#define COLLIMATE_AGENT_H

#define _GNU_SOURCE

#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define AGENT_VERSION "collimate-agent/1"

#define FRAME_MAGIC 0x314D4C43u
#define FRAME_HEADER_SIZE 16u
#define MAX_FRAME_PAYLOAD (1024u * 1024u)
#define OUTPUT_CHUNK_MAX (64u * 1024u)
#define FILE_CHUNK_MAX (512u * 1024u)
#define DEFAULT_MAX_OUTPUT (1024u * 1024u)
#define IDENTITY_TEXT_MAX 4096u

/* The seed library: carried in the initramfs, copied at boot to /run (the initramfs is
   unreachable after the switch to the sandbox root). */
#define SEED_LIBRARY_INITRAMFS_PATH "/lib/collimate/libcollimate-seed.so"
#define SEED_LIBRARY_GUEST_PATH "/run/collimate/libcollimate-seed.so"

#define NS_PER_MS 1000000LL
#define NS_PER_SEC 1000000000LL

enum message_type {
    MSG_PING = 1,
    MSG_EXEC = 2,
    MSG_RESTORED = 3,
    MSG_FILE_READ = 4,
    MSG_FILE_WRITE = 5,
    MSG_SET_TIME = 6,
    /* Background processes (proc.c): 10-16 and 0x90-0x97 are theirs. */
    MSG_PROC_START = 10,
    MSG_PROC_INPUT = 11,
    MSG_PROC_CLOSE_STDIN = 12,
    MSG_PROC_SIGNAL = 13,
    MSG_PROC_RESIZE = 14,
    MSG_PROC_LIST = 15,
    /* Files and directories (fs.c): host -> guest 20-29, guest -> host 0xA0-0xA7. */
    MSG_FS_STAT = 20,
    MSG_FS_LIST = 21,
    MSG_FS_MKDIR = 22,
    MSG_FS_REMOVE = 23,
    MSG_FS_RENAME = 24,
    MSG_FS_WATCH = 25,
    MSG_FS_UNWATCH = 26,
    MSG_FS_USAGE = 27,
    MSG_PONG = 0x81,
    MSG_STDOUT = 0x82,
    MSG_STDERR = 0x83,
    MSG_EXEC_RESULT = 0x84,
    MSG_OK = 0x85,
    MSG_FILE_DATA = 0x86,
    MSG_FS_ENTRY = 0xA0,
    MSG_FS_ENTRIES = 0xA1,
    MSG_FS_REMOVED = 0xA2,
    MSG_FS_WATCHING = 0xA3,
    MSG_FS_EVENT = 0xA4,
    MSG_FS_USAGE_RESULT = 0xA5,
    MSG_ERROR = 0x8F,
    MSG_PROC_STARTED = 0x90,
    MSG_PROC_OUTPUT = 0x91,
    MSG_PROC_EXIT = 0x92,
    MSG_PROC_TABLE = 0x93,
};

enum field_tag {
    TAG_ARGV_BEGIN = 10,
    TAG_ARG = 11,
    TAG_ENV = 12,
    TAG_CWD = 13,
    TAG_STDIN = 14,
    TAG_FILE_PATH = 15,
    TAG_FILE_MODE = 16,
    TAG_FILE_DATA = 17,
    TAG_TIMEOUT_MS = 18,
    TAG_MAX_OUTPUT = 19,
    TAG_SEED = 20,
    TAG_USER = 21,

    TAG_EXIT_CODE = 30,
    TAG_SIGNAL = 31,
    TAG_TIMED_OUT = 32,
    TAG_STDOUT_TRUNCATED = 35,
    TAG_STDERR_TRUNCATED = 36,
    TAG_STDOUT_BYTES = 37,
    TAG_STDERR_BYTES = 38,
    TAG_FAILED_INDEX = 39,
    TAG_STARTED_NS = 40,
    TAG_FINISHED_NS = 41,
    TAG_ERROR_TEXT = 42,
    TAG_PIDS_LIMITED = 43,

    TAG_ENTROPY = 50,
    TAG_TIME_NS = 51,
    TAG_SANDBOX_ID = 52,
    TAG_TOKEN = 53,

    TAG_PATH = 60,
    TAG_DATA = 61,
    TAG_OFFSET = 62,
    TAG_LENGTH = 63,
    TAG_SIZE = 64,
    TAG_TRUNCATE = 65,
    TAG_MODE = 16,

    TAG_CODE = 70,
    TAG_MESSAGE = 71,

    TAG_AGENT_VERSION = 80,
    TAG_UPTIME_MS = 81,

    /* Background processes (proc.c): tags 100-129 are theirs. */
    TAG_PID = 100,
    TAG_STREAM = 101,
    TAG_PTY = 102,
    TAG_COLS = 103,
    TAG_ROWS = 104,
    TAG_STDIN_OPEN = 105,
    TAG_PROC_TAG = 106,
    TAG_OUTPUT_OFFSET = 107,
    TAG_PROC_ENTRY = 108,
    TAG_EXITED = 109,
    TAG_OUTPUT_TOTAL = 110,
    TAG_ARGV_TRUNCATED = 111,
    TAG_NO_ASLR = 112,

    /* Files and directories (fs.c): tags 130-159. */
    TAG_FS_PATH = 130,
    TAG_FS_DEPTH = 131,
    TAG_FS_MODE = 132,
    TAG_FS_TRUNCATED = 133,
    TAG_FS_FROM = 134,
    TAG_FS_TO = 135,
    TAG_FS_RECURSIVE = 136,
    TAG_FS_WATCH_ID = 137,
    TAG_FS_OP = 138,
    TAG_FS_CREATED = 139,
    TAG_FS_REMOVED_COUNT = 140,
    TAG_FS_DONE = 141,
    TAG_FS_ENTRY_BEGIN = 142,
    TAG_FS_NAME = 143,
    TAG_FS_ENTRY_PATH = 144,
    TAG_FS_TYPE = 145,
    TAG_FS_SIZE = 146,
    TAG_FS_PERM = 147,
    TAG_FS_UID = 148,
    TAG_FS_GID = 149,
    TAG_FS_OWNER = 150,
    TAG_FS_GROUP = 151,
    TAG_FS_MTIME_NS = 152,
    TAG_FS_TARGET = 153,
    TAG_FS_MAX_ENTRIES = 154,
    /* An extended attribute of the user.* namespace: its name without "user.", then its value. */
    TAG_FS_XATTR_NAME = 155,
    TAG_FS_XATTR_VALUE = 156,
    /* FS_USAGE_RESULT: the root file system's size, free bytes, and bytes free to unprivileged users. */
    TAG_FS_TOTAL_BYTES = 157,
    TAG_FS_FREE_BYTES = 158,
    TAG_FS_AVAILABLE_BYTES = 159,
};

/* The user.* extended attributes an entry reports (and FILE_WRITE sets): at most this many bytes of
   names and values together; attributes past it are left out of the entry. */
#define FS_XATTR_BYTES_MAX 4096u
#define FS_XATTR_COUNT_MAX 64u

static inline uint16_t load_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t load_le64(const uint8_t *p) { return (uint64_t)load_le32(p) | ((uint64_t)load_le32(p + 4) << 32); }
static inline void store_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void store_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void store_le64(uint8_t *p, uint64_t v)
{
    store_le32(p, (uint32_t)v);
    store_le32(p + 4, (uint32_t)(v >> 32));
}

/* ---- TLV payloads (wire.c) ---- */

struct tlv_field {
    uint16_t tag;
    uint32_t len;
    const uint8_t *value;
};

struct tlv_cursor {
    const uint8_t *next;
    size_t left;
};

void tlv_cursor_init(struct tlv_cursor *c, const uint8_t *payload, size_t len);
/* 1 = produced a field, 0 = clean end, -1 = truncated field. */
int tlv_next(struct tlv_cursor *c, struct tlv_field *f);
bool tlv_well_formed(const uint8_t *payload, size_t len);
bool tlv_as_u8(const struct tlv_field *f, uint8_t *out);
bool tlv_as_u32(const struct tlv_field *f, uint32_t *out);
bool tlv_as_u64(const struct tlv_field *f, uint64_t *out);
bool tlv_has_nul(const struct tlv_field *f);
/* Copies a NUL-free field into dst as a C string; false if it has a NUL or does not fit. */
bool tlv_copy_text(const struct tlv_field *f, char *dst, size_t cap);

/* ---- Outgoing frames (wire.c builds them, agent.c queues and sends them) ---- */

struct out_frame {
    struct out_frame *next;
    size_t len;
    size_t sent;
    uint8_t bytes[];
};

struct frame_builder {
    struct out_frame *frame;
    size_t cap;
    size_t open_field;
    bool overflow;
};

bool frame_begin(struct frame_builder *b, uint16_t type, uint32_t id, size_t payload_cap);
void frame_put_u8(struct frame_builder *b, uint16_t tag, uint8_t v);
void frame_put_u32(struct frame_builder *b, uint16_t tag, uint32_t v);
void frame_put_i32(struct frame_builder *b, uint16_t tag, int32_t v);
void frame_put_u64(struct frame_builder *b, uint16_t tag, uint64_t v);
void frame_put_bytes(struct frame_builder *b, uint16_t tag, const void *data, size_t len);
void frame_put_text(struct frame_builder *b, uint16_t tag, const char *text);
void frame_put_raw(struct frame_builder *b, const void *data, size_t len);
/* Reserve up to max_len value bytes of a field to fill in place; frame_close_field fixes the length. */
uint8_t *frame_open_field(struct frame_builder *b, uint16_t tag, size_t max_len);
void frame_close_field(struct frame_builder *b, size_t actual_len);
void frame_send(struct frame_builder *b);

void send_simple_frame(uint16_t type, uint32_t id, const void *raw, size_t len);
void reply_ok(uint32_t id);
void reply_error(uint32_t id, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Request handlers validate top-down and bail out at the first problem. */
#define reject_request(id, code, ...)              \
    do {                                           \
        reply_error((id), (code), __VA_ARGS__);    \
        return;                                    \
    } while (0)

/* ---- agent.c ---- */

extern bool agent_debug;
extern bool agent_test_mode;
void agent_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void agent_log_to_fd(int fd);

void output_enqueue(struct out_frame *frame);
bool output_backpressured(void);

int64_t monotonic_ns(void);
uint64_t realtime_ns(void);

/* mkdir -p for every parent of path (0755); errors surface when the file itself is opened. */
void make_parent_directories(const char *path);
int make_directories(const char *path, mode_t mode);
bool write_all(int fd, const void *data, size_t len);

/* KEY=VALUE strings every command starts from; NULL-terminated. */
extern char **base_environment;
extern size_t base_environment_count;
void base_environment_init(char *const *overrides, size_t count);

/* ---- Poll set shared by the transport and the exec engine ---- */

enum poll_owner {
    POLL_SIGNALS,
    POLL_TRANSPORT,
    POLL_LISTENER,
    POLL_EXEC_STDIN,
    POLL_EXEC_STDOUT,
    POLL_EXEC_STDERR,
    POLL_BACKGROUND,
    POLL_EXEC_PIDS,
    POLL_CGROUP_PIDS,
    POLL_CGROUP_EVENTS,
    POLL_PROC_OUTPUT,
    POLL_PROC_STDIN,
    POLL_PROC_PIDS,
    POLL_FS_WATCH,
};

/* Room for the background pipes (256), the exec's fds, the lingering cgroups' (2 x 32), the
   background processes' (64 x 4: stdout, stderr, stdin, pids.events) and the directory watches' (32). */
#define POLL_SET_MAX 672

struct poll_set {
    struct pollfd fds[POLL_SET_MAX];
    uint8_t owner[POLL_SET_MAX];
    nfds_t count;
};

void poll_set_add(struct poll_set *ps, int fd, short events, enum poll_owner owner);

/* ---- exec.c ---- */

/* Keeps the quadratic ENV override merge cheap no matter what the host sends. */
#define ENV_FIELDS_MAX 4096
/* Entries a seeded command may add: LD_PRELOAD, COLLIMATE_SEED, PYTHONHASHSEED. */
#define SEED_ENV_ENTRIES 3

struct seed_environment {
    char seed_entry[48];
    char hash_entry[48];
    char *preload_entry; /* malloc'ed; NULL when the library is not preloaded */
};

/* KEY=VALUE into envp, replacing an entry with the same key. */
void merge_env(char **envp, size_t *count, char *entry);
/* Exec semantics 9 (docs/agent-protocol.md): the entries of a seeded command. envp needs
   SEED_ENV_ENTRIES free slots. */
void apply_seed_environment(char **envp, size_t *count, uint64_t seed, struct seed_environment *s);
const char *default_cwd(void);
/* A pipe whose reader is done with it but whose writers may live on: read and discarded until EOF. */
void keep_pipe_in_background(int fd);
/* Drops what the pipe holds: bytes dropped, 0 at EOF, -1 with errno (EAGAIN: nothing there now). */
ssize_t discard_from_pipe(int fd);

void exec_handle_request(uint32_t id, const uint8_t *payload, size_t len);
void exec_child_exited(pid_t pid, int status);
void exec_add_poll_fds(struct poll_set *ps);
void exec_handle_poll(enum poll_owner owner, int fd, short revents);
/* Monotonic ns of the next timer the exec engine needs, or -1. */
int64_t exec_next_deadline_ns(void);
void exec_tick(void);
/* The host went away: keep the processes running as background jobs, forget the request. */
void exec_detach(void);

/* ---- proc.c: background processes ---- */

void proc_handle_start(uint32_t id, const uint8_t *payload, size_t len);
void proc_handle_input(uint32_t id, const uint8_t *payload, size_t len);
void proc_handle_close_stdin(uint32_t id, const uint8_t *payload, size_t len);
void proc_handle_signal(uint32_t id, const uint8_t *payload, size_t len);
void proc_handle_resize(uint32_t id, const uint8_t *payload, size_t len);
void proc_handle_list(uint32_t id, const uint8_t *payload, size_t len);
/* Whether pid was a background process's main process (then the exec engine need not look). */
bool proc_child_exited(pid_t pid, int status);
void proc_add_poll_fds(struct poll_set *ps);
void proc_handle_poll(enum poll_owner owner, int fd, short revents);
int64_t proc_next_deadline_ns(void);
void proc_tick(void);
/* The host went away: requests waiting for an answer are forgotten; the processes run on. */
void proc_detach(void);

/* Whether a host is attached to receive frames now (else output_enqueue drops them). */
bool host_attached(void);

/* ---- fs.c: directory operations and watches ---- */

/* Where relative paths are resolved: /root (test mode: --home DIR). */
extern const char *fs_home_dir;
/* A relative path made absolute under fs_home_dir (the USER's home for a request with one), in place; false if too long. */
bool path_under_home(char path[PATH_MAX]);

/* ---- user.c ---- */

#define RUN_AS_NAME_MAX 64
#define RUN_AS_GROUPS_MAX 64

/* An account of the sandbox's image, as a request's USER field names it. */
struct run_as {
    char name[RUN_AS_NAME_MAX + 1];
    uid_t uid;
    gid_t gid;
    gid_t groups[RUN_AS_GROUPS_MAX];
    size_t group_count;
    char home[PATH_MAX];
    /* HOME=, USER=, LOGNAME= for the environment (run_as_environment points envp at these). */
    char env_home[PATH_MAX + 8], env_user[RUN_AS_NAME_MAX + 8], env_logname[RUN_AS_NAME_MAX + 10];
};

/* The account the request's USER field names (the last one wins), looked up into *u: 1 with one,
   0 without, -1 when it is malformed or unknown (user_not_found is sent; the caller stops). */
int request_run_as(uint32_t id, const uint8_t *payload, size_t len, struct run_as *u);
/* Looks the account up in /etc/passwd and /etc/group; false with `why` set if malformed or unknown. */
bool run_as_lookup(const struct tlv_field *f, struct run_as *u, char *why, size_t why_cap);
/* In a child before exec: the account's groups, gid and uid. Returns 0 or an errno. */
int run_as_become(const struct run_as *u);
#define RUN_AS_ENV_ENTRIES 3
/* Where a command of this account starts without a CWD: its home if it can enter it, else /. */
const char *user_cwd(const struct run_as *u);
/* Sets HOME, USER and LOGNAME in envp (before the request's own ENV, which may override them). */
void run_as_environment(struct run_as *u, char **envp, size_t *count);
/* For one file request: what it creates becomes the account's (own_path, own_fd), until run_as_disown. */
void run_as_own(const struct run_as *u);
void run_as_disown(void);
/* Gives a path (not following a final symlink) or an open file to the request's account, if it has one. */
void own_path(const char *path);
void own_fd(int fd);
/* Handles the FS_* requests (FS_USAGE too); false for any other type. */
bool fs_handle_request(uint16_t type, uint32_t id, const uint8_t *payload, size_t len);
void fs_add_poll_fds(struct poll_set *ps);
void fs_handle_poll(int fd, short revents);
/* No host knows the watches any more (it went away, or this guest was restored from a snapshot). */
void fs_forget_watches(void);

/* ---- limits.c: guest cgroups (cgroup v2) ---- */

/* An exec's cgroup, /sys/fs/cgroup/execs/exec-<seq>; seq 0 = none (no cgroups in this guest). */
struct exec_cgroup {
    uint64_t seq;
    int procs_fd;       /* cgroup.procs: the exec's first process writes "0" to it before execve */
    int pids_events_fd; /* pids.events: polls POLLPRI when the process limit has been hit */
};

/* Boot: cgroup2 mounted, the agent in its own cgroup above the execs'. */
void limits_init(void);
/* The pids.max of every exec's cgroup. */
uint32_t exec_pids_max(void);
bool exec_cgroup_create(struct exec_cgroup *cg);
/* In the forked child, before execve: into the exec's cgroup, at the execs' nice value. */
void exec_cgroup_enter_child(const struct exec_cgroup *cg);
bool exec_cgroup_limit_hit(struct exec_cgroup *cg);
/* SIGKILLs every process in the cgroup (cgroup.kill). */
void exec_cgroup_kill(const struct exec_cgroup *cg);
/* The exec is over: the cgroup goes now if empty, else once its background processes are gone. */
void exec_cgroup_release(struct exec_cgroup *cg);
void limits_add_poll_fds(struct poll_set *ps);
void limits_handle_poll(enum poll_owner owner, int fd, short revents);

/* ---- boot.c ---- */

void boot_system(void);
int open_agent_port(void);

/* RESTORED's privileged steps; each returns 0, or -1 with a reason in why. */
int restore_mix_entropy(const uint8_t *data, size_t len, char *why, size_t why_cap);
int restore_set_clock(uint64_t realtime_ns_value, char *why, size_t why_cap);
int restore_refresh_boot_id(char *why, size_t why_cap);
int restore_publish_sandbox_id(const char *sandbox_id, char *why, size_t why_cap);

/* ---- net.c ---- */

/* From the kernel command line: collimate.net=<addr>/<prefix>,<gateway>[,<nameserver>]. */
void net_set_spec(const char *spec);
/* Brings up eth0 with that address and default route and writes /etc/resolv.conf (after the root switch). */
void net_configure(void);

#endif
