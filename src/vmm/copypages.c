/*
 * collimate-copy-pages MODE PID START LENGTH OFFSET [DEST]: the pages process PID holds privately
 * in its mapping [START, START+LENGTH) of a file mapped at file offset OFFSET (a share=off guest's
 * RAM: the pages it wrote since it mapped its backing file), found through /proc/PID/pagemap
 * (present and not a file page, or swapped). Prints how many there are; then, by MODE:
 *   count     nothing more;
 *   prealloc  allocates DEST's blocks under those pages (fallocate, size kept): a copy into them
 *             later writes into pages that exist, ~half the cost of filling tmpfs holes;
 *   copy      copies them into DEST at the offsets they have in the file (process_vm_readv straight
 *             into one reused buffer, then pwrite: one copy each way, no page that was not written).
 * A copy needs the process stopped (its guest writes no more); count and prealloc do not.
 *
 * collimate-copy-pages image SRC DEST: copies SRC's data extents (SEEK_DATA/SEEK_HOLE) into DEST at
 * the same offsets, in the kernel (sendfile: no copy through a buffer here): a sparse RAM image into a RAM file of the same
 * size that a VMM may map already, so DEST is neither truncated nor written where SRC has holes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096ULL
#define SCAN 16384 /* pagemap entries read at once: 64 MiB of guest memory */
#define BUF_PAGES 2048 /* 8 MiB copied per process_vm_readv */
#define MAX_IOV 1024

enum mode { COUNT, PREALLOC, COPY };

static pid_t pid;
static int dest = -1;
static enum mode mode;
static uint64_t start, offset;
static char *buf;
/* Runs gathered for the next copy: remote iovecs and where each goes in DEST. */
static struct iovec remote[MAX_IOV];
static uint64_t at[MAX_IOV];
static int nruns;
static size_t buffered;

static void die(const char *what) {
  fprintf(stderr, "collimate-copy-pages: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void flush(void) {
  if (nruns == 0) return;
  struct iovec local = { buf, buffered };
  ssize_t got = process_vm_readv(pid, &local, 1, remote, nruns, 0);
  if (got < 0) die("process_vm_readv");
  if ((size_t)got != buffered) {
    errno = EIO;
    die("short read of guest memory");
  }
  size_t from = 0;
  for (int i = 0; i < nruns; i++) {
    for (size_t done = 0; done < remote[i].iov_len;) {
      ssize_t n = pwrite(dest, buf + from + done, remote[i].iov_len - done, (off_t)(at[i] + done));
      if (n <= 0) die("write");
      done += (size_t)n;
    }
    from += remote[i].iov_len;
  }
  nruns = 0;
  buffered = 0;
}

/* Pages [first, first+count) of the mapping are private. */
static void take(uint64_t first, uint64_t count) {
  uint64_t file_at = offset + first * PAGE;
  if (mode == PREALLOC) {
    if (fallocate(dest, FALLOC_FL_KEEP_SIZE, (off_t)file_at, (off_t)(count * PAGE)) != 0) die("fallocate");
    return;
  }
  if (mode != COPY) return;
  while (count > 0) {
    uint64_t room = BUF_PAGES - buffered / PAGE;
    if (room == 0 || nruns == MAX_IOV) {
      flush();
      continue;
    }
    uint64_t n = count < room ? count : room;
    remote[nruns].iov_base = (void *)(uintptr_t)(start + first * PAGE);
    remote[nruns].iov_len = n * PAGE;
    at[nruns] = file_at;
    nruns++;
    buffered += n * PAGE;
    first += n;
    file_at += n * PAGE;
    count -= n;
  }
}

static uint64_t parse(const char *s, const char *what) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || *end || end == s) {
    fprintf(stderr, "collimate-copy-pages: bad %s: %s\n", what, s);
    exit(2);
  }
  return v;
}

/* Copies SRC's data extents into DEST at the same offsets. */
static int copy_image(const char *src_path, const char *dest_path) {
  int src = open(src_path, O_RDONLY | O_CLOEXEC);
  if (src < 0) die(src_path);
  dest = open(dest_path, O_WRONLY | O_CLOEXEC);
  if (dest < 0) die(dest_path);
  off_t end = lseek(src, 0, SEEK_END), pos = 0;
  unsigned long long copied = 0;
  while (pos < end) {
    off_t data = lseek(src, pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break; /* only a hole from here to the end */
    off_t hole = data < 0 ? -1 : lseek(src, data, SEEK_HOLE);
    if (data < 0 || hole < 0) die("seek");
    if (lseek(dest, data, SEEK_SET) != data) die("seek");
    for (off_t in = data; in < hole;) {
      ssize_t n = sendfile(dest, src, &in, (size_t)(hole - in));
      if (n < 0) die("sendfile");
      if (n == 0) break; /* SRC shrank under us */
      copied += (unsigned long long)n;
    }
    pos = hole;
  }
  printf("%llu\n", copied);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "image") == 0) return copy_image(argv[2], argv[3]);
  if (argc < 6 || argc > 7) {
    fprintf(stderr, "usage: collimate-copy-pages count|prealloc|copy PID START LENGTH OFFSET [DEST]\n       collimate-copy-pages image SRC DEST\n");
    return 2;
  }
  if (strcmp(argv[1], "count") == 0) mode = COUNT;
  else if (strcmp(argv[1], "prealloc") == 0) mode = PREALLOC;
  else if (strcmp(argv[1], "copy") == 0) mode = COPY;
  else {
    fprintf(stderr, "collimate-copy-pages: unknown mode %s\n", argv[1]);
    return 2;
  }
  pid = (pid_t)parse(argv[2], "pid");
  start = parse(argv[3], "start");
  uint64_t length = parse(argv[4], "length");
  offset = parse(argv[5], "offset");
  if (start % PAGE || length % PAGE || offset % PAGE) {
    fprintf(stderr, "collimate-copy-pages: start, length and offset must be page-aligned\n");
    return 2;
  }
  if (mode != COUNT) {
    if (argc != 7) {
      fprintf(stderr, "collimate-copy-pages: %s needs DEST\n", argv[1]);
      return 2;
    }
    dest = open(argv[6], O_RDWR | O_CLOEXEC);
    if (dest < 0) die(argv[6]);
  }
  if (mode == COPY && !(buf = malloc(BUF_PAGES * PAGE))) die("malloc");
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/pagemap", (int)pid);
  int pm = open(path, O_RDONLY | O_CLOEXEC);
  if (pm < 0) die(path);
  static uint64_t entries[SCAN];
  uint64_t total = length / PAGE, pages = 0, run_first = 0, run_len = 0;
  for (uint64_t base = 0; base < total; base += SCAN) {
    uint64_t n = total - base < SCAN ? total - base : SCAN;
    ssize_t got = pread(pm, entries, n * 8, (off_t)((start / PAGE + base) * 8));
    if (got != (ssize_t)(n * 8)) {
      if (got >= 0) errno = EIO;
      die("pagemap");
    }
    for (uint64_t i = 0; i < n; i++) {
      uint64_t e = entries[i];
      int present = (e >> 63) & 1, swapped = (e >> 62) & 1, file = (e >> 61) & 1;
      if (!((present && !file) || swapped)) continue;
      uint64_t page = base + i;
      pages++;
      if (run_len && run_first + run_len == page) {
        run_len++;
        continue;
      }
      if (run_len) take(run_first, run_len);
      run_first = page;
      run_len = 1;
    }
  }
  if (run_len) take(run_first, run_len);
  flush();
  printf("%llu\n", (unsigned long long)pages);
  return 0;
}
