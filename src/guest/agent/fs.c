/*
 * Directory operations and directory watches (docs/agent-protocol.md, "Files and directories").
 *
 * Everything here runs in the main poll loop, beside a running exec, so nothing may take long:
 * a listing stops at a bounded number of entries, a recursive remove unlinks a bounded number of
 * entries per request (the host asks again until it is done), and a watch reads one buffer of
 * inotify events per wake-up and is not polled while the host is not reading our output.
 *
 * Owner and group names come from /etc/passwd and /etc/group, parsed here: the agent is a static
 * binary and has no NSS.
 */
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

/* Where relative paths are resolved (the guest's HOME). Test mode may point it elsewhere. */
const char *fs_home_dir = "/root";

/* FS_LIST: at most this many entries in one reply (and whatever fits in one frame). */
#define LIST_ENTRIES_MAX 5000u
#define LIST_DEPTH_MAX 32u
/* Names read from one directory before sorting; beyond it the listing is truncated. */
#define LIST_DIR_NAMES_MAX 100000u
/* FS_REMOVE: unlinks per request; the host repeats the request until DONE. */
#define REMOVE_BUDGET 2000u
#define REMOVE_DEPTH_MAX 256
/* FS_WATCH */
#define WATCHES_MAX 32u
#define WATCH_DIRS_MAX 4096u
/* Entries reported as created when a new directory appears under a recursive watch. */
#define WATCH_SYNTHETIC_MAX 1000u
#define WATCH_MASK                                                                                          \
    (IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | \
     IN_ONLYDIR | IN_EXCL_UNLINK)
/* Room for one entry's fixed fields in a frame, besides its name, path and target. */
#define ENTRY_FIXED_BYTES 256u

/* ------------------------------------------------------------- errors */

/* The stable code of an errno from a file system call. */
static const char *fs_error_code(int e)
{
    switch (e) {
    case ENOENT: return "file_not_found";
    case ENOTDIR: return "not_a_directory";
    case EISDIR: return "is_a_directory";
    case EEXIST: return "file_exists";
    case ENOTEMPTY: return "directory_not_empty";
    case EACCES:
    case EPERM: return "permission_denied";
    case EXDEV: return "cross_device";
    case EROFS: return "read_only";
    case ENOSPC:
    case EDQUOT: return "no_space";
    case ENAMETOOLONG:
    case ELOOP:
    case EINVAL: return "invalid_path";
    default: return "fs_failed";
    }
}

static void reply_errno(uint32_t id, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void reply_errno(uint32_t id, int e, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    reply_error(id, fs_error_code(e), "%s: %s", what, strerror(e));
}

/* Replies the error of errno value e (a stable code, the path and the reason) and returns. */
#define reject_errno(id, e, ...)                \
    do {                                        \
        reply_errno((id), (e), __VA_ARGS__);    \
        return;                                 \
    } while (0)

/* ------------------------------------------------------------- paths */

bool path_under_home(char path[PATH_MAX])
{
    if (path[0] == '/') return true;
    size_t home = strlen(fs_home_dir), rel = strlen(path);
    size_t prefix = home + (home == 0 || fs_home_dir[home - 1] != '/');
    if (prefix + rel >= PATH_MAX) return false;
    memmove(path + prefix, path, rel + 1);
    memcpy(path, fs_home_dir, home);
    if (prefix > home) path[home] = '/';
    return true;
}

/* A PATH field as an absolute path: relative ones are under fs_home_dir. Trailing slashes go
   (but "/" stays). False (and an error sent) if it is empty, has a NUL or is too long. */
static bool resolve_path(uint32_t id, const struct tlv_field *f, const char *what, char out[PATH_MAX])
{
    if (f->len == 0 || tlv_has_nul(f)) {
        reply_error(id, "invalid_path", "%s must be a non-empty path without NUL", what);
        return false;
    }
    if (!tlv_copy_text(f, out, PATH_MAX) || !path_under_home(out)) {
        reply_error(id, "invalid_path", "%s is longer than %d bytes", what, PATH_MAX - 1);
        return false;
    }
    size_t used = strlen(out);
    while (used > 1 && out[used - 1] == '/') used--;
    out[used] = '\0';
    return true;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return path;
    return slash[1] ? slash + 1 : path;
}

/* --------------------------------------------------- owner and group names */

struct id_name {
    uint32_t id;
    char *name;
};

struct id_table {
    const char *file;
    struct id_name *entries;
    size_t count;
    time_t mtime;
    off_t size;
    bool loaded;
};

static struct id_table users = {.file = "/etc/passwd"};
static struct id_table groups = {.file = "/etc/group"};

#define ID_TABLE_MAX 4096u

/* Reloads the table when its file changed (an exec may add users). Lines are name:x:id:... */
static void id_table_refresh(struct id_table *t)
{
    struct stat st;
    bool exists = stat(t->file, &st) == 0;
    if (t->loaded && exists && st.st_mtime == t->mtime && st.st_size == t->size) return;
    if (t->loaded && !exists && t->count == 0) return;
    for (size_t i = 0; i < t->count; i++) free(t->entries[i].name);
    free(t->entries);
    t->entries = NULL;
    t->count = 0;
    t->loaded = true;
    t->mtime = exists ? st.st_mtime : 0;
    t->size = exists ? st.st_size : 0;
    FILE *fp = exists ? fopen(t->file, "re") : NULL;
    if (!fp) return;
    t->entries = calloc(ID_TABLE_MAX, sizeof *t->entries);
    char line[1024];
    while (t->entries && t->count < ID_TABLE_MAX && fgets(line, sizeof line, fp)) {
        char *name_end = strchr(line, ':');
        if (!name_end || name_end == line) continue;
        char *pw_end = strchr(name_end + 1, ':');
        if (!pw_end) continue;
        char *end;
        unsigned long v = strtoul(pw_end + 1, &end, 10);
        if (end == pw_end + 1 || *end != ':' || v > UINT32_MAX) continue;
        *name_end = '\0';
        char *name = strdup(line);
        if (!name) break;
        t->entries[t->count].id = (uint32_t)v;
        t->entries[t->count].name = name;
        t->count++;
    }
    fclose(fp);
}

static const char *id_table_name(const struct id_table *t, uint32_t id)
{
    for (size_t i = 0; i < t->count; i++)
        if (t->entries[i].id == id) return t->entries[i].name;
    return "";
}

static void refresh_names(void)
{
    id_table_refresh(&users);
    id_table_refresh(&groups);
}

/* --------------------------------------------------------------- entries */

static const char *entry_type(mode_t mode)
{
    if (S_ISREG(mode)) return "file";
    if (S_ISDIR(mode)) return "dir";
    if (S_ISLNK(mode)) return "symlink";
    return "other";
}

/* Bytes an entry takes in a frame, at most (a symlink's target is up to PATH_MAX). */
static size_t entry_frame_bytes(const char *name, const char *path, mode_t mode)
{
    return ENTRY_FIXED_BYTES + strlen(name) + strlen(path) + (S_ISLNK(mode) ? PATH_MAX : 0);
}

/* What an entry's extended attributes may add to a frame: names and values, and a TLV header each. */
#define XATTR_FRAME_BYTES (FS_XATTR_BYTES_MAX + FS_XATTR_COUNT_MAX * 2 * 6)

/*
 * The entry's user.* extended attributes (a final symlink is not followed): names without "user.",
 * at most FS_XATTR_COUNT_MAX of them and FS_XATTR_BYTES_MAX of names and values (the rest is left
 * out, as are attributes that cannot be read). False if they did not all fit in the frame's room.
 */
static bool put_xattrs(struct frame_builder *b, const char *path)
{
    char names[FS_XATTR_BYTES_MAX];
    ssize_t n = llistxattr(path, names, sizeof names);
    if (n <= 0) return true; /* none, not supported here, or more names than an entry reports */
    size_t budget = FS_XATTR_BYTES_MAX, count = 0;
    for (const char *name = names; name < names + n && count < FS_XATTR_COUNT_MAX; name += strlen(name) + 1) {
        if (strncmp(name, "user.", 5) != 0) continue;
        char value[FS_XATTR_BYTES_MAX];
        ssize_t v = lgetxattr(path, name, value, sizeof value);
        size_t short_name = strlen(name) - 5;
        if (v < 0 || short_name + (size_t)v > budget) continue;
        if (b->frame->len + short_name + (size_t)v + 12 > b->cap) return false;
        frame_put_bytes(b, TAG_FS_XATTR_NAME, name + 5, short_name);
        frame_put_bytes(b, TAG_FS_XATTR_VALUE, value, (size_t)v);
        budget -= short_name + (size_t)v;
        count++;
    }
    return true;
}

/* The fields of one entry (st from lstat). False if its extended attributes did not all fit. */
static bool put_entry(struct frame_builder *b, const char *name, const char *path, const struct stat *st)
{
    frame_put_text(b, TAG_FS_NAME, name);
    frame_put_text(b, TAG_FS_ENTRY_PATH, path);
    frame_put_text(b, TAG_FS_TYPE, entry_type(st->st_mode));
    frame_put_u64(b, TAG_FS_SIZE, (uint64_t)st->st_size);
    frame_put_u32(b, TAG_FS_PERM, (uint32_t)(st->st_mode & 07777));
    frame_put_u32(b, TAG_FS_UID, (uint32_t)st->st_uid);
    frame_put_u32(b, TAG_FS_GID, (uint32_t)st->st_gid);
    frame_put_text(b, TAG_FS_OWNER, id_table_name(&users, (uint32_t)st->st_uid));
    frame_put_text(b, TAG_FS_GROUP, id_table_name(&groups, (uint32_t)st->st_gid));
    frame_put_u64(b, TAG_FS_MTIME_NS, (uint64_t)st->st_mtim.tv_sec * (uint64_t)NS_PER_SEC + (uint64_t)st->st_mtim.tv_nsec);
    if (S_ISLNK(st->st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n >= 0) frame_put_bytes(b, TAG_FS_TARGET, target, (size_t)n);
    }
    return put_xattrs(b, path);
}

/* Replies FS_ENTRY for path (not following a final symlink); CREATED when created >= 0. */
static void reply_entry(uint32_t id, const char *path, int created)
{
    struct stat st;
    if (lstat(path, &st) != 0) reject_errno(id, errno, "%s", path);
    refresh_names();
    const char *name = base_name(path);
    struct frame_builder b;
    if (!frame_begin(&b, MSG_FS_ENTRY, id, entry_frame_bytes(name, path, st.st_mode) + XATTR_FRAME_BYTES + 16)) reject_request(id, "fs_failed", "out of memory");
    (void)put_entry(&b, name, path, &st);
    if (created >= 0) frame_put_u8(&b, TAG_FS_CREATED, (uint8_t)created);
    frame_send(&b);
}

/* ----------------------------------------------------------- FS_STAT */

static void handle_stat(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag != TAG_FS_PATH) continue;
        if (!resolve_path(id, &f, "PATH", path)) return;
        have_path = true;
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_STAT payload is truncated");
    if (!have_path) reject_request(id, "bad_request", "PATH is required");
    reply_entry(id, path, -1);
}

/* ----------------------------------------------------------- FS_LIST */

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

struct listing {
    struct frame_builder b;
    uint32_t count;
    uint32_t max;
    bool truncated;
};

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Lists dir (an absolute path) into l, depth-first, names sorted in each directory. */
static void list_directory(struct listing *l, const char *dir, uint32_t depth_left)
{
    DIR *d = opendir(dir);
    if (!d) return; /* a subdirectory we cannot read: its entry is listed, its children are not */
    size_t cap = 64, n = 0;
    char **names = malloc(cap * sizeof *names);
    struct dirent *de;
    while (names && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (n >= LIST_DIR_NAMES_MAX) {
            l->truncated = true;
            break;
        }
        if (n == cap) {
            char **bigger = realloc(names, cap * 2 * sizeof *names);
            if (!bigger) {
                l->truncated = true;
                break;
            }
            names = bigger;
            cap *= 2;
        }
        if (!(names[n] = strdup(de->d_name))) {
            l->truncated = true;
            break;
        }
        n++;
    }
    closedir(d);
    if (!names) {
        l->truncated = true;
        return;
    }
    qsort(names, n, sizeof *names, compare_names);
    for (size_t i = 0; i < n; i++) {
        if (l->count >= l->max) {
            l->truncated = true;
            break;
        }
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", names[i]);
        if (w < 0 || (size_t)w >= sizeof path) continue;
        struct stat st;
        if (lstat(path, &st) != 0) continue; /* gone meanwhile */
        size_t room = l->b.cap - l->b.frame->len;
        if (room < entry_frame_bytes(names[i], path, st.st_mode) + 64) {
            l->truncated = true;
            break;
        }
        size_t mark = l->b.frame->len;
        frame_put_bytes(&l->b, TAG_FS_ENTRY_BEGIN, NULL, 0);
        if (!put_entry(&l->b, names[i], path, &st)) {
            /* Its attributes would not fit: the entry goes to the next listing, not half into this one. */
            l->b.frame->len = mark;
            l->truncated = true;
            break;
        }
        l->count++;
        if (S_ISDIR(st.st_mode) && depth_left > 1) {
            list_directory(l, path, depth_left - 1);
            if (l->count >= l->max || l->truncated) break;
        }
    }
    free_names(names, n);
}

static void handle_list(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    uint32_t depth = 1, max = LIST_ENTRIES_MAX;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        switch (f.tag) {
        case TAG_FS_PATH:
            if (!resolve_path(id, &f, "PATH", path)) return;
            have_path = true;
            break;
        case TAG_FS_DEPTH:
            if (!tlv_as_u32(&f, &depth)) reject_request(id, "bad_request", "DEPTH must be a u32");
            break;
        case TAG_FS_MAX_ENTRIES:
            if (!tlv_as_u32(&f, &max)) reject_request(id, "bad_request", "MAX_ENTRIES must be a u32");
            break;
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_LIST payload is truncated");
    if (!have_path) reject_request(id, "bad_request", "PATH is required");
    if (depth == 0) depth = 1;
    if (depth > LIST_DEPTH_MAX) depth = LIST_DEPTH_MAX;
    if (max == 0 || max > LIST_ENTRIES_MAX) max = LIST_ENTRIES_MAX;

    /* The directory itself may be reached through a symlink; its entries are not followed. */
    struct stat st;
    if (stat(path, &st) != 0) reject_errno(id, errno, "%s", path);
    if (!S_ISDIR(st.st_mode)) reject_request(id, "not_a_directory", "%s is not a directory", path);
    if (access(path, R_OK | X_OK) != 0) reject_errno(id, errno, "%s", path);
    refresh_names();

    struct listing l = {.max = max};
    if (!frame_begin(&l.b, MSG_FS_ENTRIES, id, MAX_FRAME_PAYLOAD)) reject_request(id, "fs_failed", "out of memory");
    /* The flag goes last; its room is kept free by the per-entry check. */
    list_directory(&l, path, depth);
    frame_put_u8(&l.b, TAG_FS_TRUNCATED, l.truncated ? 1 : 0);
    frame_send(&l.b);
}

/* ----------------------------------------------------------- FS_MKDIR */

static void handle_mkdir(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    uint32_t mode = 0755;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag == TAG_FS_PATH) {
            if (!resolve_path(id, &f, "PATH", path)) return;
            have_path = true;
        } else if (f.tag == TAG_FS_MODE) {
            if (!tlv_as_u32(&f, &mode)) reject_request(id, "bad_request", "MODE must be a u32");
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_MKDIR payload is truncated");
    if (!have_path) reject_request(id, "bad_request", "PATH is required");
    mode &= 07777;

    struct stat st;
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) reject_request(id, "file_exists", "%s exists and is not a directory", path);
        reply_entry(id, path, 0);
        return;
    }
    /* mkdir -p: every missing component gets MODE exactly (chmod, so the umask does not decide). */
    char buf[PATH_MAX];
    strcpy(buf, path);
    for (char *p = buf + 1;; p++) {
        bool last = *p == '\0';
        if (!last && *p != '/') continue;
        *p = '\0';
        if (mkdir(buf, (mode_t)mode) == 0) {
            own_path(buf);
            if (chmod(buf, (mode_t)mode) != 0) reject_errno(id, errno, "chmod %s", buf);
        } else if (errno == EEXIST) {
            if (stat(buf, &st) != 0) reject_errno(id, errno, "%s", buf);
            if (!S_ISDIR(st.st_mode)) {
                if (last) reject_request(id, "file_exists", "%s exists and is not a directory", buf);
                reject_request(id, "not_a_directory", "%s is in the way: it is not a directory", buf);
            }
        } else {
            reject_errno(id, errno, "mkdir %s", buf);
        }
        if (last) break;
        *p = '/';
    }
    reply_entry(id, path, 1);
}

/* ----------------------------------------------------------- FS_REMOVE */

struct removal {
    uint32_t budget;
    uint64_t removed;
    int error;
    char failed[PATH_MAX];
};

static void removal_failed(struct removal *r, int e, const char *dir, const char *name)
{
    if (r->error) return;
    r->error = e;
    snprintf(r->failed, sizeof r->failed, "%s/%s", dir, name);
}

/* Removes the directory `name` in dirfd and everything in it, not following symlinks and not
   descending into another file system. Returns true once it is gone, false when the budget ran
   out (or r->error is set). */
static bool remove_tree_at(struct removal *r, int dirfd, const char *name, const char *shown, dev_t dev, int depth)
{
    if (depth > REMOVE_DEPTH_MAX) {
        removal_failed(r, ENAMETOOLONG, shown, name);
        return false;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        removal_failed(r, errno, shown, name);
        return false;
    }
    for (;;) {
        DIR *d = fdopendir(dup(fd));
        if (!d) {
            removal_failed(r, errno, shown, name);
            close(fd);
            return false;
        }
        bool saw_any = false;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
            saw_any = true;
            if (r->budget == 0) break;
            struct stat st;
            if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
                if (errno == ENOENT) continue;
                removal_failed(r, errno, shown, de->d_name);
                break;
            }
            if (S_ISDIR(st.st_mode)) {
                if (st.st_dev != dev) {
                    removal_failed(r, EBUSY, shown, de->d_name);
                    break;
                }
                char sub[PATH_MAX];
                snprintf(sub, sizeof sub, "%s/%s", shown, name);
                if (!remove_tree_at(r, fd, de->d_name, sub, dev, depth + 1)) break;
            } else {
                if (unlinkat(fd, de->d_name, 0) != 0 && errno != ENOENT) {
                    removal_failed(r, errno, shown, de->d_name);
                    break;
                }
                r->removed++;
                r->budget--;
            }
        }
        closedir(d);
        if (r->error || r->budget == 0) {
            close(fd);
            return false;
        }
        if (!saw_any) break;
        /* Entries were removed while reading: read again until the directory is seen empty. */
    }
    close(fd);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
        removal_failed(r, errno, shown, name);
        return false;
    }
    r->removed++;
    if (r->budget) r->budget--;
    return true;
}

static void handle_remove(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag != TAG_FS_PATH) continue;
        if (!resolve_path(id, &f, "PATH", path)) return;
        have_path = true;
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_REMOVE payload is truncated");
    if (!have_path) reject_request(id, "bad_request", "PATH is required");
    if (strcmp(path, "/") == 0) reject_request(id, "invalid_path", "refusing to remove /");

    struct stat st;
    if (lstat(path, &st) != 0) reject_errno(id, errno, "%s", path);
    struct removal r = {.budget = REMOVE_BUDGET};
    bool done;
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0) reject_errno(id, errno, "%s", path);
        r.removed = 1;
        done = true;
    } else {
        char parent[PATH_MAX];
        strcpy(parent, path);
        char *slash = strrchr(parent, '/');
        if (slash == parent) parent[1] = '\0';
        else *slash = '\0';
        int dirfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0) reject_errno(id, errno, "%s", parent);
        done = remove_tree_at(&r, dirfd, base_name(path), strcmp(parent, "/") == 0 ? "" : parent, st.st_dev, 0);
        close(dirfd);
        if (r.error) reject_errno(id, r.error, "%s", r.failed);
    }
    struct frame_builder b;
    if (!frame_begin(&b, MSG_FS_REMOVED, id, 32)) reject_request(id, "fs_failed", "out of memory");
    frame_put_u64(&b, TAG_FS_REMOVED_COUNT, r.removed);
    frame_put_u8(&b, TAG_FS_DONE, done ? 1 : 0);
    frame_send(&b);
}

/* ----------------------------------------------------------- FS_RENAME */

static void handle_rename(uint32_t id, const uint8_t *payload, size_t len)
{
    char from[PATH_MAX], to[PATH_MAX];
    bool have_from = false, have_to = false;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag == TAG_FS_FROM) {
            if (!resolve_path(id, &f, "FROM", from)) return;
            have_from = true;
        } else if (f.tag == TAG_FS_TO) {
            if (!resolve_path(id, &f, "TO", to)) return;
            have_to = true;
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_RENAME payload is truncated");
    if (!have_from || !have_to) reject_request(id, "bad_request", "FROM and TO are required");
    if (rename(from, to) != 0) {
        int e = errno;
        /* Say which side is missing: the source, or the destination's directory. */
        struct stat st;
        if (e == ENOENT && lstat(from, &st) == 0) reject_errno(id, e, "%s (the destination's directory)", to);
        reject_errno(id, e, "rename %s to %s", from, to);
    }
    reply_entry(id, to, -1);
}

/* ----------------------------------------------------------- FS_WATCH */

struct watched_dir {
    int wd;
    char *rel; /* relative to the watch's root; "" for the root */
};

struct fs_watch {
    uint32_t id;
    int fd;
    bool recursive;
    bool full; /* WATCH_DIRS_MAX reached: an overflow event was sent */
    char root[PATH_MAX];
    struct watched_dir *dirs;
    size_t ndirs;
    /* The last event sent, so a burst of writes to one file is one event per read. */
    char last_op[12];
    char *last_name;
};

static struct fs_watch *watches[WATCHES_MAX];
static uint32_t next_watch_id = 1;

static void send_watch_event(struct fs_watch *w, const char *name, const char *op)
{
    if (w->last_name && strcmp(w->last_name, name) == 0 && strcmp(w->last_op, op) == 0) return;
    free(w->last_name);
    w->last_name = strdup(name);
    snprintf(w->last_op, sizeof w->last_op, "%s", op);
    struct frame_builder b;
    if (!frame_begin(&b, MSG_FS_EVENT, 0, 64 + strlen(name) + strlen(op))) return;
    frame_put_u32(&b, TAG_FS_WATCH_ID, w->id);
    frame_put_text(&b, TAG_FS_NAME, name);
    frame_put_text(&b, TAG_FS_OP, op);
    frame_send(&b);
}

static void watch_free(size_t slot)
{
    struct fs_watch *w = watches[slot];
    if (!w) return;
    close(w->fd); /* drops every inotify watch of it */
    for (size_t i = 0; i < w->ndirs; i++) free(w->dirs[i].rel);
    free(w->dirs);
    free(w->last_name);
    free(w);
    watches[slot] = NULL;
}

static struct watched_dir *watch_dir_by_wd(struct fs_watch *w, int wd)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd) return &w->dirs[i];
    return NULL;
}

static void join_rel(char *out, size_t cap, const char *rel, const char *name)
{
    if (!rel[0]) snprintf(out, cap, "%s", name);
    else if (!name[0]) snprintf(out, cap, "%s", rel);
    else snprintf(out, cap, "%s/%s", rel, name);
}

/* Watches the directory rel (under the root); false when the per-watch limit is reached. */
static bool watch_add_dir(struct fs_watch *w, const char *rel, int *err)
{
    if (w->ndirs >= WATCH_DIRS_MAX) {
        if (!w->full) {
            w->full = true;
            send_watch_event(w, rel, "overflow");
        }
        return false;
    }
    char path[PATH_MAX];
    int n = rel[0] ? snprintf(path, sizeof path, "%s/%s", w->root, rel) : snprintf(path, sizeof path, "%s", w->root);
    if (n < 0 || (size_t)n >= sizeof path) return false;
    int wd = inotify_add_watch(w->fd, path, WATCH_MASK);
    if (wd < 0) {
        if (err) *err = errno;
        return false;
    }
    struct watched_dir *existing = watch_dir_by_wd(w, wd);
    if (existing) {
        /* The same directory again (it was moved within the tree): the new name wins. */
        char *copy = strdup(rel);
        if (copy) {
            free(existing->rel);
            existing->rel = copy;
        }
        return true;
    }
    struct watched_dir *bigger = realloc(w->dirs, (w->ndirs + 1) * sizeof *bigger);
    char *copy = strdup(rel);
    if (!bigger || !copy) {
        if (bigger) w->dirs = bigger;
        free(copy);
        inotify_rm_watch(w->fd, wd);
        return false;
    }
    w->dirs = bigger;
    w->dirs[w->ndirs].wd = wd;
    w->dirs[w->ndirs].rel = copy;
    w->ndirs++;
    return true;
}

/* Watches rel and every directory under it. With announce, each entry found is reported as
   created: it may have appeared before its directory was watched (at most WATCH_SYNTHETIC_MAX). */
static void watch_add_tree(struct fs_watch *w, const char *rel, bool announce, unsigned *announced, int depth)
{
    if (depth > REMOVE_DEPTH_MAX || !watch_add_dir(w, rel, NULL)) return;
    char path[PATH_MAX];
    int n = rel[0] ? snprintf(path, sizeof path, "%s/%s", w->root, rel) : snprintf(path, sizeof path, "%s", w->root);
    if (n < 0 || (size_t)n >= sizeof path) return;
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char child[PATH_MAX];
        join_rel(child, sizeof child, rel, de->d_name);
        if (announce && *announced < WATCH_SYNTHETIC_MAX) {
            send_watch_event(w, child, "create");
            (*announced)++;
        }
        bool is_dir = de->d_type == DT_DIR;
        if (de->d_type == DT_UNKNOWN) {
            struct stat st;
            is_dir = fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
        }
        if (is_dir) watch_add_tree(w, child, announce, announced, depth + 1);
    }
    closedir(d);
}

/* Stops watching rel and everything under it (it was moved away or removed). */
static void watch_drop_tree(struct fs_watch *w, const char *rel)
{
    size_t len = strlen(rel);
    for (size_t i = 0; i < w->ndirs;) {
        const char *r = w->dirs[i].rel;
        if (strncmp(r, rel, len) == 0 && (r[len] == '\0' || r[len] == '/')) {
            inotify_rm_watch(w->fd, w->dirs[i].wd);
            free(w->dirs[i].rel);
            w->dirs[i] = w->dirs[--w->ndirs];
        } else {
            i++;
        }
    }
}

static void handle_watch(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[PATH_MAX];
    bool have_path = false;
    uint8_t recursive = 0;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag == TAG_FS_PATH) {
            if (!resolve_path(id, &f, "PATH", path)) return;
            have_path = true;
        } else if (f.tag == TAG_FS_RECURSIVE) {
            if (!tlv_as_u8(&f, &recursive)) reject_request(id, "bad_request", "RECURSIVE must be a u8");
        }
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_WATCH payload is truncated");
    if (!have_path) reject_request(id, "bad_request", "PATH is required");

    struct stat st;
    if (stat(path, &st) != 0) reject_errno(id, errno, "%s", path);
    if (!S_ISDIR(st.st_mode)) reject_request(id, "not_a_directory", "%s is not a directory", path);
    size_t slot = 0;
    while (slot < WATCHES_MAX && watches[slot]) slot++;
    if (slot == WATCHES_MAX) reject_request(id, "too_many_watches", "at most %u directory watches at a time; stop one first", WATCHES_MAX);

    struct fs_watch *w = calloc(1, sizeof *w);
    if (!w) reject_request(id, "fs_failed", "out of memory");
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        int e = errno;
        free(w);
        reject_errno(id, e, "inotify");
    }
    w->recursive = recursive != 0;
    snprintf(w->root, sizeof w->root, "%s", path);
    watches[slot] = w;
    int err = 0;
    if (!watch_add_dir(w, "", &err)) {
        watch_free(slot);
        reject_errno(id, err ? err : ENOMEM, "%s", path);
    }
    w->id = next_watch_id++;
    if (next_watch_id == 0) next_watch_id = 1;

    struct frame_builder b;
    if (!frame_begin(&b, MSG_FS_WATCHING, id, 16)) {
        watch_free(slot);
        reject_request(id, "fs_failed", "out of memory");
    }
    frame_put_u32(&b, TAG_FS_WATCH_ID, w->id);
    frame_send(&b);
    /* Subdirectories after the reply, so that any overflow event follows it. */
    if (w->recursive && w->ndirs == 1) {
        char root_path[PATH_MAX];
        snprintf(root_path, sizeof root_path, "%s", w->root);
        DIR *d = opendir(root_path);
        if (d) {
            struct dirent *de;
            unsigned none = 0;
            while ((de = readdir(d)) != NULL) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
                struct stat sub;
                if (fstatat(dirfd(d), de->d_name, &sub, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sub.st_mode))
                    watch_add_tree(w, de->d_name, false, &none, 1);
            }
            closedir(d);
        }
    }
}

static void handle_unwatch(uint32_t id, const uint8_t *payload, size_t len)
{
    uint32_t watch_id = 0;
    bool have_id = false;
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
        if (f.tag != TAG_FS_WATCH_ID) continue;
        if (!tlv_as_u32(&f, &watch_id)) reject_request(id, "bad_request", "WATCH_ID must be a u32");
        have_id = true;
    }
    if (rc < 0) reject_request(id, "bad_request", "FS_UNWATCH payload is truncated");
    if (!have_id) reject_request(id, "bad_request", "WATCH_ID is required");
    for (size_t slot = 0; slot < WATCHES_MAX; slot++) {
        if (watches[slot] && watches[slot]->id == watch_id) {
            watch_free(slot);
            reply_ok(id);
            return;
        }
    }
    reject_request(id, "watch_not_found", "no watch %u", watch_id);
}

/* The watch ends on its own: its directory was removed or moved away. */
static void watch_end(size_t slot, const char *why)
{
    struct fs_watch *w = watches[slot];
    free(w->last_name);
    w->last_name = NULL;
    send_watch_event(w, why, "end");
    watch_free(slot);
}

static void watch_handle_event(size_t slot, const struct inotify_event *ev)
{
    struct fs_watch *w = watches[slot];
    if (ev->mask & IN_Q_OVERFLOW) {
        send_watch_event(w, "", "overflow");
        return;
    }
    struct watched_dir *dir = watch_dir_by_wd(w, ev->wd);
    if (!dir) return; /* a directory dropped meanwhile */
    bool is_root = dir->rel[0] == '\0';
    if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
        if (is_root) watch_end(slot, (ev->mask & IN_MOVE_SELF) ? "moved" : "removed");
        else if (ev->mask & IN_IGNORED) watch_drop_tree(w, dir->rel);
        return;
    }
    char name[PATH_MAX];
    join_rel(name, sizeof name, dir->rel, ev->len ? ev->name : "");
    const char *op = NULL;
    if (ev->mask & IN_CREATE) op = "create";
    else if (ev->mask & IN_MOVED_TO) op = "create";
    else if (ev->mask & IN_DELETE) op = "remove";
    else if (ev->mask & IN_MOVED_FROM) op = "rename";
    else if (ev->mask & IN_MODIFY) op = "write";
    else if (ev->mask & IN_ATTRIB) op = "chmod";
    if (!op) return;
    send_watch_event(w, name, op);
    if (!w->recursive || !(ev->mask & IN_ISDIR)) return;
    if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        unsigned announced = 0;
        watch_add_tree(w, name, true, &announced, 1);
    } else if (ev->mask & IN_MOVED_FROM) {
        watch_drop_tree(w, name);
    }
}

static void watch_read(size_t slot)
{
    struct fs_watch *w = watches[slot];
    char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n = read(w->fd, buf, sizeof buf);
    if (n <= 0) return;
    free(w->last_name);
    w->last_name = NULL;
    for (char *p = buf; p < buf + n;) {
        const struct inotify_event *ev = (const struct inotify_event *)p;
        p += sizeof *ev + ev->len;
        watch_handle_event(slot, ev);
        if (!watches[slot]) return; /* ended */
    }
}

/* ----------------------------------------------------------- FS_USAGE */

/* How full the guest's root file system is, as `df /` says it (the overlay reports its writable
   upper layer's file system). Only "/", never a path the host names: statvfs on a network or
   FUSE mount a command made could block the poll loop. */
static void handle_usage(uint32_t id, const uint8_t *payload, size_t len)
{
    if (!tlv_well_formed(payload, len)) reject_request(id, "bad_request", "FS_USAGE payload is truncated");
    struct statvfs sv;
    if (statvfs("/", &sv) != 0) reject_errno(id, errno, "statvfs /");
    uint64_t unit = sv.f_frsize ? sv.f_frsize : sv.f_bsize;
    struct frame_builder b;
    if (!frame_begin(&b, MSG_FS_USAGE_RESULT, id, 64)) return;
    frame_put_u64(&b, TAG_FS_TOTAL_BYTES, (uint64_t)sv.f_blocks * unit);
    frame_put_u64(&b, TAG_FS_FREE_BYTES, (uint64_t)sv.f_bfree * unit);
    frame_put_u64(&b, TAG_FS_AVAILABLE_BYTES, (uint64_t)sv.f_bavail * unit);
    frame_send(&b);
}

/* ----------------------------------------------------------- the loop */

void fs_add_poll_fds(struct poll_set *ps)
{
    /* While the host does not read our output, events wait in the kernel (which reports an
       overflow once its queue is full) instead of in our memory. */
    if (output_backpressured()) return;
    for (size_t slot = 0; slot < WATCHES_MAX; slot++)
        if (watches[slot]) poll_set_add(ps, watches[slot]->fd, POLLIN, POLL_FS_WATCH);
}

void fs_handle_poll(int fd, short revents)
{
    (void)revents;
    for (size_t slot = 0; slot < WATCHES_MAX; slot++)
        if (watches[slot] && watches[slot]->fd == fd) {
            watch_read(slot);
            return;
        }
}

void fs_forget_watches(void)
{
    for (size_t slot = 0; slot < WATCHES_MAX; slot++) watch_free(slot);
}

bool fs_handle_request(uint16_t type, uint32_t id, const uint8_t *payload, size_t len)
{
    switch (type) {
    case MSG_FS_STAT: handle_stat(id, payload, len); return true;
    case MSG_FS_LIST: handle_list(id, payload, len); return true;
    case MSG_FS_MKDIR: handle_mkdir(id, payload, len); return true;
    case MSG_FS_REMOVE: handle_remove(id, payload, len); return true;
    case MSG_FS_RENAME: handle_rename(id, payload, len); return true;
    case MSG_FS_WATCH: handle_watch(id, payload, len); return true;
    case MSG_FS_UNWATCH: handle_unwatch(id, payload, len); return true;
    case MSG_FS_USAGE: handle_usage(id, payload, len); return true;
    default: return false;
    }
}
