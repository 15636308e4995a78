/*
 * libcollimate-ramro.so: LD_PRELOADed into a confined QEMU whose guest RAM is a shared checkpoint
 * file mapped copy-on-write (memory-backend-file,share=off).
 *
 * QEMU 7.2 opens a memory-backend-file O_RDWR even for share=off (MAP_PRIVATE), so an unprivileged
 * QEMU would need write permission on the template's RAM file — which every sandbox of that
 * template, of every tenant, maps. A QEMU that escaped its guest could then write() into the file
 * and change what all of them read. MAP_PRIVATE with PROT_WRITE needs only a read-only descriptor,
 * so for the one path named by COLLIMATE_RAM_RO this library turns that O_RDWR into O_RDONLY; the
 * file stays root-owned 0644. QEMU 8.2 does the same itself (it falls back to O_RDONLY for
 * share=off when O_RDWR is refused); with it this library is unnecessary.
 *
 * A VMM waiting in a fork pool (forkReceivers.ts) also gets COLLIMATE_REMAP_FD, a socket to the
 * server, and COLLIMATE_REMAP_DIR, one or two directories of its view separated by ':' (one on the
 * RAM file system, one on the home's disk: the server links the file into the one on its file
 * system). A thread started here waits on the socket for one line, `remap NAME`, and maps NAME (a
 * fork point's RAM file or a suspended sandbox's RAM image, linked into the first of those
 * directories that has it) copy-on-write over the guest RAM mapping, in place (MAP_FIXED, same
 * address and length): the VMM, spawned ahead of the fork, then restores the fork point as if it had
 * been started on it. It answers `ok` or `error ERRNO STEP`, and exits. Nothing else is read from
 * the socket; the guest has not run in this process yet, so no vCPU touches the mapping meanwhile.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);

static const char *ro_path;
static open_fn real_open, real_open64;
static openat_fn real_openat, real_openat64;
static open2_fn real_open_2, real_open64_2;

static void *remap_thread(void *arg);

__attribute__((constructor)) static void init(void) {
  ro_path = getenv("COLLIMATE_RAM_RO");
  const char *fd = getenv("COLLIMATE_REMAP_FD");
  if (fd && *fd && ro_path && *ro_path) {
    pthread_t t;
    if (pthread_create(&t, NULL, remap_thread, (void *)(long)atoi(fd)) == 0) pthread_detach(t);
  }
}

static int needs_mode(int flags) { return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE; }

static int adjust(const char *path, int flags) {
  if (ro_path && *ro_path && path && (flags & O_ACCMODE) == O_RDWR && !needs_mode(flags) && strcmp(path, ro_path) == 0)
    return (flags & ~O_ACCMODE) | O_RDONLY;
  return flags;
}

/* Resolved lazily: other libraries' constructors may open files before ours runs. */
#define RESOLVE(var, type, name) \
  if (!var) var = (type)dlsym(RTLD_NEXT, name)
#define MODE_ARG                       \
  mode_t mode = 0;                     \
  if (needs_mode(flags)) {             \
    va_list ap;                        \
    va_start(ap, flags);               \
    mode = va_arg(ap, mode_t);         \
    va_end(ap);                        \
  }

int open(const char *path, int flags, ...) {
  MODE_ARG
  RESOLVE(real_open, open_fn, "open");
  return real_open(path, adjust(path, flags), mode);
}

int open64(const char *path, int flags, ...) {
  MODE_ARG
  RESOLVE(real_open64, open_fn, "open64");
  return real_open64(path, adjust(path, flags), mode);
}

int openat(int dir, const char *path, int flags, ...) {
  MODE_ARG
  RESOLVE(real_openat, openat_fn, "openat");
  return real_openat(dir, path, adjust(path, flags), mode);
}

int openat64(int dir, const char *path, int flags, ...) {
  MODE_ARG
  RESOLVE(real_openat64, openat_fn, "openat64");
  return real_openat64(dir, path, adjust(path, flags), mode);
}

int __open_2(const char *path, int flags) {
  RESOLVE(real_open_2, open2_fn, "__open_2");
  return real_open_2(path, adjust(path, flags));
}

int __open64_2(const char *path, int flags) {
  RESOLVE(real_open64_2, open2_fn, "__open64_2");
  return real_open64_2(path, adjust(path, flags));
}

/* ---- remapping the guest RAM onto a fork point ------------------------------------------------ */

/* The largest mapping of the file with inode `ino` on device `dev` in this process. */
static int find_mapping(dev_t dev, ino_t ino, unsigned long *start, unsigned long *len, unsigned long long *off) {
  FILE *maps = fopen("/proc/self/maps", "re");
  if (!maps) return -1;
  char line[4096];
  int found = -1;
  *len = 0;
  while (fgets(line, sizeof line, maps)) {
    unsigned long a, b, maj, min, inode;
    unsigned long long o;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s %llx %lx:%lx %lu", &a, &b, perms, &o, &maj, &min, &inode) != 7) continue;
    if (inode != (unsigned long)ino || makedev(maj, min) != dev || b - a <= *len) continue;
    *start = a;
    *len = b - a;
    *off = o;
    found = 0;
  }
  fclose(maps);
  return found;
}

static void reply(int sock, const char *msg) {
  ssize_t n = write(sock, msg, strlen(msg));
  (void)n;
}

static void *remap_thread(void *arg) {
  int sock = (int)(long)arg;
  const char *dir = getenv("COLLIMATE_REMAP_DIR");
  char buf[4096], msg[256], path[4096];
  size_t got = 0;
  while (got < sizeof buf - 1) {
    ssize_t n = read(sock, buf + got, sizeof buf - 1 - got);
    if (n <= 0) { close(sock); return NULL; }
    got += (size_t)n;
    if (memchr(buf, '\n', got)) break;
  }
  buf[got] = '\0';
  char *nl = strchr(buf, '\n');
  const char *step = "request";
  int err = EINVAL;
  if (!nl || strncmp(buf, "remap ", 6) != 0 || !dir || !*dir) goto fail;
  *nl = '\0';
  const char *name = buf + 6;
  /* One plain name inside a remap directory: no slashes, no dot names. */
  if (!*name || strchr(name, '/') || name[0] == '.') goto fail;
  struct stat ram;
  step = "stat";
  if (stat(ro_path, &ram) != 0) { err = errno; goto fail; }
  unsigned long start = 0, len = 0;
  unsigned long long off = 0;
  step = "find";
  if (find_mapping(ram.st_dev, ram.st_ino, &start, &len, &off) != 0) { err = ENOENT; goto fail; }
  step = "open";
  int fd = -1;
  err = ENOENT;
  for (const char *d = dir; fd < 0 && *d;) {
    const char *end = strchr(d, ':');
    size_t dlen = end ? (size_t)(end - d) : strlen(d);
    if ((size_t)snprintf(path, sizeof path, "%.*s/%s", (int)dlen, d, name) >= sizeof path) { err = ENAMETOOLONG; goto fail; }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno != ENOENT) { err = errno; goto fail; }
    d = end ? end + 1 : d + dlen;
  }
  if (fd < 0) goto fail;
  struct stat st;
  step = "size";
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (unsigned long long)st.st_size < off + len) { err = EINVAL; close(fd); goto fail; }
  step = "mmap";
  void *p = mmap((void *)start, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd, (off_t)off);
  if (p == MAP_FAILED) { err = errno; close(fd); goto fail; }
  close(fd);
  reply(sock, "ok\n");
  close(sock);
  return NULL;
fail:
  snprintf(msg, sizeof msg, "error %d %s\n", err, step);
  reply(sock, msg);
  close(sock);
  return NULL;
}
