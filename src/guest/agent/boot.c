/*
 * Boot as /init, and the privileged half of RESTORED.
 *
 * Boot failures are logged and survived: PID 1 exiting panics the kernel, and an
 * agent that still answers PING from a half-booted guest is far easier to debug
 * than a panic. The kernel headers are not available to musl-gcc, so the few
 * kernel ABI constants we need are spelled out here.
 */
#include "agent.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define MODULE_ORDER_FILE "/lib/modules/collimate.order"
#define MODULE_INIT_COMPRESSED_FILE 4
#define RNDADDENTROPY_IOCTL _IOW('R', 0x03, int[2])
#define RNDRESEEDCRNG_IOCTL _IO('R', 0x07)
#define AGENT_PORT_NAME "collimate.agent"
#define LAYERS_MAX 64
#define KERNEL_ENV_MAX 64
#define DISK_WAIT_NS (10 * NS_PER_SEC)
#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"
#define RUN_DIR "/run/collimate"
#define BOOT_ID_FILE RUN_DIR "/boot_id"
#define SANDBOX_ID_FILE RUN_DIR "/sandbox_id"
#define BOOT_ID_TEXT_LEN 37 /* 36-character UUID and a newline, like the kernel's */

static char *kernel_env[KERNEL_ENV_MAX];

static int install_boot_id(char *why, size_t why_cap);

/* The seed library, read from the initramfs before the switch to the sandbox root
   (after it the initramfs is unreachable) and written to /run once that exists. */
static struct {
    uint8_t *data;
    size_t len;
} seed_library;

/* Held open from boot for RESTORED (-1 until then, or if opening failed). */
static int urandom_fd = -1;
static int boot_id_fd = -1;
static int sandbox_id_fd = -1;
static size_t sandbox_id_len; /* bytes in SANDBOX_ID_FILE */
static size_t kernel_env_count;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * NS_PER_MS};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool mount_at(const char *source, const char *target, const char *fstype, unsigned long flags, const char *options)
{
    make_directories(target, 0755);
    if (mount(source, target, fstype, flags, options) == 0) return true;
    agent_log("mount %s on %s (%s, %s) failed: %s", source, target, fstype ? fstype : "-", options ? options : "-", strerror(errno));
    return false;
}

/* Reads a small sysfs/procfs file into buf with trailing whitespace stripped. */
static bool read_small_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    size_t len = 0;
    ssize_t n;
    while (len + 1 < cap && (n = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)n;
    close(fd);
    while (len > 0 && isspace((unsigned char)buf[len - 1])) len--;
    buf[len] = '\0';
    return true;
}

/* devtmpfs normally creates nodes before the device is announced, but a missing node
   must not cost us a disk or the agent port: make it from the sysfs dev number. */
static void ensure_device_node(const char *dev_path, const char *sysfs_dev_file, mode_t type)
{
    if (access(dev_path, F_OK) == 0) return;
    char numbers[32];
    unsigned major_number, minor_number;
    if (!read_small_file(sysfs_dev_file, numbers, sizeof numbers) || sscanf(numbers, "%u:%u", &major_number, &minor_number) != 2) return;
    if (mknod(dev_path, type | 0600, makedev(major_number, minor_number)) != 0 && errno != EEXIST)
        agent_log("mknod %s: %s", dev_path, strerror(errno));
}

/* ------------------------------------------------------- kernel cmdline */

static void parse_kernel_cmdline(void)
{
    static char cmdline[65536];
    if (!read_small_file("/proc/cmdline", cmdline, sizeof cmdline)) return;
    char *s = cmdline;
    while (*s) {
        while (isspace((unsigned char)*s)) s++;
        if (!*s) break;
        /* Words may contain "quoted spans" (as the kernel allows); strip the quotes in place. */
        char *word = s, *out = s;
        bool quoted = false;
        while (*s && (quoted || !isspace((unsigned char)*s))) {
            if (*s == '"') quoted = !quoted;
            else *out++ = *s;
            s++;
        }
        if (*s) s++;
        *out = '\0';
        if (strcmp(word, "collimate.debug=1") == 0) agent_debug = true;
        else if (strncmp(word, "collimate.net=", 14) == 0) net_set_spec(word + 14);
        else if (strncmp(word, "collimate.env=", 14) == 0 && kernel_env_count < KERNEL_ENV_MAX) {
            const char *eq = strchr(word + 14, '=');
            if (eq && eq > word + 14) kernel_env[kernel_env_count++] = word + 14;
        }
    }
}

/* ------------------------------------------------------------- modules */

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void load_modules(void)
{
    FILE *order = fopen(MODULE_ORDER_FILE, "re");
    if (!order) {
        agent_log("no %s: %s", MODULE_ORDER_FILE, strerror(errno));
        return;
    }
    char line[PATH_MAX], path[PATH_MAX + 16];
    while (fgets(line, sizeof line, order)) {
        size_t len = strlen(line);
        while (len > 0 && isspace((unsigned char)line[len - 1])) line[--len] = '\0';
        char *entry = line;
        while (isspace((unsigned char)*entry)) entry++;
        if (!*entry || *entry == '#') continue;
        if (*entry == '/') snprintf(path, sizeof path, "%s", entry);
        else snprintf(path, sizeof path, "/lib/modules/%s", entry);

        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            agent_log("module %s: %s", path, strerror(errno));
            continue;
        }
        /* Let the kernel decompress (CONFIG_MODULE_DECOMPRESS) rather than carry a decompressor. */
        int flags = has_suffix(path, ".xz") || has_suffix(path, ".zst") || has_suffix(path, ".gz") ? MODULE_INIT_COMPRESSED_FILE : 0;
        if (syscall(SYS_finit_module, fd, "", flags) != 0 && errno != EEXIST)
            agent_log("finit_module %s: %s", path, strerror(errno));
        close(fd);
    }
    fclose(order);
}

/* ---------------------------------------------------------------- disks */

struct disk_set {
    char layer[LAYERS_MAX][32]; /* block device names ("vdb"), "" when absent */
    size_t layer_count;         /* contiguous layers from layer0 */
    bool gap;                   /* a layer beyond a missing one was seen */
    char upper[32];
};

/* Reading a virtio-blk serial is a request to the device, and we may rescan every
   10 ms while waiting; a disk's serial never changes, so ask each device once. */
static bool disk_serial(const char *name, char *serial, size_t cap)
{
    static struct {
        char name[32];
        char serial[64];
    } known[LAYERS_MAX + 16];
    static size_t known_count;
    for (size_t i = 0; i < known_count; i++) {
        if (strcmp(known[i].name, name) == 0) {
            snprintf(serial, cap, "%s", known[i].serial);
            return true;
        }
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/sys/block/%s/serial", name);
    if (!read_small_file(path, serial, cap)) return false;
    if (known_count < sizeof known / sizeof known[0]) {
        snprintf(known[known_count].name, sizeof known[known_count].name, "%s", name);
        snprintf(known[known_count].serial, sizeof known[known_count].serial, "%s", serial);
        known_count++;
    }
    return true;
}

static void scan_disks(struct disk_set *d)
{
    memset(d, 0, sizeof *d);
    DIR *dir = opendir("/sys/block");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, "vd", 2) != 0 || strlen(e->d_name) >= sizeof d->upper) continue;
        char serial[64];
        if (!disk_serial(e->d_name, serial, sizeof serial)) continue;
        char *end;
        if (strcmp(serial, "upper") == 0) {
            strcpy(d->upper, e->d_name);
        } else if (strncmp(serial, "layer", 5) == 0 && isdigit((unsigned char)serial[5])) {
            unsigned long index = strtoul(serial + 5, &end, 10);
            if (!*end && index < LAYERS_MAX) strcpy(d->layer[index], e->d_name);
        }
    }
    closedir(dir);
    while (d->layer_count < LAYERS_MAX && d->layer[d->layer_count][0]) d->layer_count++;
    for (size_t i = d->layer_count; i < LAYERS_MAX; i++)
        if (d->layer[i][0]) d->gap = true;
}

/* Probing is normally finished once the driver module has loaded, but a device can
   still be settling; wait for layer0 and for the layer list to have no holes. */
static void wait_for_disks(struct disk_set *d)
{
    int64_t give_up = monotonic_ns() + DISK_WAIT_NS;
    for (;;) {
        scan_disks(d);
        if ((d->layer_count > 0 && !d->gap) || monotonic_ns() >= give_up) break;
        sleep_ms(10);
    }
    for (size_t i = 0; i < d->layer_count; i++) {
        char dev[64], sys[96];
        snprintf(dev, sizeof dev, "/dev/%s", d->layer[i]);
        snprintf(sys, sizeof sys, "/sys/block/%s/dev", d->layer[i]);
        ensure_device_node(dev, sys, S_IFBLK);
    }
    if (d->upper[0]) {
        char dev[64], sys[96];
        snprintf(dev, sizeof dev, "/dev/%s", d->upper);
        snprintf(sys, sizeof sys, "/sys/block/%s/dev", d->upper);
        ensure_device_node(dev, sys, S_IFBLK);
    }
}

static bool assemble_root(void)
{
    struct disk_set disks;
    wait_for_disks(&disks);
    if (disks.layer_count == 0) {
        agent_log("no layer0 disk found; staying in the initramfs");
        return false;
    }
    if (disks.gap) agent_log("layer disks are not contiguous; using layer0..layer%zu", disks.layer_count - 1);

    char lowerdir[4096] = "lowerdir=";
    size_t used = strlen(lowerdir);
    for (size_t i = disks.layer_count; i-- > 0;) {
        char dev[64], target[64];
        snprintf(dev, sizeof dev, "/dev/%s", disks.layer[i]);
        snprintf(target, sizeof target, "/run/layers/%zu", i);
        if (!mount_at(dev, target, "erofs", MS_RDONLY, NULL)) return false;
        used += (size_t)snprintf(lowerdir + used, sizeof lowerdir - used, "%s%s", target, i ? ":" : "");
        if (used >= sizeof lowerdir) return false;
    }

    if (disks.upper[0]) {
        char dev[64];
        snprintf(dev, sizeof dev, "/dev/%s", disks.upper);
        if (!mount_at(dev, "/run/upper", "ext4", 0, NULL)) return false;
    } else if (!mount_at("tmpfs", "/run/upper", "tmpfs", 0, "mode=0755")) {
        return false;
    }
    make_directories("/run/upper/data", 0755);
    make_directories("/run/upper/work", 0755);

    char options[4096 + 128];
    snprintf(options, sizeof options, "%s,upperdir=/run/upper/data,workdir=/run/upper/work", lowerdir);
    return mount_at("overlay", "/newroot", "overlay", 0, options);
}

static bool switch_root(void)
{
    /* The initramfs root (rootfs) cannot be pivot_root'ed away; moving the new root over
       it and chrooting is the classic switch_root. */
    if (chdir("/newroot") != 0 || mount(".", "/", NULL, MS_MOVE, NULL) != 0 || chroot(".") != 0 || chdir("/") != 0) {
        agent_log("switching to /newroot failed: %s", strerror(errno));
        return false;
    }
    return true;
}

static void mount_system_filesystems(void)
{
    mount_at("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_at("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_at("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    mount_at("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5");
    mount_at("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    mount_at("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    mount_at("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
    /* devtmpfs has no /dev/fd family; bash process substitution and many scripts need it. */
    (void)!symlink("/proc/self/fd", "/dev/fd");
    (void)!symlink("/proc/self/fd/0", "/dev/stdin");
    (void)!symlink("/proc/self/fd/1", "/dev/stdout");
    (void)!symlink("/proc/self/fd/2", "/dev/stderr");
}

static void load_seed_library(void)
{
    int fd = open(SEED_LIBRARY_INITRAMFS_PATH, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > 64 * 1024 * 1024) {
        agent_log("no seed library at %s; seeded execs run without it", SEED_LIBRARY_INITRAMFS_PATH);
        if (fd >= 0) close(fd);
        return;
    }
    uint8_t *data = malloc((size_t)st.st_size);
    size_t got = 0;
    while (data && got < (size_t)st.st_size) {
        ssize_t n = read(fd, data + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (!data || got != (size_t)st.st_size) {
        agent_log("reading %s failed", SEED_LIBRARY_INITRAMFS_PATH);
        free(data);
        return;
    }
    seed_library.data = data;
    seed_library.len = got;
}

/* Written aside and renamed, so a process never maps a half-written library. */
static void install_seed_library(void)
{
    if (!seed_library.data) return;
    const char *temp = SEED_LIBRARY_GUEST_PATH ".new";
    make_directories(RUN_DIR, 0755);
    int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write_all(fd, seed_library.data, seed_library.len) && fchmod(fd, 0755) == 0;
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (!ok || rename(temp, SEED_LIBRARY_GUEST_PATH) != 0) {
        agent_log("installing %s failed: %s", SEED_LIBRARY_GUEST_PATH, strerror(errno));
        unlink(temp);
    }
    free(seed_library.data);
    seed_library.data = NULL;
}

/* /run/collimate: what the agent publishes to the guest (boot id, sandbox id, seed library). */
static void prepare_run_directory(void)
{
    char why[512];
    if (install_boot_id(why, sizeof why) != 0) agent_log("boot id: %s", why);
    install_seed_library();
    urandom_fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    if (urandom_fd < 0) agent_log("open /dev/urandom: %s", strerror(errno));
    sandbox_id_fd = open(SANDBOX_ID_FILE, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    if (sandbox_id_fd < 0) agent_log("create %s: %s", SANDBOX_ID_FILE, strerror(errno));
    else fchmod(sandbox_id_fd, 0444);
}

static void bring_up_loopback(void)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) agent_log("lo up: %s", strerror(errno));
    }
    close(fd);
}

void boot_system(void)
{
    mount_at("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_at("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_at("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    parse_kernel_cmdline();
    if (agent_debug) {
        int console = open("/dev/console", O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (console >= 0) agent_log_to_fd(console);
    }
    agent_log("%s booting", AGENT_VERSION);

    load_modules();
    load_seed_library();
    if (assemble_root() && switch_root()) mount_system_filesystems();
    else agent_log("continuing without the sandbox root filesystem");
    prepare_run_directory();
    limits_init();

    bring_up_loopback();
    net_configure();
    if (sethostname("sandbox", 7) != 0) agent_log("sethostname: %s", strerror(errno));
    base_environment_init(kernel_env, kernel_env_count);
}

/* Returns /dev/vportNpM of the port QEMU named collimate.agent, once it shows up. */
static bool find_agent_port(char *dev_path, size_t cap)
{
    DIR *dir = opendir("/sys/class/virtio-ports");
    if (!dir) return false;
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX], name[128];
        snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
        if (!read_small_file(path, name, sizeof name) || strcmp(name, AGENT_PORT_NAME) != 0) continue;
        snprintf(dev_path, cap, "/dev/%s", e->d_name);
        snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/dev", e->d_name);
        ensure_device_node(dev_path, path, S_IFCHR);
        found = true;
    }
    closedir(dir);
    return found;
}

int open_agent_port(void)
{
    /* The port's name arrives from the host asynchronously after the driver binds. */
    for (unsigned attempt = 0;; attempt++) {
        char dev_path[PATH_MAX];
        if (find_agent_port(dev_path, sizeof dev_path)) {
            int fd = open(dev_path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
            if (fd >= 0) {
                /* virtio_console sends SIGIO to the port's owner when the host connects or
                   disconnects and when data arrives; a disconnected agent sleeps until then. */
                if (fcntl(fd, F_SETOWN, getpid()) != 0 || fcntl(fd, F_SETFL, O_NONBLOCK | O_ASYNC) != 0)
                    agent_log("O_ASYNC on %s: %s (falling back to a 1 s reconnect poll)", dev_path, strerror(errno));
                agent_log("serving on %s", dev_path);
                return fd;
            }
            agent_log("open %s: %s", dev_path, strerror(errno));
        }
        if (attempt % 500 == 0) agent_log("waiting for virtio-serial port %s", AGENT_PORT_NAME);
        sleep_ms(10);
    }
}

/* ------------------------------------------------------------- RESTORED */

static int fail(char *why, size_t cap, const char *what)
{
    snprintf(why, cap, "%s: %s", what, strerror(errno));
    return -1;
}

int restore_mix_entropy(const uint8_t *data, size_t len, char *why, size_t why_cap)
{
    /* struct rand_pool_info from <linux/random.h>. */
    struct {
        int entropy_count;
        int buf_size;
        uint32_t buf[512 / 4];
    } pool;
    if (len > sizeof pool.buf) len = sizeof pool.buf;
    pool.entropy_count = (int)(len * 8);
    pool.buf_size = (int)len;
    memcpy(pool.buf, data, len);

    /* Opened once at boot: a restore runs on cold caches (under TCG every kernel path
       it touches is translated afresh), so it avoids the open/close paths. */
    if (urandom_fd < 0) urandom_fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    if (urandom_fd < 0) return fail(why, why_cap, "open /dev/urandom");
    int rc = 0;
    if (ioctl(urandom_fd, RNDADDENTROPY_IOCTL, &pool) != 0) rc = fail(why, why_cap, "RNDADDENTROPY");
    else if (ioctl(urandom_fd, RNDRESEEDCRNG_IOCTL) != 0) rc = fail(why, why_cap, "RNDRESEEDCRNG");
    memset(&pool, 0, sizeof pool);
    return rc;
}

int restore_set_clock(uint64_t ns, char *why, size_t why_cap)
{
    struct timespec ts = {(time_t)(ns / (uint64_t)NS_PER_SEC), (long)(ns % (uint64_t)NS_PER_SEC)};
    return clock_settime(CLOCK_REALTIME, &ts) == 0 ? 0 : fail(why, why_cap, "clock_settime");
}

/* Readers must never see a half-written file, so write aside and rename over. */
static int publish_file(const char *path, const char *content, mode_t mode, char *why, size_t why_cap)
{
    char temp[PATH_MAX];
    snprintf(temp, sizeof temp, "%s.new", path);
    int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
        /* /run/collimate is made at boot; only a guest that booted without it gets here. */
        if (make_directories(RUN_DIR, 0755) != 0) return fail(why, why_cap, "mkdir " RUN_DIR);
        fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (fd < 0) return fail(why, why_cap, temp);
    bool ok = write_all(fd, content, strlen(content)) && fchmod(fd, mode) == 0;
    if (close(fd) != 0) ok = false;
    if (!ok || rename(temp, path) != 0) {
        int rc = fail(why, why_cap, path);
        unlink(temp);
        return rc;
    }
    return 0;
}

static void format_uuid_v4(const uint8_t raw[16], char text[BOOT_ID_TEXT_LEN + 1])
{
    uint8_t u[16];
    memcpy(u, raw, sizeof u);
    u[6] = (uint8_t)((u[6] & 0x0f) | 0x40);
    u[8] = (uint8_t)((u[8] & 0x3f) | 0x80);
    snprintf(text, BOOT_ID_TEXT_LEN + 1, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", u[0], u[1], u[2], u[3],
             u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/*
 * The guest's boot id is /run/collimate/boot_id, bind-mounted over the kernel's
 * /proc/sys/kernel/random/boot_id once, here; RESTORED then only rewrites the file's
 * bytes in place. (Re-binding on every restore costs an umount, whose RCU grace
 * period is slow under TCG.) The first value is the kernel's own boot id.
 */
static int install_boot_id(char *why, size_t why_cap)
{
    char text[BOOT_ID_TEXT_LEN + 8];
    if (!read_small_file(BOOT_ID_PATH, text, sizeof text) || strlen(text) + 1 != BOOT_ID_TEXT_LEN) {
        uint8_t raw[16];
        if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return fail(why, why_cap, "getrandom");
        format_uuid_v4(raw, text);
    } else {
        strcat(text, "\n");
    }
    if (make_directories(RUN_DIR, 0755) != 0) return fail(why, why_cap, "mkdir " RUN_DIR);
    if (boot_id_fd >= 0) close(boot_id_fd);
    boot_id_fd = open(BOOT_ID_FILE, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    if (boot_id_fd < 0) return fail(why, why_cap, BOOT_ID_FILE);
    if (!write_all(boot_id_fd, text, BOOT_ID_TEXT_LEN) || fchmod(boot_id_fd, 0444) != 0) return fail(why, why_cap, BOOT_ID_FILE);
    if (mount(BOOT_ID_FILE, BOOT_ID_PATH, NULL, MS_BIND, NULL) != 0) {
        fail(why, why_cap, "bind mount " BOOT_ID_PATH);
        close(boot_id_fd);
        boot_id_fd = -1;
        return -1;
    }
    return 0;
}

int restore_refresh_boot_id(char *why, size_t why_cap)
{
    uint8_t raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return fail(why, why_cap, "getrandom");
    char text[BOOT_ID_TEXT_LEN + 1];
    format_uuid_v4(raw, text);
    /* The boot-time bind failed: try again now. */
    if (boot_id_fd < 0 && install_boot_id(why, why_cap) != 0) return -1;
    /* Same length every time, so an in-place overwrite never shows a reader an empty or
       short file (as O_TRUNC then write could). */
    ssize_t n = pwrite(boot_id_fd, text, BOOT_ID_TEXT_LEN, 0);
    if (n != (ssize_t)BOOT_ID_TEXT_LEN) {
        if (n >= 0) errno = EIO;
        return fail(why, why_cap, "write " BOOT_ID_FILE);
    }
    return 0;
}

/*
 * /run/collimate/sandbox_id, created empty at boot and held open. An id of the same
 * length as the current one (every engine id is), or a first id over the empty file, is
 * written in place with one pwrite, which is cheap on a cold restore (a reader racing
 * that write could in principle see a torn value, as with boot_id). Any other change of
 * length writes aside and renames over, so a reader never sees a stale tail.
 */
int restore_publish_sandbox_id(const char *sandbox_id, char *why, size_t why_cap)
{
    size_t len = strlen(sandbox_id);
    if (sandbox_id_fd >= 0 && (len == sandbox_id_len || sandbox_id_len == 0)) {
        ssize_t n = len ? pwrite(sandbox_id_fd, sandbox_id, len, 0) : 0;
        if (n == (ssize_t)len) {
            sandbox_id_len = len;
            return 0;
        }
        if (n >= 0) errno = EIO;
        return fail(why, why_cap, "write " SANDBOX_ID_FILE);
    }
    if (publish_file(SANDBOX_ID_FILE, sandbox_id, 0444, why, why_cap) != 0) return -1;
    if (sandbox_id_fd >= 0) close(sandbox_id_fd);
    sandbox_id_fd = open(SANDBOX_ID_FILE, O_WRONLY | O_CLOEXEC);
    sandbox_id_len = len;
    return 0;
}
