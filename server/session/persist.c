/* persist.c - sessions' state in and out of the table (persist.h): one
 * session as a state file, a state file restored as a session, and every
 * session saved to, and loaded from, sessions.save_dir.
 *
 * A restore checks the file (state.c), then that it fits this server: a
 * model of its name (409 when none), the same weights as loaded (409 when
 * the fingerprint differs), the cache's heads and width (400: a file that
 * claims the weights but not their shape lies) and precision (409). It
 * then opens the session through the table (its limits, its id rules) with
 * the file's rows as its prefix, kept at once: a restored session
 * continues at position `length`, as the one it came from.
 */
#include "persist.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../obs/log.h"
#include "state.h"

#define STATE_EXT ".safetensors"
#define PART_EXT ".safetensors.part"
#define REFUSED_EXT ".safetensors.refused"

/* The sentence of a config/ refusal as an API error: its final period off. */
static int refuse(attnd_error *e, attnd_kind k, const char *sentence) {
    size_t n = strlen(sentence);
    if (n && sentence[n - 1] == '.') n--;
    return attnd_set_error(e, k, "%.*s", (int)n, sentence);
}

/* ---- one session -------------------------------------------------------------- */

/* The state of held step's cache, of model m, into st: its float rows as
 * they are, or a bf16 cache's pages as rows of bf16 bits (*rows, the
 * caller's to free). -1 when out of memory. */
static int state_of(const attnd_session_step *step, const attnd_model_info *m, attnd_state *st,
                    uint16_t **rows) {
    int G = m->hp.num_kv_heads, D = m->hp.head_dim;
    *st = (attnd_state){.model = (char *)m->name,
                        .fingerprint = (char *)m->fingerprint,
                        .precision = m->kv16 ? ATTND_STATE_BF16 : ATTND_STATE_FP32,
                        .int8 = m->precision == ATTN_INT8,
                        .len = step->len,
                        .G = G,
                        .D = D,
                        .kv = step->kv};
    *rows = NULL;
    if (!m->kv16 || step->len == 0) return 0;
    *rows = malloc((size_t)step->len * 2 * (size_t)G * (size_t)D * sizeof(uint16_t));
    if (!*rows) return -1;
    attn_kv16_to_rows(step->kv, G, D, (size_t)step->len, *rows);
    st->kv = *rows;
    return 0;
}

int attnd_session_export(const attnd_persist_env *p, const char *id, double now, attnd_sbuf *out,
                         attnd_error *e) {
    attnd_session_step step;
    attnd_session_status s = attnd_session_hold(p->table, id, now, &step);
    if (s != SESS_OK) return attnd_session_refusal(s, id, NULL, e);
    attnd_state st;
    uint16_t *rows;
    char err[256] = "out of memory writing the state";
    int rc = state_of(&step, &((attnd_version *)step.model)->info, &st, &rows);
    if (rc == 0) rc = attnd_state_write(out, &st, err, sizeof err);
    attnd_session_end(p->table, &step, 0, now); /* read only: nothing to keep */
    free(rows);
    if (rc < 0) return refuse(e, AERR_INTERNAL, err);
    if (out->oom) return attnd_set_error(e, AERR_INTERNAL, "out of memory writing the state");
    return 0;
}

/* Whether the read state st fits model m of this server: 0, or -1 with the
 * 400 or 409 that says why not. */
static int state_fits(const attnd_state *st, const attnd_model_info *m, attnd_error *e) {
    const attn_hparams *hp = &m->hp;
    if (!m->fingerprint || strcmp(st->fingerprint, m->fingerprint) != 0)
        return attnd_set_error(e, AERR_CONFLICT,
                               "the state's fingerprint %.40s is not that of model '%s' as "
                               "loaded here (%s): its weights or hyper-parameters differ, so its "
                               "cache would give other answers",
                               st->fingerprint, m->name, m->fingerprint ? m->fingerprint : "none");
    if (st->G != hp->num_kv_heads || st->D != hp->head_dim)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "the state's keys are (%d, %d, %d) but model '%s' caches %d "
                               "key/value heads of width %d: the file does not hold what its "
                               "fingerprint claims",
                               st->len, st->G, st->D, m->name, hp->num_kv_heads, hp->head_dim);
    attnd_state_precision here = m->kv16 ? ATTND_STATE_BF16 : ATTND_STATE_FP32;
    if (st->int8 != (m->precision == ATTN_INT8))
        return attnd_set_error(e, AERR_CONFLICT,
                               "the state was saved %s an int8 model, and model '%s' computes in "
                               "%s here",
                               st->int8 ? "by" : "by other than", m->name,
                               m->precision == ATTN_INT8 ? "int8" : "another precision");
    if (st->precision != here)
        return attnd_set_error(e, AERR_CONFLICT,
                               "the state's cache is %s, and model '%s' keeps its sessions' "
                               "caches in %s here",
                               st->precision == ATTND_STATE_BF16 ? "bf16" : "fp32", m->name,
                               here == ATTND_STATE_BF16 ? "bf16" : "fp32");
    return attnd_model_sessions_refusal(m, e);
}

/* The version of the model st names that it was saved on (its
 * fingerprint), with a reference: the one serving, or an older one still
 * held by sessions; else the one serving, which state_fits refuses by its
 * fingerprint. NULL with the 409 when the model is not served. */
static attnd_version *state_model(const attnd_persist_env *p, const attnd_state *st,
                                  attnd_error *e) {
    attnd_version *v = attnd_models_find(p->env->models, st->model, st->fingerprint);
    if (v) return v;
    attnd_error unknown;
    if ((v = attnd_models_get(p->env->models, st->model, &unknown))) return v;
    const char *loaded = strstr(unknown.msg, " (loaded: ");
    attnd_set_error(e, AERR_CONFLICT,
                    "the state is of model '%.64s', which this server does not serve%s", st->model,
                    loaded ? loaded : "");
    return NULL;
}

/* Opens the session of st on version v, its rows kept at once. */
static int open_with(const attnd_persist_env *p, const attnd_state *st, attnd_version *v,
                     const char *want_id, double now, attnd_restored *out, attnd_error *e,
                     int *retry) {
    const attnd_model_info *m = &v->info;
    attnd_cache_shape shape = attnd_session_cache_shape(st->G, st->D, m->kv16);
    int max_len = m->max_positions ? m->max_positions : ATTND_SESSION_MAX_LEN;
    attnd_session_step step;
    attnd_session_status s = attnd_session_open(p->table, v, &shape, st->len, max_len, now, want_id,
                                                out->id, &step, retry);
    if (s == SESS_ID_TAKEN) /* the id is kept only when free: a copy gets its own */
        s = attnd_session_open(p->table, v, &shape, st->len, max_len, now, NULL, out->id, &step,
                               retry);
    if (s != SESS_OK) return attnd_session_refusal(s, NULL, &step.over, e);
    if (st->len && m->kv16) /* the file's rows into the cache's zeroed pages */
        attn_kv16_from_rows(step.kv, st->G, st->D, (size_t)st->len, st->kv);
    else if (st->len)
        memcpy(step.kv, st->kv, (size_t)st->len * shape.row_bytes);
    attnd_session_end(p->table, &step, 1, now);
    out->model = v->slot;
    snprintf(out->name, sizeof out->name, "%s", v->name);
    out->version = v->info.version;
    out->tokens = st->len;
    return 0;
}

int attnd_session_restore(const attnd_persist_env *p, const unsigned char *bytes, size_t n,
                          const char *want_id, double now, attnd_restored *out, attnd_error *e,
                          int *retry_after_s) {
    attnd_state st;
    attnd_state_limits lim = {.max_bytes = n, .max_tokens = ATTND_SESSION_MAX_LEN};
    char err[256];
    int rc = -1;
    attnd_version *v = NULL;
    *retry_after_s = 0;
    if (attnd_state_read(bytes, n, &lim, &st, err, sizeof err) < 0)
        return refuse(e, AERR_BAD_REQUEST, err);
    if (!(v = state_model(p, &st, e)) || state_fits(&st, &v->info, e) < 0) goto cleanup;
    rc = open_with(p, &st, v, want_id, now, out, e, retry_after_s);
cleanup:
    attnd_version_unref(v);
    attnd_state_free(&st);
    return rc;
}

/* ---- the folder ---------------------------------------------------------------- */

int attnd_save_dir_ready(const char *dir, char *err, size_t errlen) {
    struct stat sb;
    if (mkdir(dir, 0700) == 0) {
        attnd_log(LOG_INFO, "sessions.save_dir %s: made (mode 0700)", dir);
        return 0;
    }
    if (errno != EEXIST || stat(dir, &sb) != 0) {
        snprintf(err, errlen, "sessions.save_dir: cannot make or open folder \"%s\": %s", dir,
                 strerror(errno));
        return -1;
    }
    const char *why = !S_ISDIR(sb.st_mode)           ? "is not a folder"
                      : sb.st_uid != geteuid()       ? "is owned by another user"
                      : (sb.st_mode & 077)           ? "is open to its group or others"
                      : access(dir, W_OK | X_OK) < 0 ? "is not writable by the daemon's user"
                                                     : NULL;
    if (!why) return 0;
    snprintf(err, errlen,
             "sessions.save_dir: \"%s\" %s (owner uid %u, mode %04o; the daemon runs as uid %u): "
             "saved sessions are their callers' data, so the folder must belong to the daemon's "
             "user with mode 0700 (chmod 700 it, or name a folder that does not exist yet and "
             "attnd makes it so)",
             dir, why, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777), (unsigned)geteuid());
    return -1;
}

/* Whether name is "<32 hex>" followed by ext; the id into id. */
static int id_file(const char *name, const char *ext, char id[ATTND_SESSION_ID_LEN + 1]) {
    size_t n = strlen(name);
    if (n != ATTND_SESSION_ID_LEN + strlen(ext) || strcmp(name + ATTND_SESSION_ID_LEN, ext) != 0)
        return 0;
    memcpy(id, name, ATTND_SESSION_ID_LEN);
    id[ATTND_SESSION_ID_LEN] = '\0';
    return strspn(id, "0123456789abcdef") == ATTND_SESSION_ID_LEN;
}

/* The bytes of regular file path (not a link), at most max; NULL with a
 * sentence in why. */
static unsigned char *read_file(const char *path, size_t max, size_t *n, char *why, size_t cap) {
    unsigned char *buf = NULL;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > max) {
        snprintf(why, cap, "%s", fd < 0 ? strerror(errno) : "not a regular file of its size");
        goto cleanup;
    }
    buf = malloc(sb.st_size ? (size_t)sb.st_size : 1);
    size_t got = 0;
    while (buf && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r <= 0 && !(r < 0 && errno == EINTR)) break;
        got += r > 0 ? (size_t)r : 0;
    }
    if (!buf || got != (size_t)sb.st_size) {
        snprintf(why, cap, "%s", buf ? "cut short while read" : "out of memory");
        free(buf);
        buf = NULL;
    }
    *n = got;
cleanup:
    if (fd >= 0) close(fd);
    return buf;
}

/* Loads one saved session's file: restored, then removed; refused, then
 * renamed .refused. Returns 1 when it was loaded. */
static int load_one(const attnd_persist_env *p, const char *dir, const char *name, const char *id,
                    size_t max, double now) {
    char path[4200], why[200];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unsigned char *bytes = read_file(path, max, &n, why, sizeof why);
    attnd_error e = {AOK, ""};
    attnd_restored r;
    int retry, restored = bytes && attnd_session_restore(p, bytes, n, id, now, &r, &e, &retry) == 0;
    if (!bytes) snprintf(e.msg, sizeof e.msg, "%s", why);
    free(bytes);
    if (restored) {
        if (unlink(path) != 0 && errno != ENOENT)
            attnd_log(LOG_ERROR,
                      "sessions.save_dir: %s loaded, but cannot be removed (%s): remove it "
                      "before the next start, or it is loaded again",
                      path, strerror(errno));
        return 1;
    }
    char kept[4200];
    snprintf(kept, sizeof kept, "%s/%s%s", dir, id, REFUSED_EXT);
    attnd_log(LOG_WARN, "sessions.save_dir: %s not loaded (%s); kept as %s", path,
              e.msg[0] ? e.msg : strerror(errno), rename(path, kept) == 0 ? kept : "it is");
    return 0;
}

int attnd_sessions_load(const attnd_persist_env *p, const char *dir, double now) {
    DIR *d = opendir(dir);
    if (!d) {
        attnd_log(LOG_ERROR, "sessions.save_dir %s: cannot read it: %s", dir, strerror(errno));
        return 0;
    }
    /* a file holds at most one session's cache, its positions and a header */
    attnd_session_limits lim;
    attnd_sessions_limits(p->table, &lim);
    size_t max = (size_t)lim.max_bytes_per_session * 3 / 2 + (64u << 20);
    int loaded = 0, seen = 0;
    struct dirent *de;
    char id[ATTND_SESSION_ID_LEN + 1], path[4200];
    while ((de = readdir(d))) {
        if (id_file(de->d_name, PART_EXT, id)) { /* a save cut short: never complete */
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        } else if (id_file(de->d_name, STATE_EXT, id)) {
            seen++;
            loaded += load_one(p, dir, de->d_name, id, max, now);
        }
    }
    closedir(d);
    if (seen)
        attnd_log(LOG_INFO, "sessions.save_dir %s: %d session%s loaded, %d refused", dir, loaded,
                  loaded == 1 ? "" : "s", seen - loaded);
    return loaded;
}

/* Writes n bytes to a new file path, mode 0600, synced. 0, or -1 (errno). */
static int write_new(const char *path, const char *bytes, size_t n) {
    unlink(path); /* a .part left by an earlier save cut short */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t put = 0;
    while (put < n) {
        ssize_t w = write(fd, bytes + put, n - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        put += (size_t)w;
    }
    int rc = put == n && fsync(fd) == 0 ? 0 : -1;
    int saved = errno;
    close(fd);
    if (rc < 0) unlink(path);
    errno = saved;
    return rc;
}

/* Saves session id into dir: 1, or 0 when it ended meanwhile, or -1
 * (logged). *bytes grows by its size. */
static int save_one(const attnd_persist_env *p, const char *dir, const char *id, double now,
                    long long *bytes) {
    attnd_sbuf b;
    attnd_error e = {AOK, ""};
    char part[4200], path[4200];
    int rc = -1;
    attnd_sb_init(&b);
    snprintf(part, sizeof part, "%s/%s%s", dir, id, PART_EXT);
    snprintf(path, sizeof path, "%s/%s%s", dir, id, STATE_EXT);
    if (attnd_session_export(p, id, now, &b, &e) < 0) {
        if (e.code == AERR_NOT_FOUND) rc = 0; /* it ended meanwhile: nothing to keep */
        goto cleanup;
    }
    if (write_new(part, b.p, b.len) < 0 || rename(part, path) < 0) {
        snprintf(e.msg, sizeof e.msg, "%s", strerror(errno));
        goto cleanup;
    }
    *bytes += (long long)b.len;
    rc = 1;
cleanup:
    if (rc < 0) attnd_log(LOG_ERROR, "sessions.save_dir: session %s not saved: %s", id, e.msg);
    attnd_sb_free(&b);
    return rc;
}

int attnd_sessions_save(const attnd_persist_env *p, const char *dir, double now) {
    int n = attnd_sessions_list(p->table, now, NULL, 0), lost = 0, saved = 0;
    char(*ids)[ATTND_SESSION_ID_LEN + 1] = n ? calloc((size_t)n, sizeof *ids) : NULL;
    long long bytes = 0;
    if (n && !ids) {
        attnd_log(LOG_ERROR, "sessions.save_dir: out of memory: %d sessions not saved", n);
        return n;
    }
    n = n ? attnd_sessions_list(p->table, now, ids, n) : 0; /* no step runs: none is added */
    for (int i = 0; i < n; i++) {
        int r = save_one(p, dir, ids[i], now, &bytes);
        lost += r < 0;
        saved += r > 0;
    }
    free(ids);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the renames, durable */
    if (fd >= 0) fsync(fd), close(fd);
    attnd_log(lost ? LOG_ERROR : LOG_INFO,
              "sessions.save_dir %s: %d session%s saved (%lld bytes)%s", dir, saved,
              saved == 1 ? "" : "s", bytes, lost ? ", some not: see above" : "");
    return lost;
}
