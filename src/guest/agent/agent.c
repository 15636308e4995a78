/*
 * Collimate guest agent: PID 1 of every sandbox VM.
 *
 * One single-threaded poll() loop owns everything: the host channel, the
 * running exec's pipes, pipes left behind by background processes, timers and
 * child reaping. Nothing blocks on the host: if it stops reading, queued output
 * stops the exec's pipe reads (the command then blocks on its own writes), and
 * a bigger backlog stops us from processing more requests.
 */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

/* One maximal frame always fits, plus room to read ahead. */
#define RX_CAPACITY (FRAME_HEADER_SIZE + MAX_FRAME_PAYLOAD + 64u * 1024u)
/* Above this much unsent output we stop reading the exec's pipes. */
#define OUTPUT_HIGH_WATER (1024u * 1024u)
/* Above this we also stop handling host requests, so a host that writes but never
   reads cannot grow the queue: requests wait in the (bounded) receive buffer. */
#define OUTPUT_REQUEST_THROTTLE (4u * 1024u * 1024u)
/* While no host is attached the agent waits for the port driver's SIGIO (sent when the
   host connects); this timer only covers a signal that never comes. */
#define RECONNECT_FALLBACK_MS 1000
/* Replies waiting to be sent survive a host absence this short. The port can look closed for a
   moment though the host is there: after a restore the guest handles QEMU's 'host closed, host
   open' control messages late (a workqueue), after it has already read and answered a request on
   the data queue; the answer then waits for the port to be writable, and dropping it there left
   the host waiting for ever. A host that really went away and came back later gets nothing stale;
   one that comes back sooner ignores replies to requests it did not send (they carry its ids). */
#define HOST_GONE_GRACE_MS 3000

bool agent_debug;
bool agent_test_mode;
static int log_fd = -1;

enum transport_kind { TRANSPORT_VIRTIO_PORT, TRANSPORT_FD, TRANSPORT_SOCKET };

static struct {
    enum transport_kind kind;
    int fd;        /* the channel; -1 while a socket-mode agent waits for a connection */
    int listen_fd; /* socket mode only */
    /* virtio-serial reads return EOF while no host is attached; we then stop polling
       the port (it reports POLLHUP continuously) and wait for SIGIO on the signalfd:
       the port is O_ASYNC, and virtio_console signals its owner when the host connects
       or disconnects (VIRTIO_CONSOLE_PORT_OPEN) and when data arrives. */
    bool host_connected;
    int64_t retry_at_ns;
    int64_t lost_at_ns;
    /* While the host is away: when its unsent replies are dropped (-1: none pending). */
    int64_t forget_output_at_ns;
} transport = {.fd = -1, .listen_fd = -1, .host_connected = true, .forget_output_at_ns = -1};

static struct {
    uint8_t *buf;
    size_t len;
    bool resyncing;
    size_t skipped;
} rx;

static struct {
    struct out_frame *head, *tail;
    size_t bytes;
} outq;

static int signal_fd = -1;

static struct {
    char *sandbox_id;
    char *token;
} identity;

static char *default_environment[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=xterm",
};
#define DEFAULT_ENVIRONMENT_COUNT (sizeof default_environment / sizeof default_environment[0])
#define ENVIRONMENT_OVERRIDES_MAX 64
static char *base_environment_storage[DEFAULT_ENVIRONMENT_COUNT + ENVIRONMENT_OVERRIDES_MAX + 1];
char **base_environment = base_environment_storage;
size_t base_environment_count;

/* ---------------------------------------------------------------- helpers */

void agent_log_to_fd(int fd) { log_fd = fd; }

void agent_log(const char *fmt, ...)
{
    if (!agent_debug || log_fd < 0) return;
    char line[1200];
    int n = snprintf(line, sizeof line, "collimate-agent: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    (void)!write(log_fd, line, (size_t)n);
}

int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_SEC + ts.tv_nsec;
}

uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * (uint64_t)NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

bool write_all(int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

int make_directories(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, mode) == 0) own_path(buf);
        else if (errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) == 0) own_path(buf);
    else if (errno != EEXIST) return -1;
    return 0;
}

void make_parent_directories(const char *path)
{
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf) return;
    memcpy(buf, path, len + 1);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return;
    *slash = '\0';
    (void)make_directories(buf, 0755);
}

void base_environment_init(char *const *overrides, size_t count)
{
    base_environment_count = 0;
    for (size_t i = 0; i < DEFAULT_ENVIRONMENT_COUNT; i++) base_environment[base_environment_count++] = default_environment[i];
    for (size_t i = 0; i < count && i < ENVIRONMENT_OVERRIDES_MAX; i++) {
        const char *eq = strchr(overrides[i], '=');
        if (!eq || eq == overrides[i]) continue;
        size_t key_len = (size_t)(eq - overrides[i]) + 1;
        size_t slot = 0;
        while (slot < base_environment_count && strncmp(base_environment[slot], overrides[i], key_len) != 0) slot++;
        base_environment[slot] = overrides[i];
        if (slot == base_environment_count) base_environment_count++;
    }
    base_environment[base_environment_count] = NULL;
}

void poll_set_add(struct poll_set *ps, int fd, short events, enum poll_owner owner)
{
    if (ps->count >= POLL_SET_MAX) return;
    ps->fds[ps->count].fd = fd;
    ps->fds[ps->count].events = events;
    ps->fds[ps->count].revents = 0;
    ps->owner[ps->count] = (uint8_t)owner;
    ps->count++;
}

static void set_nonblocking_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* ------------------------------------------------------------ output queue */

static bool transport_writable_now(void) { return transport.fd >= 0 && transport.host_connected; }

bool host_attached(void) { return transport_writable_now(); }

void output_enqueue(struct out_frame *frame)
{
    /* With no host attached nobody can receive it, and a later host must not see
       replies to requests it never made. */
    if (!transport_writable_now()) {
        free(frame);
        return;
    }
    if (outq.tail) outq.tail->next = frame;
    else outq.head = frame;
    outq.tail = frame;
    outq.bytes += frame->len;
}

bool output_backpressured(void) { return outq.bytes >= OUTPUT_HIGH_WATER; }

static void output_discard_all(void)
{
    while (outq.head) {
        struct out_frame *next = outq.head->next;
        free(outq.head);
        outq.head = next;
    }
    outq.tail = NULL;
    outq.bytes = 0;
}

/* -------------------------------------------------------------- transport */

static void host_went_away(void)
{
    rx.len = 0;
    rx.resyncing = false;
    output_discard_all();
    exec_detach();
    proc_detach();
    fs_forget_watches();
}

static void schedule_port_retry(void) { transport.retry_at_ns = monotonic_ns() + RECONNECT_FALLBACK_MS * NS_PER_MS; }

static void transport_lost(const char *why)
{
    switch (transport.kind) {
    case TRANSPORT_VIRTIO_PORT:
        if (transport.host_connected) {
            agent_log("host disconnected (%s)", why);
            transport.host_connected = false;
            transport.lost_at_ns = monotonic_ns();
            /* A partial request and running execs go at once; replies wait (HOST_GONE_GRACE_MS). */
            rx.len = 0;
            rx.resyncing = false;
            exec_detach();
            proc_detach();
            transport.forget_output_at_ns = transport.lost_at_ns + (int64_t)HOST_GONE_GRACE_MS * NS_PER_MS;
        }
        schedule_port_retry();
        break;
    case TRANSPORT_SOCKET:
        agent_log("connection closed (%s)", why);
        close(transport.fd);
        transport.fd = -1;
        host_went_away();
        break;
    case TRANSPORT_FD:
        agent_log("serve fd closed (%s); exiting", why);
        exit(0);
    }
}

static void transport_alive(void)
{
    if (transport.kind != TRANSPORT_VIRTIO_PORT) return;
    if (!transport.host_connected) agent_log("host connected (%lld us after it went away)", (long long)(monotonic_ns() - transport.lost_at_ns) / 1000);
    transport.host_connected = true;
    transport.forget_output_at_ns = -1;
}

static void transport_read(void)
{
    if (rx.len >= RX_CAPACITY) return;
    ssize_t n = read(transport.fd, rx.buf + rx.len, RX_CAPACITY - rx.len);
    if (n > 0) {
        rx.len += (size_t)n;
        transport_alive();
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        transport_alive();
        return;
    }
    transport_lost(n == 0 ? "EOF" : strerror(errno));
}

static void output_flush(void)
{
    while (outq.head && transport_writable_now()) {
        struct out_frame *f = outq.head;
        ssize_t n = write(transport.fd, f->bytes + f->sent, f->len - f->sent);
        if (n > 0) {
            f->sent += (size_t)n;
            if (f->sent < f->len) continue;
            outq.head = f->next;
            if (!outq.head) outq.tail = NULL;
            outq.bytes -= f->len;
            free(f);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        transport_lost(n == 0 ? "zero-length write" : strerror(errno));
        return;
    }
}

static void accept_connection(void)
{
    int fd = accept4(transport.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    agent_log("accepted a connection");
    transport.fd = fd;
    rx.len = 0;
    rx.resyncing = false;
}

/* -------------------------------------------------------------- handlers */

static void handle_ping(uint32_t id, const uint8_t *payload, size_t len)
{
    if (!tlv_well_formed(payload, len)) {
        reply_error(id, "bad_request", "PING payload is not valid TLV");
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    uint64_t uptime_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    const char *sandbox_id = identity.sandbox_id ? identity.sandbox_id : "";

    struct frame_builder b;
    if (!frame_begin(&b, MSG_PONG, id, 64 + strlen(AGENT_VERSION) + strlen(sandbox_id))) return;
    frame_put_text(&b, TAG_AGENT_VERSION, AGENT_VERSION);
    frame_put_u64(&b, TAG_UPTIME_MS, uptime_ms);
    frame_put_text(&b, TAG_SANDBOX_ID, sandbox_id);
    frame_send(&b);
}

static char *dup_field_text(const struct tlv_field *f)
{
    char *s = malloc(f->len + 1);
    if (s) tlv_copy_text(f, s, f->len + 1);
    return s;
}

static void handle_restored(uint32_t id, const uint8_t *payload, size_t len)
{
    struct tlv_field entropy = {0}, sandbox_id = {0}, token = {0};
    bool have_entropy = false, have_sandbox_id = false, have_token = false, have_time = false;
    uint64_t time_ns = 0;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;

    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        switch (f.tag) {
        case TAG_ENTROPY:
            entropy = f;
            have_entropy = true;
            break;
        case TAG_TIME_NS:
            if (!tlv_as_u64(&f, &time_ns)) reject_request(id, "bad_request", "TIME_NS must be a u64");
            have_time = true;
            break;
        case TAG_SANDBOX_ID:
            sandbox_id = f;
            have_sandbox_id = true;
            break;
        case TAG_TOKEN:
            token = f;
            have_token = true;
            break;
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "RESTORED payload is truncated");
    if (!have_entropy || entropy.len < 32 || entropy.len > 512) reject_request(id, "bad_request", "ENTROPY must be 32-512 bytes");
    if (!have_time) reject_request(id, "bad_request", "TIME_NS is required");
    if (!have_sandbox_id || !have_token) reject_request(id, "bad_request", "SANDBOX_ID and TOKEN are required");
    if (sandbox_id.len > IDENTITY_TEXT_MAX || token.len > IDENTITY_TEXT_MAX || tlv_has_nul(&sandbox_id) || tlv_has_nul(&token))
        reject_request(id, "bad_request", "SANDBOX_ID/TOKEN must be at most %u bytes without NUL", IDENTITY_TEXT_MAX);

    char *new_id = dup_field_text(&sandbox_id);
    char *new_token = dup_field_text(&token);
    if (!new_id || !new_token) {
        free(new_id);
        free(new_token);
        reject_request(id, "restore_failed", "out of memory");
    }
    free(identity.sandbox_id);
    free(identity.token);
    identity.sandbox_id = new_id;
    identity.token = new_token;
    /* A snapshot's watches belong to the host that made them, not to this one. */
    fs_forget_watches();

    if (agent_test_mode) {
        reply_ok(id);
        return;
    }

    /* Every step runs even if an earlier one failed: a half-restored guest (say, a
       fresh clock but a cloned CRNG) is still better than one that skipped the rest. */
    char why[512] = "", first_failure[512] = "";
    int64_t t0 = monotonic_ns();
    if (restore_mix_entropy(entropy.value, entropy.len, why, sizeof why) != 0 && !first_failure[0])
        snprintf(first_failure, sizeof first_failure, "%s", why);
    int64_t t1 = monotonic_ns();
    if (restore_set_clock(time_ns, why, sizeof why) != 0 && !first_failure[0])
        snprintf(first_failure, sizeof first_failure, "%s", why);
    /* CLOCK_MONOTONIC is not touched by clock_settime, so the step timings stay valid. */
    int64_t t2 = monotonic_ns();
    if (restore_refresh_boot_id(why, sizeof why) != 0 && !first_failure[0])
        snprintf(first_failure, sizeof first_failure, "%s", why);
    int64_t t3 = monotonic_ns();
    if (restore_publish_sandbox_id(identity.sandbox_id, why, sizeof why) != 0 && !first_failure[0])
        snprintf(first_failure, sizeof first_failure, "%s", why);
    int64_t t4 = monotonic_ns();
    agent_log("RESTORED steps (us): entropy %lld, clock %lld, boot_id %lld, sandbox_id %lld", (long long)(t1 - t0) / 1000,
              (long long)(t2 - t1) / 1000, (long long)(t3 - t2) / 1000, (long long)(t4 - t3) / 1000);
    if (first_failure[0]) reject_request(id, "restore_failed", "%s", first_failure);
    reply_ok(id);
}

/* SET_TIME: the host paused this guest (a quiescent sandbox, or a fork's parent) and resumed it;
   CLOCK_REALTIME stood still meanwhile, so it is set again. Nothing else changes: same boot, same
   identity, same CRNG. */
static void handle_set_time(uint32_t id, const uint8_t *payload, size_t len)
{
    uint64_t time_ns = 0;
    bool have_time = false;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;

    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag != TAG_TIME_NS) continue;
        if (!tlv_as_u64(&f, &time_ns)) reject_request(id, "bad_request", "TIME_NS must be a u64");
        have_time = true;
    }
    if (rc < 0) reject_request(id, "bad_request", "SET_TIME payload is truncated");
    if (!have_time) reject_request(id, "bad_request", "TIME_NS is required");
    if (!agent_test_mode) {
        char why[256] = "";
        if (restore_set_clock(time_ns, why, sizeof why) != 0) reject_request(id, "restore_failed", "%s", why);
    }
    reply_ok(id);
}

static void handle_file_read(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    uint64_t offset = 0;
    uint32_t length = FILE_CHUNK_MAX;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;

    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag == TAG_PATH) {
            if (!tlv_copy_text(&f, path, sizeof path) || f.len == 0)
                reject_request(id, "bad_request", "PATH must be a non-empty string without NUL, shorter than %d", PATH_MAX);
            have_path = true;
        } else if (f.tag == TAG_OFFSET) {
            if (!tlv_as_u64(&f, &offset)) reject_request(id, "bad_request", "OFFSET must be a u64");
        } else if (f.tag == TAG_LENGTH) {
            if (!tlv_as_u32(&f, &length)) reject_request(id, "bad_request", "LENGTH must be a u32");
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "FILE_READ payload is truncated");
    if (!have_path) reject_request(id, "bad_request", "PATH is required");
    if (offset > (uint64_t)INT64_MAX) reject_request(id, "bad_request", "OFFSET out of range");
    if (length > FILE_CHUNK_MAX) length = FILE_CHUNK_MAX;

    /* O_NONBLOCK so a FIFO at the path cannot wedge the whole agent in open(). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) reject_request(id, "file_not_found", "%s: %s", path, strerror(errno));
        reject_request(id, "file_read_failed", "%s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        reject_request(id, "file_read_failed", "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        reject_request(id, "not_a_file", "%s is not a regular file", path);
    }

    struct frame_builder b;
    if (!frame_begin(&b, MSG_FILE_DATA, id, length + 64)) {
        close(fd);
        reject_request(id, "file_read_failed", "out of memory");
    }
    uint8_t *data = frame_open_field(&b, TAG_DATA, length);
    size_t got = 0;
    while (data && got < length) {
        ssize_t n = pread(fd, data + got, length - got, (off_t)(offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            free(b.frame);
            reject_request(id, "file_read_failed", "%s: %s", path, strerror(e));
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    frame_close_field(&b, got);
    frame_put_u64(&b, TAG_SIZE, (uint64_t)st.st_size);
    frame_put_u32(&b, TAG_MODE, (uint32_t)(st.st_mode & 07777));
    frame_send(&b);
}

static void handle_file_write(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    struct tlv_field data = {0};
    bool have_data = false;
    uint64_t offset = 0;
    uint8_t truncate_first = 0;
    uint32_t mode = 0644;
    /* user.* attributes set on a new or truncated file (names without "user."). */
    struct tlv_field xattr_names[FS_XATTR_COUNT_MAX], xattr_values[FS_XATTR_COUNT_MAX];
    size_t xattr_count = 0, xattr_bytes = 0;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;

    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        switch (f.tag) {
        case TAG_PATH:
            if (!tlv_copy_text(&f, path, sizeof path) || f.len == 0)
                reject_request(id, "bad_request", "PATH must be a non-empty string without NUL, shorter than %d", PATH_MAX);
            have_path = true;
            break;
        case TAG_DATA:
            data = f;
            have_data = true;
            break;
        case TAG_OFFSET:
            if (!tlv_as_u64(&f, &offset)) reject_request(id, "bad_request", "OFFSET must be a u64");
            break;
        case TAG_TRUNCATE:
            if (!tlv_as_u8(&f, &truncate_first)) reject_request(id, "bad_request", "TRUNCATE must be a u8");
            break;
        case TAG_MODE:
            if (!tlv_as_u32(&f, &mode)) reject_request(id, "bad_request", "MODE must be a u32");
            break;
        case TAG_FS_XATTR_NAME:
            if (xattr_count == FS_XATTR_COUNT_MAX) reject_request(id, "bad_request", "at most %u XATTR_NAME fields", FS_XATTR_COUNT_MAX);
            if (f.len == 0 || f.len > 250 || tlv_has_nul(&f)) reject_request(id, "bad_request", "XATTR_NAME must be 1 to 250 bytes without NUL");
            xattr_names[xattr_count] = f;
            xattr_values[xattr_count] = (struct tlv_field){0};
            xattr_count++;
            break;
        case TAG_FS_XATTR_VALUE:
            if (xattr_count == 0) reject_request(id, "bad_request", "XATTR_VALUE before XATTR_NAME");
            xattr_bytes += f.len;
            if (xattr_bytes > FS_XATTR_BYTES_MAX) reject_request(id, "bad_request", "XATTR values over %u bytes", FS_XATTR_BYTES_MAX);
            xattr_values[xattr_count - 1] = f;
            break;
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "FILE_WRITE payload is truncated");
    if (!have_path || !have_data) reject_request(id, "bad_request", "PATH and DATA are required");
    if (!path_under_home(path)) reject_request(id, "bad_request", "PATH is longer than %d bytes under %s", PATH_MAX - 1, fs_home_dir);
    if (offset > (uint64_t)INT64_MAX - data.len) reject_request(id, "bad_request", "OFFSET out of range");

    int flags = O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (truncate_first ? O_TRUNC : 0);
    bool created = false;
    int fd = open(path, flags);
    if (fd < 0 && errno == ENOENT) {
        make_parent_directories(path);
        /* Created owner-only, then chmod'ed: the umask must not decide the mode. */
        fd = open(path, flags | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            created = true;
            own_fd(fd);
        }
        else if (errno == EEXIST) fd = open(path, flags);
    }
    if (fd < 0) {
        if (errno == EISDIR) reject_request(id, "not_a_file", "%s is a directory", path);
        reject_request(id, "file_write_failed", "%s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        reject_request(id, "not_a_file", "%s is not a regular file", path);
    }
    if ((created || truncate_first) && fchmod(fd, (mode_t)(mode & 07777)) != 0) {
        int e = errno;
        close(fd);
        reject_request(id, "file_write_failed", "%s: chmod: %s", path, strerror(e));
    }
    for (size_t i = 0; (created || truncate_first) && i < xattr_count; i++) {
        char name[256];
        snprintf(name, sizeof name, "user.%.*s", (int)xattr_names[i].len, (const char *)xattr_names[i].value);
        if (fsetxattr(fd, name, xattr_values[i].value, xattr_values[i].len, 0) != 0) {
            int e = errno;
            close(fd);
            reject_request(id, "file_write_failed", "%s: setting %s: %s", path, name, strerror(e));
        }
    }
    size_t done = 0;
    while (done < data.len) {
        ssize_t n = pwrite(fd, data.value + done, data.len - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            reject_request(id, "file_write_failed", "%s: %s", path, strerror(e));
        }
        done += (size_t)n;
    }
    if (close(fd) != 0) reject_request(id, "file_write_failed", "%s: close: %s", path, strerror(errno));
    reply_ok(id);
}

static void dispatch_request(uint16_t type, uint32_t id, const uint8_t *payload, size_t len);

/*
 * A file request with USER: what it creates is that account's, and its relative paths are under
 * that account's home. Execs and processes take USER themselves (exec.c, proc.c).
 */
static void dispatch_frame(uint16_t type, uint32_t id, const uint8_t *payload, size_t len)
{
    bool file_request = type == MSG_FILE_READ || type == MSG_FILE_WRITE || (type >= MSG_FS_STAT && type <= MSG_FS_WATCH);
    static struct run_as user;
    int has_user = file_request ? request_run_as(id, payload, len, &user) : 0;
    if (has_user < 0) return;
    if (has_user == 0) {
        dispatch_request(type, id, payload, len);
        return;
    }
    run_as_own(&user);
    const char *home = fs_home_dir;
    fs_home_dir = user.home;
    dispatch_request(type, id, payload, len);
    fs_home_dir = home;
    run_as_disown();
}

static void dispatch_request(uint16_t type, uint32_t id, const uint8_t *payload, size_t len)
{
    switch (type) {
    case MSG_PING: handle_ping(id, payload, len); break;
    case MSG_EXEC: exec_handle_request(id, payload, len); break;
    case MSG_RESTORED: handle_restored(id, payload, len); break;
    case MSG_FILE_READ: handle_file_read(id, payload, len); break;
    case MSG_FILE_WRITE: handle_file_write(id, payload, len); break;
    case MSG_SET_TIME: handle_set_time(id, payload, len); break;
    case MSG_PROC_START: proc_handle_start(id, payload, len); break;
    case MSG_PROC_INPUT: proc_handle_input(id, payload, len); break;
    case MSG_PROC_CLOSE_STDIN: proc_handle_close_stdin(id, payload, len); break;
    case MSG_PROC_SIGNAL: proc_handle_signal(id, payload, len); break;
    case MSG_PROC_RESIZE: proc_handle_resize(id, payload, len); break;
    case MSG_PROC_LIST: proc_handle_list(id, payload, len); break;
    default:
        if (!fs_handle_request(type, id, payload, len)) reply_error(id, "bad_request", "unknown message type %u", type);
    }
}

/* ------------------------------------------------------------ rx framing */

/* Offset of the first position where the magic (or, at the very end, a prefix of
   it) starts; everything before it is garbage we may drop. */
static size_t garbage_before_magic(const uint8_t *p, size_t n)
{
    static const uint8_t magic[4] = {0x43, 0x4C, 0x4D, 0x31};
    for (size_t i = 0; i < n; i++) {
        size_t cmp = n - i < 4 ? n - i : 4;
        if (memcmp(p + i, magic, cmp) == 0) return i;
    }
    return n;
}

static void rx_process(void)
{
    size_t pos = 0;
    while (outq.bytes < OUTPUT_REQUEST_THROTTLE && transport_writable_now()) {
        size_t avail = rx.len - pos;
        if (avail < FRAME_HEADER_SIZE) {
            if (rx.resyncing) {
                size_t skip = garbage_before_magic(rx.buf + pos, avail);
                pos += skip;
                rx.skipped += skip;
            }
            break;
        }
        const uint8_t *h = rx.buf + pos;
        uint32_t payload_len = load_le32(h + 12);
        if (load_le32(h) != FRAME_MAGIC || payload_len > MAX_FRAME_PAYLOAD) {
            if (!rx.resyncing) {
                rx.resyncing = true;
                rx.skipped = 0;
            }
            pos += 1;
            size_t skip = garbage_before_magic(rx.buf + pos, rx.len - pos);
            pos += skip;
            rx.skipped += 1 + skip;
            continue;
        }
        if (rx.resyncing) {
            rx.resyncing = false;
            reply_error(0, "bad_frame", "skipped %zu bytes of garbage before a valid frame header", rx.skipped);
        }
        if (avail < FRAME_HEADER_SIZE + payload_len) break;
        dispatch_frame(load_le16(h + 4), load_le32(h + 8), h + FRAME_HEADER_SIZE, payload_len);
        pos += FRAME_HEADER_SIZE + payload_len;
    }
    if (pos > 0 && pos <= rx.len) {
        memmove(rx.buf, rx.buf + pos, rx.len - pos);
        rx.len -= pos;
    }
}

/* ---------------------------------------------------------------- reaping */

static void handle_signals(void)
{
    struct signalfd_siginfo info;
    bool child = false, port_event = false;
    while (read(signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
        if (info.ssi_signo == SIGCHLD) child = true;
        else if (info.ssi_signo == SIGIO) port_event = true;
    }
    /* A disconnected port is not polled; SIGIO says the host may be back, and a read
       tells (EOF: still gone). While connected, SIGIO only duplicates POLLIN. */
    if (port_event && transport.kind == TRANSPORT_VIRTIO_PORT && !transport.host_connected) transport_read();
    if (!child) return;
    /* SIGCHLD coalesces, and as PID 1 we inherit every orphan: reap until none is left
       and let the exec engine pick out the one process it is waiting for. */
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        if (!proc_child_exited(pid, status)) exec_child_exited(pid, status);
    }
}

/* --------------------------------------------------------------- main loop */

static int poll_timeout_ms(int64_t deadline_ns)
{
    if (deadline_ns < 0) return -1;
    int64_t wait = deadline_ns - monotonic_ns();
    if (wait <= 0) return 0;
    int64_t ms = (wait + NS_PER_MS - 1) / NS_PER_MS;
    return ms > 60000 ? 60000 : (int)ms;
}

static int64_t earliest(int64_t a, int64_t b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    return a < b ? a : b;
}

static void serve_forever(void)
{
    static struct poll_set ps;
    for (;;) {
        rx_process();
        exec_tick();
        proc_tick();
        output_flush();

        ps.count = 0;
        poll_set_add(&ps, signal_fd, POLLIN, POLL_SIGNALS);
        int64_t deadline = earliest(exec_next_deadline_ns(), proc_next_deadline_ns());
        if (transport.kind == TRANSPORT_SOCKET && transport.fd < 0) {
            poll_set_add(&ps, transport.listen_fd, POLLIN, POLL_LISTENER);
        } else if (transport.host_connected) {
            short events = (short)((rx.len < RX_CAPACITY ? POLLIN : 0) | (outq.head ? POLLOUT : 0));
            if (events) poll_set_add(&ps, transport.fd, events, POLL_TRANSPORT);
        } else {
            deadline = earliest(deadline, earliest(transport.retry_at_ns, transport.forget_output_at_ns));
        }
        exec_add_poll_fds(&ps);
        proc_add_poll_fds(&ps);
        fs_add_poll_fds(&ps);

        if (poll(ps.fds, ps.count, poll_timeout_ms(deadline)) < 0) {
            if (errno != EINTR) {
                agent_log("poll: %s", strerror(errno));
                usleep(10000);
            }
            continue;
        }
        for (nfds_t i = 0; i < ps.count; i++) {
            short revents = ps.fds[i].revents;
            if (!revents) continue;
            switch ((enum poll_owner)ps.owner[i]) {
            case POLL_SIGNALS: handle_signals(); break;
            case POLL_LISTENER: accept_connection(); break;
            case POLL_FS_WATCH: fs_handle_poll(ps.fds[i].fd, revents); break;
            case POLL_TRANSPORT:
                if (ps.fds[i].fd != transport.fd) break;
                if (revents & (POLLIN | POLLHUP | POLLERR)) {
                    if (rx.len < RX_CAPACITY) transport_read();
                    else transport_lost("hangup");
                }
                break;
            case POLL_PROC_OUTPUT:
            case POLL_PROC_STDIN:
            case POLL_PROC_PIDS: proc_handle_poll((enum poll_owner)ps.owner[i], ps.fds[i].fd, revents); break;
            default: exec_handle_poll((enum poll_owner)ps.owner[i], ps.fds[i].fd, revents); break;
            }
        }
        if (transport.kind == TRANSPORT_VIRTIO_PORT && !transport.host_connected && monotonic_ns() >= transport.retry_at_ns)
            transport_read();
        if (transport.kind == TRANSPORT_VIRTIO_PORT && !transport.host_connected && transport.forget_output_at_ns >= 0 &&
            monotonic_ns() >= transport.forget_output_at_ns) {
            agent_log("host away for %d ms: dropping unsent replies", HOST_GONE_GRACE_MS);
            output_discard_all();
            fs_forget_watches();
            transport.forget_output_at_ns = -1;
        }
    }
}

/* If PID 1 starts with fds 0-2 closed, our own pipes would land there and be clobbered
   by the dup2()s that set up a command's stdio. Before /dev exists a directory fd holds
   the slot; once /dev/null can be opened it replaces those placeholders. */
static void occupy_standard_fds(void)
{
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd <= 2; fd++) {
        struct stat st;
        bool is_open = fstat(fd, &st) == 0;
        if (is_open && !S_ISDIR(st.st_mode)) continue;
        if (null_fd >= 0) {
            if (null_fd != fd) dup2(null_fd, fd);
        } else if (!is_open) {
            int placeholder = open("/", O_RDONLY | O_DIRECTORY);
            if (placeholder > fd) {
                dup2(placeholder, fd);
                close(placeholder);
            }
        }
    }
    if (null_fd > 2) close(null_fd);
}

/* Whatever the agent inherited beyond stdio (only possible in test mode; the kernel
   starts PID 1 with none) must not reach the commands it runs. */
static void keep_inherited_fds_from_commands(void)
{
    const unsigned int close_range_cloexec = 4; /* CLOSE_RANGE_CLOEXEC, Linux 5.11 */
    if (syscall(SYS_close_range, 3u, ~0u, close_range_cloexec) == 0) return;
    for (int fd = 3; fd < 4096; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

static int listen_on_socket(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        fprintf(stderr, "collimate-agent: socket path too long: %s\n", path);
        exit(2);
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        perror("collimate-agent: socket");
        exit(1);
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 8) != 0) {
        fprintf(stderr, "collimate-agent: listen on %s: %s\n", path, strerror(errno));
        exit(1);
    }
    return fd;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: collimate-agent                  (as PID 1: boot the sandbox and serve virtio-serial)\n"
            "       collimate-agent --serve-fd N [--debug] [--home DIR]\n"
            "       collimate-agent --serve-socket PATH [--debug] [--home DIR]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int serve_fd = -1;
    const char *socket_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--serve-fd") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1 << 20) usage();
            serve_fd = (int)v;
        } else if (strcmp(argv[i], "--serve-socket") == 0 && i + 1 < argc) {
            socket_path = argv[++i];
        } else if (strcmp(argv[i], "--debug") == 0) {
            agent_debug = true;
        } else if (strcmp(argv[i], "--home") == 0 && i + 1 < argc && getpid() != 1) {
            fs_home_dir = argv[++i];
        } else if (getpid() != 1) {
            usage();
        }
        /* As PID 1 the kernel passes unrecognised command-line words as arguments; ignore them. */
    }
    agent_test_mode = serve_fd >= 0 || socket_path != NULL;
    if (!agent_test_mode && getpid() != 1) usage();

    occupy_standard_fds();
    keep_inherited_fds_from_commands();
    umask(022);
    /* A vanished host must surface as a write error, not kill PID 1. Children get the
       default disposition back before exec. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t handled;
    sigemptyset(&handled);
    sigaddset(&handled, SIGCHLD);
    sigaddset(&handled, SIGIO);
    sigprocmask(SIG_BLOCK, &handled, NULL);
    signal_fd = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);

    if (agent_test_mode) {
        agent_log_to_fd(2);
        /* Orphans of test commands come back to us, so reaping behaves as it does for PID 1. */
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        base_environment_init(NULL, 0);
        if (socket_path) {
            transport.kind = TRANSPORT_SOCKET;
            transport.listen_fd = listen_on_socket(socket_path);
        } else {
            transport.kind = TRANSPORT_FD;
            transport.fd = serve_fd;
            set_nonblocking_cloexec(serve_fd);
        }
    } else {
        boot_system();
        occupy_standard_fds();
        transport.kind = TRANSPORT_VIRTIO_PORT;
        transport.fd = open_agent_port();
    }

    while (!(rx.buf = malloc(RX_CAPACITY))) {
        /* PID 1 must not exit; memory this early only runs out on an absurdly small VM. */
        agent_log("cannot allocate the receive buffer; retrying");
        sleep(1);
    }
    agent_log("serving (%s)", agent_test_mode ? "test mode" : "virtio-serial");
    serve_forever();
    return 0;
}
