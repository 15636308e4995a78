/*
 * libcollimate-seed.so: deterministic user-space randomness for one exec.
 *
 * The guest agent preloads this (LD_PRELOAD) into an exec's process tree with
 * COLLIMATE_SEED=<decimal u64>. Every way a dynamically linked glibc program
 * usually asks the system for randomness is answered from a ChaCha20 stream
 * keyed by that seed, so the same exec with the same seed in the same sandbox
 * state sees the same bytes. The kernel CRNG itself is untouched: anything that
 * bypasses libc (static binaries, inline `syscall`, RDRAND) still gets real
 * randomness. docs/determinism.md lists exactly what is and is not covered.
 *
 * Without COLLIMATE_SEED every interposer forwards to libc unchanged.
 *
 * Process keying ("lineage"): each process has its own 32-byte key, so a forked
 * child never replays its parent's stream, yet every key is a pure function of
 * the seed and the process's position in the tree:
 *   root  = PRF(const, ROOT, seed)
 *   fork  : child key = PRF(parent key, FORK, n)   n = parent's n-th child
 *   spawn : same, for posix_spawn/system/popen, which never run atfork handlers
 *   exec  : new image key = PRF(inherited key, EXEC, 0)
 * The inherited key travels in COLLIMATE_SEED_LINEAGE (64 hex digits). That
 * variable lives in a static buffer we putenv() once, so an atfork child handler
 * can update it in place without malloc or locks; exec interposers additionally
 * patch custom envp arrays that carry a stale copy (libuv, Python env=...).
 *
 * Build: gcc -shared -fPIC -O2 -o libcollimate-seed.so seedrandom.c -ldl -pthread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#include <dirent.h>

#define EXPORT __attribute__((visibility("default")))
#define LINEAGE_VAR "COLLIMATE_SEED_LINEAGE"
enum { TAG_ROOT = 1, TAG_FORK = 2, TAG_EXEC = 3, TAG_NODE = 4 };
#define NODE_ARG_VAR "COLLIMATE_SEED_NODE_ARG"
/* Word 15 of every block; word 14 is 0 for the stream, a TAG for derivations,
 * so key derivation blocks can never coincide with stream blocks. */
#define DOMAIN 0x636f6c6cu /* "coll" */

/* ---------------------------------------------------------------- ChaCha20 */

#define ROTL(a, b) (((a) << (b)) | ((a) >> (32 - (b))))
#define QR(a, b, c, d) \
    (a += b, d ^= a, d = ROTL(d, 16), c += d, b ^= c, b = ROTL(b, 12), \
     a += b, d ^= a, d = ROTL(d, 8), c += d, b ^= c, b = ROTL(b, 7))

static void chacha20_block(const uint8_t key[32], uint32_t w12, uint32_t w13, uint32_t w14,
                           uint8_t out[64])
{
    uint32_t in[16] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574};
    for (int i = 0; i < 8; i++) memcpy(&in[4 + i], key + 4 * i, 4); /* x86: little-endian */
    in[12] = w12, in[13] = w13, in[14] = w14, in[15] = DOMAIN;
    uint32_t x[16];
    memcpy(x, in, sizeof x);
    for (int i = 0; i < 10; i++) {
        QR(x[0], x[4], x[8], x[12]); QR(x[1], x[5], x[9], x[13]);
        QR(x[2], x[6], x[10], x[14]); QR(x[3], x[7], x[11], x[15]);
        QR(x[0], x[5], x[10], x[15]); QR(x[1], x[6], x[11], x[12]);
        QR(x[2], x[7], x[8], x[13]); QR(x[3], x[4], x[9], x[14]);
    }
    for (int i = 0; i < 16; i++) x[i] += in[i];
    memcpy(out, x, 64);
}

/* key' = first half of a block that no stream position can produce. */
static void derive(uint8_t key[32], uint32_t tag, uint64_t n)
{
    uint8_t block[64];
    chacha20_block(key, (uint32_t)n, (uint32_t)(n >> 32), tag, block);
    memcpy(key, block, 32);
}

/* ------------------------------------------------------------------- state */

static int enabled;              /* COLLIMATE_SEED was set and parsed */
static uint8_t key[32];          /* this process's key */
static uint64_t block_no;        /* next stream block */
static uint8_t buf[64];          /* current block */
static unsigned buf_used = 64;   /* bytes of buf already handed out */
static uint64_t children;        /* processes created so far (fork index source) */
static uint64_t pending_child;   /* index chosen in the prepare handler */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;       /* stream + counter */
static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER; /* lineage_env */
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* "COLLIMATE_SEED_LINEAGE=" + 64 hex + NUL; putenv()ed, rewritten in place. */
static char lineage_env[sizeof LINEAGE_VAR + 65];

/* fd kinds: fds of /dev/urandom and /dev/random we serve from the stream.
 * fds at or above FD_TRACK_MAX are left alone (real randomness). */
#define FD_TRACK_MAX 4096
static unsigned char tracked[FD_TRACK_MAX];

static void stream(void *out, size_t n)
{
    uint8_t *p = out;
    pthread_mutex_lock(&lock);
    while (n) {
        if (buf_used == 64) {
            chacha20_block(key, (uint32_t)block_no, (uint32_t)(block_no >> 32), 0, buf);
            block_no++, buf_used = 0;
        }
        size_t take = 64 - buf_used < n ? 64 - buf_used : n;
        memcpy(p, buf + buf_used, take);
        buf_used += take, p += take, n -= take;
    }
    pthread_mutex_unlock(&lock);
}

static void write_lineage(const uint8_t k[32])
{
    static const char hex[] = "0123456789abcdef";
    char *h = lineage_env + sizeof LINEAGE_VAR; /* just past the '=' */
    for (int i = 0; i < 32; i++) h[2 * i] = hex[k[i] >> 4], h[2 * i + 1] = hex[k[i] & 15];
}

/* Become a new process in the tree: fresh key, stream restarts at block 0. */
static void rekey(uint32_t tag, uint64_t n)
{
    derive(key, tag, n);
    block_no = 0, buf_used = 64, children = 0;
    write_lineage(key);
}

/* Index of the next process we create (fork or spawn); caller holds `lock`. */
static uint64_t next_child(void) { return ++children; }

/* atfork: pick the index in the parent under the lock (so two threads forking
 * at once get distinct indices), rekey the child. Only memory writes in the
 * child handler: it must be safe even in a multithreaded parent. */
static void atfork_prepare(void) { pthread_mutex_lock(&lock); pending_child = next_child(); }
static void atfork_parent(void) { pthread_mutex_unlock(&lock); }
static void atfork_child(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_mutex_init(&spawn_lock, NULL);
    rekey(TAG_FORK, pending_child);
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void track_inherited_fds(void);

static void init(void)
{
    const char *s = getenv("COLLIMATE_SEED");
    if (!s || !*s) return;
    char *end;
    errno = 0;
    unsigned long long seed = strtoull(s, &end, 10);
    if (errno || *end || *s == '-') return; /* malformed: stay transparent */

    /* A lineage from an ancestor wins over the seed: we are a descendant. */
    const char *l = getenv(LINEAGE_VAR);
    int have_lineage = l && strlen(l) == 64;
    for (int i = 0; have_lineage && i < 32; i++) {
        int hi = hexval(l[2 * i]), lo = hexval(l[2 * i + 1]);
        if (hi < 0 || lo < 0) have_lineage = 0; else key[i] = (uint8_t)(hi << 4 | lo);
    }
    memcpy(lineage_env, LINEAGE_VAR "=", sizeof LINEAGE_VAR);
    if (have_lineage) {
        rekey(TAG_EXEC, 0);
    } else {
        memcpy(key, "collimate/seed/v1/chacha20/root", 32);
        rekey(TAG_ROOT, seed);
    }
    putenv(lineage_env);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    track_inherited_fds();
    enabled = 1;
}

static int on(void) { pthread_once(&once, init); return enabled; }

__attribute__((constructor)) static void ctor(void) { on(); }

#define REAL(ret, name, args) \
    static ret(*real_##name) args; \
    if (!real_##name) real_##name = (ret(*) args)dlsym(RTLD_NEXT, #name)

/* ------------------------------------------------- getrandom & friends */

EXPORT ssize_t getrandom(void *b, size_t n, unsigned flags)
{
    if (!on()) { REAL(ssize_t, getrandom, (void *, size_t, unsigned)); return real_getrandom(b, n, flags); }
    if (flags & ~(GRND_NONBLOCK | GRND_RANDOM | 0x4 /* GRND_INSECURE */)) { errno = EINVAL; return -1; }
    if (n > 33554431) n = 33554431; /* the kernel's per-call cap */
    stream(b, n);
    return (ssize_t)n;
}

EXPORT int getentropy(void *b, size_t n)
{
    if (!on()) { REAL(int, getentropy, (void *, size_t)); return real_getentropy(b, n); }
    if (n > 256) { errno = EIO; return -1; }
    stream(b, n);
    return 0;
}

/* syscall() is variadic; every x86-64/aarch64 syscall takes at most six
 * register-sized arguments, so forwarding six longs is exact. */
EXPORT long syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_getrandom && on()) return getrandom((void *)a[0], (size_t)a[1], (unsigned)a[2]);
    REAL(long, syscall, (long, ...));
    return real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* glibc 2.36 arc4random calls getrandom internally (not via the PLT). */
EXPORT uint32_t arc4random(void)
{
    uint32_t v;
    if (!on()) { REAL(uint32_t, arc4random, (void)); return real_arc4random(); }
    stream(&v, sizeof v);
    return v;
}
EXPORT void arc4random_buf(void *b, size_t n)
{
    if (!on()) { REAL(void, arc4random_buf, (void *, size_t)); real_arc4random_buf(b, n); return; }
    stream(b, n);
}
EXPORT uint32_t arc4random_uniform(uint32_t upper)
{
    if (!on()) { REAL(uint32_t, arc4random_uniform, (uint32_t)); return real_arc4random_uniform(upper); }
    if (upper < 2) return 0;
    uint32_t min = -upper % upper, v; /* reject the biased low range */
    do stream(&v, sizeof v); while (v < min);
    return v % upper;
}

/* ------------------------------------------------------------ device fds */

/* Character devices 1:8 (/dev/random) and 1:9 (/dev/urandom), whatever path
 * or symlink reached them. */
static int is_random_dev(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 &&
           (minor(st.st_rdev) == 8 || minor(st.st_rdev) == 9);
}
static int is_tracked(int fd) { return enabled && fd >= 0 && fd < FD_TRACK_MAX && tracked[fd]; }
static void set_tracked(int fd, int v) { if (fd >= 0 && fd < FD_TRACK_MAX) tracked[fd] = (unsigned char)v; }

/* Called after every successful open: cheap path filter first so ordinary
 * opens cost no extra syscall. */
static int after_open(const char *path, int fd)
{
    if (fd >= 0 && enabled) set_tracked(fd, path && strstr(path, "random") && is_random_dev(fd));
    return fd;
}

/* fds inherited across exec (`cmd < /dev/urandom`) were opened by an ancestor. */
static void track_inherited_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int self = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd != self && fd < FD_TRACK_MAX) tracked[fd] = (unsigned char)is_random_dev(fd);
    }
    closedir(d);
}

/* /proc/sys/kernel/random/uuid yields a fresh random UUID per open: answer it
 * with a memfd holding a stream-derived v4 UUID, so the fd is real and needs
 * no tracking. Returns -1 (caller opens the real file) if not applicable. */
static int open_uuid(const char *path, int flags)
{
    if (!enabled || !path || strcmp(path, "/proc/sys/kernel/random/uuid") != 0 || (flags & O_ACCMODE) != O_RDONLY)
        return -1;
    int fd = memfd_create("collimate-uuid", (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
    if (fd < 0) return -1;
    uint8_t u[16];
    char text[38];
    stream(u, sizeof u);
    u[6] = (u[6] & 0x0f) | 0x40, u[8] = (u[8] & 0x3f) | 0x80;
    snprintf(text, sizeof text, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    if (pwrite(fd, text, 37, 0) != 37) { close(fd); return -1; }
    return fd;
}

static int open_common(int dirfd, const char *path, int flags, mode_t mode, int at, int large)
{
    REAL(int, open, (const char *, int, ...));
    REAL(int, open64, (const char *, int, ...));
    REAL(int, openat, (int, const char *, int, ...));
    REAL(int, openat64, (int, const char *, int, ...));
    int fd = on() ? open_uuid(path, flags) : -1;
    if (fd >= 0) return fd;
    fd = at ? (large ? real_openat64 : real_openat)(dirfd, path, flags, mode)
            : (large ? real_open64 : real_open)(path, flags, mode);
    return after_open(path, fd);
}
#define MODE_ARG(flags)                                               \
    mode_t mode = 0;                                                  \
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {      \
        va_list ap;                                                   \
        va_start(ap, flags);                                          \
        mode = (mode_t)va_arg(ap, int);                               \
        va_end(ap);                                                   \
    }
EXPORT int open(const char *p, int f, ...) { MODE_ARG(f); return open_common(AT_FDCWD, p, f, mode, 0, 0); }
EXPORT int open64(const char *p, int f, ...) { MODE_ARG(f); return open_common(AT_FDCWD, p, f, mode, 0, 1); }
EXPORT int openat(int d, const char *p, int f, ...) { MODE_ARG(f); return open_common(d, p, f, mode, 1, 0); }
EXPORT int openat64(int d, const char *p, int f, ...) { MODE_ARG(f); return open_common(d, p, f, mode, 1, 1); }

/* _FORTIFY_SOURCE variants (no mode argument). */
EXPORT int __open_2(const char *p, int f) { return open(p, f); }
EXPORT int __open64_2(const char *p, int f) { return open(p, f); }
EXPORT int __openat_2(int d, const char *p, int f) { return openat(d, p, f); }
EXPORT int __openat64_2(int d, const char *p, int f) { return openat(d, p, f); }

EXPORT ssize_t read(int fd, void *b, size_t n)
{
    if (is_tracked(fd)) { stream(b, n); return (ssize_t)n; }
    REAL(ssize_t, read, (int, void *, size_t));
    return real_read(fd, b, n);
}
EXPORT ssize_t __read_chk(int fd, void *b, size_t n, size_t buflen)
{
    if (n > buflen) abort(); /* what glibc's __chk_fail amounts to */
    return read(fd, b, n);
}
EXPORT ssize_t pread(int fd, void *b, size_t n, off_t off)
{
    if (is_tracked(fd)) { stream(b, n); return (ssize_t)n; }
    REAL(ssize_t, pread, (int, void *, size_t, off_t));
    return real_pread(fd, b, n, off);
}
EXPORT ssize_t pread64(int fd, void *b, size_t n, off_t off) { return pread(fd, b, n, off); }

static ssize_t stream_iov(const struct iovec *iov, int cnt)
{
    ssize_t total = 0;
    for (int i = 0; i < cnt; i++) stream(iov[i].iov_base, iov[i].iov_len), total += (ssize_t)iov[i].iov_len;
    return total;
}
EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
    if (is_tracked(fd)) return stream_iov(iov, cnt);
    REAL(ssize_t, readv, (int, const struct iovec *, int));
    return real_readv(fd, iov, cnt);
}
EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    if (is_tracked(fd)) return stream_iov(iov, cnt);
    REAL(ssize_t, preadv, (int, const struct iovec *, int, off_t));
    return real_preadv(fd, iov, cnt, off);
}
EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) { return preadv(fd, iov, cnt, off); }

/* Keep the table in step with the fd namespace, or a reused fd number would be
 * served random bytes. */
EXPORT int close(int fd)
{
    REAL(int, close, (int));
    set_tracked(fd, 0);
    return real_close(fd);
}
EXPORT int close_range(unsigned lo, unsigned hi, int flags)
{
    REAL(int, close_range, (unsigned, unsigned, int));
    int r = real_close_range(lo, hi, flags);
    if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC))
        for (unsigned fd = lo; fd <= hi && fd < FD_TRACK_MAX; fd++) tracked[fd] = 0;
    return r;
}
EXPORT int dup(int fd)
{
    REAL(int, dup, (int));
    int r = real_dup(fd);
    if (r >= 0) set_tracked(r, is_tracked(fd));
    return r;
}
EXPORT int dup2(int fd, int to)
{
    REAL(int, dup2, (int, int));
    int r = real_dup2(fd, to);
    if (r >= 0) set_tracked(r, is_tracked(fd));
    return r;
}
EXPORT int dup3(int fd, int to, int flags)
{
    REAL(int, dup3, (int, int, int));
    int r = real_dup3(fd, to, flags);
    if (r >= 0) set_tracked(r, is_tracked(fd));
    return r;
}
EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long); /* every fcntl argument fits a register */
    va_end(ap);
    REAL(int, fcntl, (int, int, ...));
    int r = real_fcntl(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) set_tracked(r, is_tracked(fd));
    return r;
}
EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return fcntl(fd, cmd, arg);
}

/* ------------------------------------------------------------------ stdio */

/* glibc's fread on an fopen()ed FILE calls the internal __read, not read():
 * give tracked devices a cookie stream instead. The fd stays real and owned. */
static ssize_t cookie_read(void *c, char *b, size_t n) { (void)c; stream(b, n); return (ssize_t)n; }
static int cookie_close(void *c) { return close((int)(intptr_t)c); }
static FILE *cookie_file(int fd, const char *mode)
{
    cookie_io_functions_t io = {.read = cookie_read, .close = cookie_close};
    FILE *f = fopencookie((void *)(intptr_t)fd, mode, io);
    if (!f) close(fd);
    return f;
}
static int fopen_flags(const char *mode)
{
    int f = strchr(mode, '+') ? O_RDWR : *mode == 'r' ? O_RDONLY : O_WRONLY;
    return f | (strchr(mode, 'e') ? O_CLOEXEC : 0);
}

#define FOPEN_LIKE(name)                                                              \
    EXPORT FILE *name(const char *path, const char *mode)                             \
    {                                                                                 \
        REAL(FILE *, name, (const char *, const char *));                             \
        if (on() && path && mode && *mode == 'r') {                                   \
            int fd = open_uuid(path, fopen_flags(mode));                              \
            if (fd >= 0) { FILE *f = fdopen(fd, mode); if (!f) close(fd); return f; } \
            if (strstr(path, "random")) {                                             \
                fd = open(path, fopen_flags(mode));                                   \
                if (fd < 0) return NULL;                                              \
                if (is_tracked(fd)) return cookie_file(fd, mode);                     \
                close(fd); /* not a random device after all: use stdio */             \
            }                                                                         \
        }                                                                             \
        return real_##name(path, mode);                                               \
    }
FOPEN_LIKE(fopen)
FOPEN_LIKE(fopen64)

EXPORT FILE *fdopen(int fd, const char *mode)
{
    REAL(FILE *, fdopen, (int, const char *));
    if (is_tracked(fd)) {
        cookie_io_functions_t io = {.read = cookie_read, .close = cookie_close};
        return fopencookie((void *)(intptr_t)fd, mode, io);
    }
    return real_fdopen(fd, mode);
}

/* ---------------------------------------------------------- process creation */

/* vfork children share our memory and skip atfork handlers, so they could not
 * get a lineage of their own. fork() is a valid vfork(). */
EXPORT pid_t vfork(void) { return fork(); }

/* Point the env's lineage entry at lineage_env; returns envp itself when it
 * already does, else a copy in `out` (caller-provided, on the stack: this can
 * run in a vfork-like child where malloc is off limits). */
static size_t env_len(char *const *envp) { size_t n = 0; while (envp && envp[n]) n++; return n; }
static char *const *patch_env(char *const *envp, char **out)
{
    size_t n = env_len(envp), j = 0;
    int has_seed = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(envp[i], "COLLIMATE_SEED=", 15) == 0) has_seed = 1;
        if (strncmp(envp[i], LINEAGE_VAR "=", sizeof LINEAGE_VAR) == 0) continue;
        out[j++] = envp[i];
    }
    if (has_seed) out[j++] = lineage_env; /* no seed: the program opted out */
    out[j] = NULL;
    return out;
}
#define PATCHED_ENV(var, envp) \
    char *var##_buf[env_len(envp) + 2]; \
    char *const *var = enabled ? patch_env(envp, var##_buf) : (envp)

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    REAL(int, execve, (const char *, char *const[], char *const[]));
    PATCHED_ENV(env, envp);
    return real_execve(path, argv, env);
}
EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    REAL(int, execvpe, (const char *, char *const[], char *const[]));
    PATCHED_ENV(env, envp);
    return real_execvpe(file, argv, env);
}
extern char **environ;
EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }
EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }
EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    REAL(int, fexecve, (int, char *const[], char *const[]));
    PATCHED_ENV(env, envp);
    return real_fexecve(fd, argv, env);
}

/* execl family: gather the variadic argv on the stack. */
#define ARGV_FROM_VA(argv, arg0, ap, extra)                                 \
    size_t argc = 1;                                                        \
    va_start(ap, arg0);                                                     \
    while (va_arg(ap, char *)) argc++;                                      \
    va_end(ap);                                                             \
    char *argv[argc + 1];                                                   \
    argv[0] = (char *)arg0;                                                 \
    va_start(ap, arg0);                                                     \
    for (size_t i = 1; i <= argc; i++) argv[i] = va_arg(ap, char *);        \
    extra;                                                                  \
    va_end(ap)
EXPORT int execl(const char *path, const char *arg0, ...)
{
    va_list ap;
    ARGV_FROM_VA(argv, arg0, ap, (void)0);
    return execve(path, argv, environ);
}
EXPORT int execlp(const char *file, const char *arg0, ...)
{
    va_list ap;
    ARGV_FROM_VA(argv, arg0, ap, (void)0);
    return execvpe(file, argv, environ);
}
EXPORT int execle(const char *path, const char *arg0, ...)
{
    va_list ap;
    char *const *envp;
    ARGV_FROM_VA(argv, arg0, ap, envp = va_arg(ap, char *const *));
    return execve(path, argv, envp);
}

/* posix_spawn, system and popen create the child with CLONE_VFORK inside glibc,
 * without atfork handlers or our execve. Give the child a lineage by
 * temporarily rekeying lineage_env to the child's key around the call (the
 * kernel copies the environment at the child's execve, before these return). */
static void spawn_begin(void)
{
    pthread_mutex_lock(&spawn_lock); /* lineage_env is shared by all threads */
    pthread_mutex_lock(&lock);
    uint8_t child[32];
    memcpy(child, key, 32);
    derive(child, TAG_FORK, next_child());
    pthread_mutex_unlock(&lock);
    write_lineage(child);
}
static void spawn_end(void)
{
    write_lineage(key);
    pthread_mutex_unlock(&spawn_lock);
}

#define SPAWN_LIKE(name)                                                                       \
    EXPORT int name(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,        \
                    const posix_spawnattr_t *attr, char *const argv[], char *const envp[])     \
    {                                                                                          \
        REAL(int, name, (pid_t *, const char *, const posix_spawn_file_actions_t *,            \
                         const posix_spawnattr_t *, char *const[], char *const[]));            \
        if (!on()) return real_##name(pid, path, fa, attr, argv, envp);                        \
        PATCHED_ENV(env, envp);                                                                \
        spawn_begin();                                                                         \
        int r = real_##name(pid, path, fa, attr, argv, env);                                   \
        spawn_end();                                                                           \
        return r;                                                                              \
    }
SPAWN_LIKE(posix_spawn)
SPAWN_LIKE(posix_spawnp)

EXPORT int system(const char *cmd)
{
    REAL(int, system, (const char *));
    if (!on() || !cmd) return real_system(cmd);
    spawn_begin();
    int r = real_system(cmd);
    spawn_end();
    return r;
}
EXPORT FILE *popen(const char *cmd, const char *mode)
{
    REAL(FILE *, popen, (const char *, const char *));
    if (!on()) return real_popen(cmd, mode);
    spawn_begin();
    FILE *f = real_popen(cmd, mode);
    spawn_end();
    return f;
}

/* ------------------------------------------------------------------ Node.js */

/* Node seeds V8's Math.random from OpenSSL's RAND_bytes, whose DRBG nonce mixes
 * in pid, thread id and CLOCK_REALTIME, so no amount of deterministic entropy
 * makes it reproducible. V8's --random-seed=N overrides that, but Node refuses
 * it in NODE_OPTIONS; so for a node executable we add it to argv before main.
 * The value we add is recorded in NODE_ARG_VAR: a child started with the
 * parent's execArgv (child_process.fork) drops the parent's copy and gets its
 * own, or it would replay the parent's Math.random sequence. */
static int is_node_exe(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    return strcmp(base, "node") == 0 || strcmp(base, "nodejs") == 0;
}

typedef int (*main_fn)(int, char **, char **);
EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init_fn)(void),
                             void (*fini_fn)(void), void (*rtld_fini)(void), void *stack_end)
{
    REAL(int, __libc_start_main, (main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *));
    if (on() && argc >= 1 && is_node_exe()) {
        uint8_t k[32];
        memcpy(k, key, 32);
        derive(k, TAG_NODE, 0);
        uint32_t v;
        memcpy(&v, k, 4);
        static char arg[32];
        snprintf(arg, sizeof arg, "--random-seed=%u", (v & 0x7fffffff) | 1); /* int flag, 0 = random */
        const char *inherited = getenv(NODE_ARG_VAR);
        char **nargv = malloc(sizeof(char *) * ((size_t)argc + 2)); /* lives as long as the process */
        if (nargv) {
            int j = 0;
            nargv[j++] = argv[0];
            nargv[j++] = arg;
            for (int i = 1; i < argc; i++)
                if (!inherited || strcmp(argv[i], inherited) != 0) nargv[j++] = argv[i];
            nargv[j] = NULL;
            setenv(NODE_ARG_VAR, arg, 1);
            return real___libc_start_main(main, j, nargv, init_fn, fini_fn, rtld_fini, stack_end);
        }
    }
    return real___libc_start_main(main, argc, argv, init_fn, fini_fn, rtld_fini, stack_end);
}
