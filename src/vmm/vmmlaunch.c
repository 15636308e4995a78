/*
 * collimate-vmm-launch: becomes a confined QEMU in one process.
 *
 *   collimate-vmm-launch [steps] -- qemu-system-x86_64 ARGS...
 *
 * Run as root by the server (jail.ts builds the steps from a ViewPlan). In order: join the network
 * namespace (--netns) and turn transparent huge pages off for the process (--no-thp; both may come
 * before anything else), enter a new mount namespace with private propagation, then the steps in the
 * order given (join cgroups, mount the root tmpfs and enter it, make directories, files and symlinks,
 * bind the paths the VMM may see, mount /proc), pivot into the new root, mount it read-only, drop to
 * the VMM's uid and gid with no capabilities (bounding, inheritable, ambient) and no_new_privs, and
 * exec QEMU. It does what a shell script of `mount`, `pivot_root` and `setpriv` commands did, with
 * system calls instead of ~25 programs (~70 ms of CPU per VMM start, more under load).
 *
 * Any failed step ends the launch: its name, argument and errno go to stderr (the VMM's log) and
 * the exit status is 126. Nothing here parses input from the VMM or the guest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_GROUPS 16

static void die(const char *step, const char *arg) {
  fprintf(stderr, "collimate-vmm-launch: %s %s: %s\n", step, arg ? arg : "", strerror(errno));
  exit(126);
}

static void usage(const char *why) {
  fprintf(stderr, "collimate-vmm-launch: %s\n", why);
  exit(126);
}

static unsigned long number(const char *s, const char *what) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *s == '\0' || *end != '\0') usage(what);
  return v;
}

/* mkdir -p, relative to the current directory. */
static void mkdirs(const char *path) {
  char buf[4096];
  if (strlen(path) >= sizeof buf) usage("path too long");
  strcpy(buf, path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) die("mkdir", buf);
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) die("mkdir", buf);
}

static void write_pid(const char *procs) {
  int fd = open(procs, O_WRONLY | O_CLOEXEC);
  if (fd < 0) die("cgroup", procs);
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%d\n", getpid());
  if (write(fd, pid, (size_t)n) != n) die("cgroup", procs);
  close(fd);
}

/* A bind mount; `mode` adds flags by a remount of the bind: ro = read-only, no setuid, no devices;
 * rw = writable, no setuid, no devices, no exec; dev = as the source (device nodes). */
static void bind(const char *src, const char *dst, const char *mode) {
  if (mount(src, dst, NULL, MS_BIND, NULL) != 0) die("bind", dst);
  unsigned long flags;
  if (strcmp(mode, "ro") == 0) flags = MS_RDONLY | MS_NOSUID | MS_NODEV;
  else if (strcmp(mode, "rw") == 0) flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  else if (strcmp(mode, "dev") == 0) return;
  else usage("--bind mode must be ro, rw or dev");
  if (mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | flags, NULL) != 0) die("remount", dst);
}

static void drop_privileges(uid_t uid, gid_t gid, gid_t *groups, size_t ngroups) {
  if (uid == 0 || gid == 0) usage("refusing to run a VMM as root");
  /* The bounding set can only shrink while we still hold CAP_SETPCAP. */
  for (int cap = 0; cap <= 63; cap++) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break; /* past the kernel's last capability */
      die("drop bounding capability", NULL);
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) die("clear ambient capabilities", NULL);
  if (setgroups(ngroups, groups) != 0) die("setgroups", NULL);
  if (setresgid(gid, gid, gid) != 0) die("setresgid", NULL);
  if (setresuid(uid, uid, uid) != 0) die("setresuid", NULL);
  /* Leaving uid 0 cleared the permitted and effective sets; the inheritable set stays unless cleared. */
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capset, &hdr, data) != 0) die("capset", NULL);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs", NULL);
  if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid) usage("uid or gid did not change");
}

int main(int argc, char **argv) {
  long uid = -1, gid = -1;
  gid_t groups[MAX_GROUPS];
  size_t ngroups = 0;
  int entered_root = 0, mount_ns = 0;
  int i = 1;
  for (; i < argc; i++) {
    const char *op = argv[i];
    if (strcmp(op, "--") == 0) break;
#define ARGS(n) do { if (i + (n) >= argc) usage(op); } while (0)
    if (strcmp(op, "--no-thp") == 0) {
      /* Kept across execve: QEMU's own madvise(MADV_HUGEPAGE) calls then change nothing. */
      if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) die("thp", "disable");
      continue;
    }
    if (strcmp(op, "--netns") == 0) {
      ARGS(1);
      if (mount_ns) usage("--netns must come first");
      int fd = open(argv[++i], O_RDONLY | O_CLOEXEC);
      if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) die("netns", argv[i]);
      close(fd);
      continue;
    }
    if (!mount_ns) {
      if (unshare(CLONE_NEWNS) != 0) die("unshare", "mount namespace");
      if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("propagation", "private");
      mount_ns = 1;
    }
    if (strcmp(op, "--cgroup") == 0) {
      ARGS(1);
      write_pid(argv[++i]);
    } else if (strcmp(op, "--root") == 0) {
      ARGS(1);
      const char *root = argv[++i];
      if (mount("collimate-vm", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096") != 0) die("mount tmpfs", root);
      if (chdir(root) != 0) die("chdir", root);
      entered_root = 1;
    } else if (!entered_root) {
      usage("--root must come before the view's steps");
    } else if (strcmp(op, "--mkdir") == 0) {
      ARGS(1);
      mkdirs(argv[++i]);
    } else if (strcmp(op, "--touch") == 0) {
      ARGS(1);
      int fd = open(argv[++i], O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) die("touch", argv[i]);
      close(fd);
    } else if (strcmp(op, "--symlink") == 0) {
      ARGS(2);
      if (symlink(argv[i + 1], argv[i + 2]) != 0) die("symlink", argv[i + 2]);
      i += 2;
    } else if (strcmp(op, "--bind") == 0) {
      ARGS(3);
      bind(argv[i + 1], argv[i + 2], argv[i + 3]);
      i += 3;
    } else if (strcmp(op, "--proc") == 0) {
      ARGS(1);
      const char *how = argv[++i];
      if (strcmp(how, "private") == 0) {
        if (mount("proc", "./proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") != 0) die("mount", "/proc");
      } else if (strcmp(how, "bind") == 0) {
        if (mount("/proc", "./proc", NULL, MS_BIND | MS_REC, NULL) != 0) die("bind", "/proc");
      } else usage("--proc must be private or bind");
    } else if (strcmp(op, "--env") == 0) {
      ARGS(1);
      if (putenv(argv[++i]) != 0) die("env", argv[i]);
    } else if (strcmp(op, "--uid") == 0) {
      ARGS(1);
      uid = (long)number(argv[++i], "bad --uid");
    } else if (strcmp(op, "--gid") == 0) {
      ARGS(1);
      gid = (long)number(argv[++i], "bad --gid");
    } else if (strcmp(op, "--group") == 0) {
      ARGS(1);
      if (ngroups == MAX_GROUPS) usage("too many groups");
      groups[ngroups++] = (gid_t)number(argv[++i], "bad --group");
    } else {
      usage(op);
    }
#undef ARGS
  }
  if (i >= argc - 1) usage("nothing to run (expected -- PROGRAM ARGS)");
  if (!entered_root) usage("no --root");
  if (uid < 0 || gid < 0) usage("no --uid or --gid");
  if (syscall(SYS_pivot_root, ".", "./.old") != 0) die("pivot_root", ".");
  if (umount2("/.old", MNT_DETACH) != 0) die("umount", "/.old");
  if (rmdir("/.old") != 0) die("rmdir", "/.old");
  if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0) die("remount", "/");
  if (chdir("/") != 0) die("chdir", "/");
  drop_privileges((uid_t)uid, (gid_t)gid, groups, ngroups);
  execvp(argv[i + 1], &argv[i + 1]);
  die("exec", argv[i + 1]);
  return 126;
}
