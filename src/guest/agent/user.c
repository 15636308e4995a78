/*
 * Running as a user: a request's USER field names an account of the sandbox's image, looked up in
 * its /etc/passwd and /etc/group (the image's own files, read on every request: an exec may have
 * run `useradd` a moment ago). An exec or a process then runs with that account's uid, gid and
 * supplementary groups, HOME, USER and LOGNAME, and starts in its home unless CWD says otherwise. A
 * file request (and an exec's files) is done by the agent, as E2B's envd does it: what it creates —
 * the file, the directories made for it — is the account's, its relative paths are under the
 * account's home, and the account's permissions are not what decides (the agent is root). Without
 * USER everything is root's, as before.
 */
#include "agent.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool parse_id(const char *s, uint32_t *out)
{
    if (!*s) return false;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v > 0xfffffffeul) return false;
    *out = (uint32_t)v;
    return true;
}

/* Splits a colon-separated line in place into at most `max` fields; returns how many. */
static size_t split_fields(char *line, char **fields, size_t max)
{
    size_t n = 0;
    char *p = line;
    while (n < max) {
        fields[n++] = p;
        char *colon = strchr(p, ':');
        if (!colon) break;
        *colon = '\0';
        p = colon + 1;
    }
    char *nl = strchr(fields[n - 1], '\n');
    if (nl) *nl = '\0';
    return n;
}

/* Whether `name` is in the comma-separated member list. */
static bool listed(const char *members, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = members; *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) return true;
        if (!comma) break;
        p = comma + 1;
    }
    return false;
}

static void add_group(struct run_as *u, gid_t gid)
{
    for (size_t i = 0; i < u->group_count; i++)
        if (u->groups[i] == gid) return;
    if (u->group_count < RUN_AS_GROUPS_MAX) u->groups[u->group_count++] = gid;
}

bool run_as_lookup(const struct tlv_field *f, struct run_as *u, char *why, size_t why_cap)
{
    memset(u, 0, sizeof *u);
    if (f->len == 0 || f->len > RUN_AS_NAME_MAX || tlv_has_nul(f) || memchr(f->value, ':', f->len) || memchr(f->value, '\n', f->len)) {
        snprintf(why, why_cap, "USER must be an account name of 1 to %d bytes without NUL, ':' or newline", RUN_AS_NAME_MAX);
        return false;
    }
    tlv_copy_text(f, u->name, sizeof u->name);

    FILE *passwd = fopen("/etc/passwd", "re");
    bool found = false;
    if (passwd) {
        char line[1024];
        char *fields[7];
        while (!found && fgets(line, sizeof line, passwd)) {
            if (split_fields(line, fields, 7) < 7 || strcmp(fields[0], u->name) != 0) continue;
            uint32_t uid, gid;
            if (!parse_id(fields[2], &uid) || !parse_id(fields[3], &gid)) continue;
            u->uid = uid;
            u->gid = gid;
            snprintf(u->home, sizeof u->home, "%s", fields[5][0] == '/' ? fields[5] : "/");
            found = true;
        }
        fclose(passwd);
    }
    if (!found && strcmp(u->name, "root") == 0) {
        /* root needs no entry (busybox images have one anyway). */
        snprintf(u->home, sizeof u->home, "/root");
        found = true;
    }
    if (!found) {
        snprintf(why, why_cap, "no user %s in the sandbox's /etc/passwd", u->name);
        return false;
    }

    add_group(u, u->gid);
    FILE *group = fopen("/etc/group", "re");
    if (group) {
        char line[4096];
        char *fields[4];
        while (fgets(line, sizeof line, group)) {
            uint32_t gid;
            if (split_fields(line, fields, 4) < 4 || !parse_id(fields[2], &gid)) continue;
            if (listed(fields[3], u->name)) add_group(u, gid);
        }
        fclose(group);
    }
    return true;
}

int run_as_become(const struct run_as *u)
{
    if (setgroups(u->group_count, u->groups) != 0) return errno;
    if (setresgid(u->gid, u->gid, u->gid) != 0) return errno;
    if (setresuid(u->uid, u->uid, u->uid) != 0) return errno;
    return 0;
}

void run_as_environment(struct run_as *u, char **envp, size_t *count)
{
    snprintf(u->env_home, sizeof u->env_home, "HOME=%s", u->home);
    snprintf(u->env_user, sizeof u->env_user, "USER=%s", u->name);
    snprintf(u->env_logname, sizeof u->env_logname, "LOGNAME=%s", u->name);
    merge_env(envp, count, u->env_home);
    merge_env(envp, count, u->env_user);
    merge_env(envp, count, u->env_logname);
}

/* While a file request with USER runs: the account that owns what it creates. */
static const struct run_as *owner;

void run_as_own(const struct run_as *u) { owner = u; }

void run_as_disown(void) { owner = NULL; }

void own_path(const char *path)
{
    if (owner) (void)lchown(path, owner->uid, owner->gid);
}

void own_fd(int fd)
{
    if (owner) (void)fchown(fd, owner->uid, owner->gid);
}

int request_run_as(uint32_t id, const uint8_t *payload, size_t len, struct run_as *u)
{
    struct tlv_cursor c;
    struct tlv_field f, user;
    bool found = false;
    tlv_cursor_init(&c, payload, len);
    while (tlv_next(&c, &f) == 1) {
        if (f.tag == TAG_USER) {
            user = f;
            found = true;
        }
    }
    if (!found) return 0;
    char why[256];
    if (!run_as_lookup(&user, u, why, sizeof why)) {
        reply_error(id, "user_not_found", "%s", why);
        return -1;
    }
    return 1;
}

const char *user_cwd(const struct run_as *u) { return access(u->home, F_OK) == 0 ? u->home : "/"; }
