/* session.h - the KV-cache sessions of step-by-step decoding: a table of
 * sessions, each holding the rotated keys and the values of every token it
 * has seen, so that a step sends only its new rows.
 *
 * It owns ids (128 random bits in hex), each session's cache, the idle
 * timeout and the memory budget, and counts what happens for /metrics. It
 * computes nothing and knows no HTTP: the routes ask it for a step, compute
 * into the rows it hands out, and end the step. Thread-safe: one mutex over
 * the table, never held while a step computes. Once started, a thread of
 * its own (the reaper) ends idle sessions without waiting for traffic.
 */
#ifndef ATTND_SESSION_H
#define ATTND_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "../base/buffer.h"
#include "../base/reply.h"

#define ATTND_SESSION_ID_LEN 32 /* hex characters of an id */
/* The tokens a session may hold when its model sets no max_positions. */
#define ATTND_SESSION_MAX_LEN (INT32_MAX / 2)
/* A proposed id holds at least this many different hex digits. */
#define ATTND_SESSION_ID_DIGITS 6

typedef struct {
    int max_sessions;                /* open at once, >= 1 */
    long long max_bytes;             /* all caches together, bytes */
    long long max_bytes_per_session; /* one cache, bytes */
    int idle_s;                      /* a session unused this long ends, seconds */
} attnd_session_limits;

typedef struct {
    int sessions;                       /* open now */
    long long tokens;                   /* cached tokens, all sessions */
    long long bytes;                    /* bytes the caches hold (their capacity) */
    unsigned long long opened;          /* sessions opened, total */
    unsigned long long deleted;         /* closed by their client, total */
    unsigned long long expired;         /* ended by the idle timeout (evictions), total */
    unsigned long long refused_full;    /* opens and steps refused: budget or count full */
    unsigned long long refused_too_big; /* steps refused: past one session's limits */
} attnd_session_stats;

typedef enum {
    SESS_OK = 0,
    SESS_NOT_FOUND, /* no such session: never opened, deleted or expired (404) */
    SESS_BUSY,      /* its previous step is still queued or computing (409) */
    SESS_FULL,      /* the count or the total budget is used up; retry later (429) */
    SESS_TOO_BIG,   /* past max_bytes_per_session (413) */
    SESS_TOO_LONG,  /* past the model's max_len (413) */
    SESS_NOMEM,     /* out of memory (500) */
    SESS_ID_TAKEN,  /* the proposed id is in use (409) */
    SESS_BAD_ID     /* the proposed id is not 32 lowercase hex characters (400) */
} attnd_session_status;

/* A session's cache is one allocation of `cap` tokens in its model's layout
 * (attnd_cache_shape): for an fp32 model, rows, row t holding token t's
 * keys then its values, each (G, D) for G key/value heads of width D
 * (2 * G * D floats, attn_seq.kv); for a model that attends in bf16, pages
 * of 32 tokens of 2 * G * D bf16 (attn_seq.kv16), half the bytes, each page
 * zeroed when the cache grows to it. Tokens [0, len) are the cache; a step
 * appends [len, len + add). The budgets count these real bytes.
 */
/* How a model's cache holds its tokens. */
typedef struct {
    size_t row_bytes; /* bytes a token takes: 2*G*D floats, or 2*G*D bf16 */
    int page;         /* tokens per page, >= 1: the cache grows by whole pages, zeroed (32 for
                         bf16 pages: their slots past the last token must hold zeros) */
} attnd_cache_shape;

/* The cache shape of a model with G key/value heads of width D: bf16
 * pages of ATTN_KV16_PAGE tokens when kv16 (the model attends in bf16),
 * else fp32 rows. */
attnd_cache_shape attnd_session_cache_shape(int G, int D, int kv16);

typedef struct attnd_session attnd_session;
typedef struct attnd_sessions attnd_sessions;

/* Which limit refused an open or a step (SESS_FULL, SESS_TOO_BIG,
 * SESS_TOO_LONG), with the numbers its sentence names. */
typedef enum {
    OVER_NONE = 0,
    OVER_SESSIONS,   /* limits.max_sessions: that many are open (429) */
    OVER_BYTES,      /* limits.max_session_bytes: the caches together (429; 413 when
                        one session alone would pass it) */
    OVER_BYTES_EACH, /* limits.max_session_bytes_each: one session's cache (413) */
    OVER_LENGTH      /* the model's max_positions: the tokens a session may hold (413) */
} attnd_session_limit;

typedef struct {
    attnd_session_limit limit;
    int opening;       /* 1: an open's prefix, 0: a step */
    int tokens;        /* the session's tokens with the rows asked for */
    long long need;    /* bytes its cache would hold then (OVER_BYTES*), or sessions
                          open with it (OVER_SESSIONS) */
    long long held;    /* OVER_BYTES: bytes the caches hold now, this one's included */
    long long max;     /* the limit: bytes, sessions or tokens */
    long long row;     /* bytes a cached token takes */
    long long fit;     /* OVER_BYTES_EACH, OVER_BYTES (413): the tokens max bytes hold, in
                          whole pages */
    int retry_after_s; /* 429: seconds until the first idle session times out */
} attnd_session_over;

/* What a step works on, valid from a successful open or begin to its end. */
typedef struct {
    attnd_session *s;        /* pass to attnd_session_end */
    void *model;             /* the model handle the session was opened with (borrowed:
                                the session holds it while the step is held) */
    void *kv;                /* the cache in shape's layout: tokens [0, len) cached,
                                [len, len+add) to fill (attn_seq.kv or .kv16) */
    attnd_cache_shape shape; /* the session's */
    int len;                 /* cached tokens before the step */
    int add;                 /* tokens the step appends */
    int opening;             /* 1: the step that opened the session; dropped, it takes the
                                session with it (its id was never answered) */
    attnd_session_over over; /* after any refusal of an open or begin: the limit (OVER_NONE
                                when none refused it) and its numbers */
} attnd_session_step;

/* NULL when out of memory. lim is copied. */
attnd_sessions *attnd_sessions_new(const attnd_session_limits *lim);
/* Stops the reaper, if started, and frees every session; no step may be
 * running. NULL is a no-op. */
void attnd_sessions_free(attnd_sessions *st);

/* Starts the reaper: a thread that ends every session idle for idle_s
 * about once a second, with clock() (monotonic seconds, the `now` of every
 * other call) as its time, so that an idle daemon frees their memory.
 * Tables without it expire sessions only when called. Returns 0, or -1
 * when it is already started or the thread cannot start. */
int attnd_sessions_reaper_start(attnd_sessions *st, double (*clock)(void));

/* Opens a session for model (its cache of the given shape) and begins its
 * first step, which appends `tokens` (>= 0) prefix rows; with 0 the step
 * appends nothing and may be ended at once. id receives the new id (NUL
 * ended). max_len (>= 1) bounds the tokens the session may ever hold. now
 * is monotonic seconds. On SESS_FULL, *retry_after_s is when to retry. */
attnd_session_status attnd_session_open(attnd_sessions *st, void *model,
                                        const attnd_cache_shape *shape, int tokens, int max_len,
                                        double now, const char *want_id,
                                        char id[ATTND_SESSION_ID_LEN + 1], attnd_session_step *step,
                                        int *retry_after_s);
/* want_id, when not NULL, is the id to use: 32 lowercase hex characters,
 * 128 bits drawn at random (a load balancer's, docs/deploy.md), since
 * whoever knows an id may read and step its session; SESS_ID_TAKEN when a
 * session has it, SESS_BAD_ID when it is not such an id. Entropy cannot
 * be measured from one id, but an id with fewer than
 * ATTND_SESSION_ID_DIGITS different hex digits ("000...0", "abab...") is
 * plainly not random and refused: a random id has so few once in 3e12.
 * Returns 1 for an id that passes. */
int attnd_session_id_ok(const char *id);

/* Begins a step of session id that appends `tokens` (>= 1) rows. The
 * session is busy (its step queued or computing) until attnd_session_end.
 * A session idle past idle_s is ended here and reported SESS_NOT_FOUND. */
attnd_session_status attnd_session_begin(attnd_sessions *st, const char *id, int tokens, double now,
                                         attnd_session_step *step, int *retry_after_s);

/* Ends a step: commit 1 keeps its rows (len += add), 0 drops them (a step
 * that failed or was cancelled). Frees the session when it was deleted
 * meanwhile, or when the dropped step is the one that opened it: an open
 * that failed leaves no session behind to hold a slot until its idle
 * timeout. */
void attnd_session_end(attnd_sessions *st, attnd_session_step *step, int commit, double now);

/* Holds session id to read its cache (its state file, session/persist.c):
 * busy, as during a step, until attnd_session_end (commit 0: nothing
 * changes). The step adds nothing (add 0); kv holds its len cached rows.
 * SESS_NOT_FOUND, or SESS_BUSY while a step is queued or computing. */
attnd_session_status attnd_session_hold(attnd_sessions *st, const char *id, double now,
                                        attnd_session_step *step);

/* The ids of up to cap open sessions (none past its idle timeout) into
 * ids; returns how many there are, which may be more than cap. */
int attnd_sessions_list(attnd_sessions *st, double now, char (*ids)[ATTND_SESSION_ID_LEN + 1],
                        int cap);

/* Deletes session id: at once, or when its running step ends. Returns
 * SESS_OK or SESS_NOT_FOUND. */
attnd_session_status attnd_session_delete(attnd_sessions *st, const char *id, double now);

/* Ends every session idle for idle_s or more (none is busy). Returns how
 * many; each counts as expired. Cheap to call often: it scans at most once
 * a second. */
int attnd_sessions_expire(attnd_sessions *st, double now);

/* A session holds the handle of the model it was opened for (a model
 * version, server/models/version.h) from its open to its end: hold takes a
 * reference on a handle, drop lets one go. Set once, before any open;
 * without them handles are plain values. */
void attnd_sessions_hooks(attnd_sessions *st, void (*hold)(void *model), void (*drop)(void *model));

/* The model handle of session id with a reference (hold) for the caller,
 * or NULL when there is none (or it expired). */
void *attnd_session_model(attnd_sessions *st, const char *id, double now);

void attnd_sessions_stats(attnd_sessions *st, attnd_session_stats *out);
/* The limits the table was made with. */
void attnd_sessions_limits(attnd_sessions *st, attnd_session_limits *out);

/* The sentence for a status, for error bodies. */
const char *attnd_session_status_text(attnd_session_status s);
/* The refusal of status s (not SESS_OK) into e: its kind (404, 409, 429,
 * 413, 500 or 400) and its sentence, which names the session id for
 * SESS_NOT_FOUND, and for a refusal by a limit (over, from the refused
 * open's or begin's step; NULL when there is none) the limit's config key
 * and the numbers involved. Returns -1. */
int attnd_session_refusal(attnd_session_status s, const char *id, const attnd_session_over *over,
                          attnd_error *e);

/* The session gauges and counters for GET /metrics. It only reads: idle
 * sessions are ended by the reaper, not by a scrape. */
void attnd_sessions_metrics(attnd_sessions *st, attnd_sbuf *b);

#endif
