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
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);

static const char *ro_path;
static open_fn real_open, real_open64;
static openat_fn real_openat, real_openat64;
static open2_fn real_open_2, real_open64_2;

__attribute__((constructor)) static void init(void) { ro_path = getenv("COLLIMATE_RAM_RO"); }

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
