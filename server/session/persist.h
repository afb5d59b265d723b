/* persist.h - a KV-cache session's state in and out of the session table
 * (SPEC section 11): the state file of one session (GET
 * /v1/sessions/{id}/state), a state file restored as a new session on any
 * replica that serves the same model (POST /v1/sessions with the file as
 * its body), and every session saved to sessions.save_dir by a draining
 * daemon, then loaded by the next start.
 *
 * The file's format is state.c's; the sessions are session.c's. What is
 * checked here is whether a file fits this server: a model of its name,
 * the same weights (their fingerprint as loaded), the same cache shape and
 * precision. No HTTP; the folder's files are read and written here.
 */
#ifndef ATTND_PERSIST_H
#define ATTND_PERSIST_H

#include <stddef.h>

#include "../base/buffer.h"
#include "../base/reply.h"
#include "../body/request.h"
#include "session.h"

/* What moving state reads. */
typedef struct {
    attnd_sessions *table;      /* borrowed */
    const attnd_parse_env *env; /* the served models (names, hyper-parameters, fingerprints) */
} attnd_persist_env;

/* Appends the state file of session id to out. Returns 0, or -1 with e
 * set: 404 (no such session), 409 (a step of it is queued or computing),
 * 500 (out of memory). */
int attnd_session_export(const attnd_persist_env *p, const char *id, double now, attnd_sbuf *out,
                         attnd_error *e);

/* What a restore made. */
typedef struct {
    char id[ATTND_SESSION_ID_LEN + 1];
    int model;                 /* its model's slot (models/registry.h) */
    char name[ATTND_NAME_MAX]; /* its model's name */
    int version;               /* the version it was restored on */
    int tokens;                /* cached tokens */
} attnd_restored;

/* Restores the state file bytes[0..n) as a new session whose id is want_id
 * when that is free, else (or when want_id is NULL) a new one. Returns 0
 * and fills out, or -1 with e set (and *retry_after_s > 0 with a 429): 400
 * for a file that is malformed, truncated or lies (its sentence says what
 * is wrong), 409 when this server serves no model of its name, or one with
 * other weights (another fingerprint) or another cache precision; the 400,
 * 413 and 429 of an open for the rest (a malformed id, its limits). */
int attnd_session_restore(const attnd_persist_env *p, const unsigned char *bytes, size_t n,
                          const char *want_id, double now, attnd_restored *out, attnd_error *e,
                          int *retry_after_s);

/* sessions.save_dir made ready at start: created (mode 0700) when it does
 * not exist (its parent must), else checked: a folder, owned by the
 * daemon's user, with no access for group or others (saved caches are
 * their callers' data), writable. Returns 0, or -1 with a sentence in err
 * that names the folder and what to do. */
int attnd_save_dir_ready(const char *dir, char *err, size_t errlen);

/* At start: every <id>.safetensors file of dir restored as session <id>,
 * then removed, so a crash loop never restores stale state twice; a file
 * refused (malformed, of another model or weights, past a limit) is
 * renamed <id>.safetensors.refused and logged, and <id>.safetensors.part
 * files (a save cut short) are removed. Logs what it loaded. Returns the
 * sessions loaded. */
int attnd_sessions_load(const attnd_persist_env *p, const char *dir, double now);

/* At the end of a drain (no step running): every open session saved as
 * dir/<id>.safetensors (mode 0600, written as .part, synced, then renamed).
 * Logs what it saved and each failure. Returns the sessions that could not
 * be saved (0: none lost). */
int attnd_sessions_save(const attnd_persist_env *p, const char *dir, double now);

#endif
