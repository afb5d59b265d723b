/* confine.c - a path kept inside a folder (attnd_path_confine, config.h):
 * what a repository load's weights path must pass, since it comes from a
 * client and not from the operator's config file. ".." is refused before
 * any look at the disk; then the path is resolved as the kernel would open
 * it (realpath: symbolic links followed) and must land inside the folder,
 * itself resolved. It opens no file and knows no key but server.model_dir,
 * which its sentences name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "refuse.h"

/* 1 when one of path's components, between slashes, is "..". */
static int has_dotdot(const char *path) {
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.') return 1;
        p += n;
        while (*p == '/')
            p++;
    }
    return 0;
}

/* 1 when real (resolved) lies strictly inside the folder rdir (resolved). */
static int inside(const char *rdir, const char *real) {
    size_t n = strlen(rdir);
    if (n == 1) return real[0] == '/' && real[1] != '\0'; /* the folder is "/" */
    return strncmp(real, rdir, n) == 0 && real[n] == '/' && real[n + 1] != '\0';
}

/* path taken from rdir when relative, in a new string (NULL: no memory). */
static char *joined(const char *rdir, const char *path) {
    if (path[0] == '/') return strdup(path);
    size_t n = strlen(rdir) + strlen(path) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", rdir, path);
    return s;
}

/* Why real, which path resolved to, is not a file inside dir; -1. */
static int outside(const char *dir, const char *path, const char *rdir, const char *real, char *err,
                   size_t errlen) {
    if (strcmp(real, rdir) == 0)
        return cfg_fail(err, errlen, "'%s' names the model folder %s (server.model_dir) itself.",
                        path, dir);
    if (path[0] == '/')
        return cfg_fail(err, errlen, "'%s' is outside the model folder %s (server.model_dir).",
                        path, dir);
    /* relative and without "..": only a symbolic link can lead out */
    return cfg_fail(err, errlen,
                    "'%s' leaves the model folder %s (server.model_dir) through a symbolic link.",
                    path, dir);
}

int attnd_path_confine(const char *dir, const char *path, char **resolved, char *err,
                       size_t errlen) {
    char *rdir = NULL, *full = NULL, *real = NULL;
    int rc = -1;
    *resolved = NULL;
    if (!dir || !dir[0]) {
        cfg_fail(err, errlen, "'%s': no model folder is set (server.model_dir).", path);
        goto cleanup;
    }
    if (!path[0]) {
        cfg_fail(err, errlen,
                 "an empty path names no file in the model folder %s "
                 "(server.model_dir).",
                 dir);
        goto cleanup;
    }
    if (has_dotdot(path)) {
        cfg_fail(err, errlen,
                 "'%s' leaves the model folder %s (server.model_dir): '..' is not "
                 "allowed in a path.",
                 path, dir);
        goto cleanup;
    }
    rdir = realpath(dir, NULL);
    if (!rdir) {
        cfg_fail(
            err, errlen,
            "cannot look for '%s': the model folder %s (server.model_dir) cannot be opened: %s.",
            path, dir, strerror(errno));
        goto cleanup;
    }
    full = joined(rdir, path);
    if (!full) {
        cfg_fail(err, errlen, "'%s': out of memory.", path);
        goto cleanup;
    }
    real = realpath(full, NULL);
    if (!real) { /* the path stays inside, but names no file it can open */
        cfg_fail(err, errlen, "cannot open '%s' in the model folder %s (server.model_dir): %s.",
                 path, dir, strerror(errno));
        rc = -2;
        goto cleanup;
    }
    if (!inside(rdir, real)) {
        outside(dir, path, rdir, real, err, errlen);
        goto cleanup;
    }
    *resolved = real;
    real = NULL;
    rc = 0;
cleanup:
    free(real);
    free(full);
    free(rdir);
    return rc;
}
