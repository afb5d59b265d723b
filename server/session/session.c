/* session.c - the table of KV-cache sessions (session.h): ids, caches that
 * grow by doubling within the budget, steps that are ordered per session,
 * the idle timeout (and the reaper thread that applies it without
 * traffic), and the counters /metrics shows. No HTTP, no compute.
 */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../../config/enums.h" /* countof */
#include "../../core/attn.h"    /* ATTN_KV16_PAGE */
#include "../../core/sizes.h"
#include "../obs/prom.h"

struct attnd_session {
    char id[ATTND_SESSION_ID_LEN + 1];
    void *model;               /* the caller's handle on the model it was opened for, held
                                  (the table's hold hook) until the session is freed */
    void (*drop)(void *model); /* lets model go; NULL: nothing to let go */
    attnd_cache_shape shape;   /* how its cache holds tokens */
    int max_len;               /* tokens it may ever hold */
    void *kv;                  /* (cap tokens in shape), owned */
    int len;                   /* cached tokens */
    int cap;                   /* tokens allocated: a multiple of shape.page */
    double last_used;          /* monotonic seconds of the last open, step end or begin */
    int busy;                  /* 1 from a step's begin to its end: queued or computing */
    int deleted;               /* 1: out of the table, freed when its step ends */
    attnd_session *next;       /* bucket chain */
};

struct attnd_sessions {
    pthread_mutex_t mu;
    attnd_session_limits lim;
    attnd_session **buckets; /* (nbuckets) chains */
    size_t nbuckets;         /* a power of two */
    int count;               /* sessions in the table */
    long long tokens;        /* cached tokens of the sessions in the table */
    long long bytes;         /* bytes of every cache, deleted-but-busy ones too */
    double last_sweep;       /* monotonic seconds of the last expiry scan */
    attnd_session_stats totals;
    /* the reaper (attnd_sessions_reaper_start): sweeps once a second */
    pthread_t reaper;
    int reaper_on;             /* 1: started, to be joined by attnd_sessions_free */
    int reaper_stop;           /* 1: the reaper exits; under mu */
    pthread_cond_t reaper_cv;  /* on CLOCK_MONOTONIC; signalled to stop it */
    double (*clock)(void);     /* the reaper's now, monotonic seconds */
    void (*hold)(void *model); /* attnd_sessions_hooks: takes a reference on a model */
    void (*drop)(void *model); /* lets one go */
};

attnd_cache_shape attnd_session_cache_shape(int G, int D, int kv16) {
    size_t gd = 2 * (size_t)G * (size_t)D; /* a token's K and V */
    return kv16 ? (attnd_cache_shape){gd * sizeof(uint16_t), ATTN_KV16_PAGE}
                : (attnd_cache_shape){gd * sizeof(float), 1};
}

static size_t session_bytes(const attnd_session *s) {
    return (size_t)s->cap * s->shape.row_bytes;
}

static size_t bucket_of(const attnd_sessions *st, const char *id) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const char *p = id; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return (size_t)(h & (st->nbuckets - 1));
}

attnd_sessions *attnd_sessions_new(const attnd_session_limits *lim) {
    attnd_sessions *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->lim = *lim;
    st->nbuckets = 16;
    while (st->nbuckets < 2 * (size_t)(lim->max_sessions > 0 ? lim->max_sessions : 1))
        st->nbuckets *= 2;
    st->buckets = calloc(st->nbuckets, sizeof *st->buckets);
    if (!st->buckets || pthread_mutex_init(&st->mu, NULL) != 0) {
        free(st->buckets);
        free(st);
        return NULL;
    }
    return st;
}

static void session_free(attnd_session *s) {
    if (!s) return;
    if (s->drop) s->drop(s->model);
    free(s->kv);
    free(s);
}

void attnd_sessions_free(attnd_sessions *st) {
    if (!st) return;
    if (st->reaper_on) {
        pthread_mutex_lock(&st->mu);
        st->reaper_stop = 1;
        pthread_cond_signal(&st->reaper_cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->reaper, NULL);
        pthread_cond_destroy(&st->reaper_cv);
    }
    for (size_t b = 0; b < st->nbuckets; b++) {
        attnd_session *s = st->buckets[b];
        while (s) {
            attnd_session *next = s->next;
            session_free(s);
            s = next;
        }
    }
    pthread_mutex_destroy(&st->mu);
    free(st->buckets);
    free(st);
}

/* ---- the table (callers hold mu) ---------------------------------------- */

static attnd_session *find(const attnd_sessions *st, const char *id) {
    if (!id || strlen(id) != ATTND_SESSION_ID_LEN) return NULL;
    for (attnd_session *s = st->buckets[bucket_of(st, id)]; s; s = s->next)
        if (strcmp(s->id, id) == 0) return s;
    return NULL;
}

/* Takes s out of the table; its bytes stay counted until it is freed. */
static void unlink_session(attnd_sessions *st, attnd_session *s) {
    attnd_session **pp = &st->buckets[bucket_of(st, s->id)];
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
    st->count--;
    st->tokens -= s->len;
    s->deleted = 1;
}

/* Frees an unlinked session that no step uses. */
static void drop(attnd_sessions *st, attnd_session *s) {
    st->bytes -= (long long)session_bytes(s);
    session_free(s);
}

static int expired(const attnd_sessions *st, const attnd_session *s, double now) {
    return !s->busy && now - s->last_used >= st->lim.idle_s;
}

static int sweep(attnd_sessions *st, double now) {
    int n = 0;
    st->last_sweep = now;
    for (size_t b = 0; b < st->nbuckets; b++) {
        attnd_session *s = st->buckets[b];
        while (s) {
            attnd_session *next = s->next;
            if (expired(st, s, now)) {
                unlink_session(st, s);
                drop(st, s);
                n++;
            }
            s = next;
        }
    }
    st->totals.expired += (unsigned long long)n;
    return n;
}

/* Seconds until the first idle session expires (at least 1), the moment a
 * refused open or step may succeed. */
static int retry_after(const attnd_sessions *st, double now) {
    double soonest = st->lim.idle_s;
    for (size_t b = 0; b < st->nbuckets; b++)
        for (const attnd_session *s = st->buckets[b]; s; s = s->next)
            if (!s->busy && s->last_used + st->lim.idle_s - now < soonest)
                soonest = s->last_used + st->lim.idle_s - now;
    int r = (int)ceil(soonest);
    return r < 1 ? 1 : r;
}

/* Bytes of n tokens of row bytes each, LLONG_MAX when that passes it. */
static long long rows_bytes(uint64_t n, uint64_t row) {
    uint64_t b;
    return sz_mul(n, row, (uint64_t)LLONG_MAX, &b) == 0 ? (long long)b : LLONG_MAX;
}

/* tokens rounded up to whole pages of s's shape. */
static uint64_t whole_pages(const attnd_session *s, uint64_t tokens) {
    uint64_t page = (uint64_t)s->shape.page;
    return (tokens + page - 1) / page * page;
}

/* need tokens would pass a limit that no waiting lifts (413): its name and
 * numbers into over (the bytes of the whole pages they take). */
static attnd_session_status too_big(const attnd_sessions *st, const attnd_session *s, int need,
                                    attnd_session_over *over) {
    uint64_t row = (uint64_t)s->shape.row_bytes;
    over->tokens = need;
    over->row = (long long)row;
    if (need > s->max_len) {
        over->limit = OVER_LENGTH;
        over->max = s->max_len;
        return SESS_TOO_LONG;
    }
    int each = st->lim.max_bytes_per_session <= st->lim.max_bytes;
    over->limit = each ? OVER_BYTES_EACH : OVER_BYTES;
    over->max = each ? st->lim.max_bytes_per_session : st->lim.max_bytes;
    over->need = rows_bytes(whole_pages(s, (uint64_t)need), row);
    uint64_t page_bytes = row * (uint64_t)s->shape.page;
    over->fit = page_bytes ? (long long)((uint64_t)over->max / page_bytes * s->shape.page) : 0;
    return SESS_TOO_BIG;
}

/* Makes room for need tokens in the cache of s, doubling when the budget
 * allows, in whole pages; a paged cache's new pages are zeroed. A refusal
 * says which limit in over. */
static attnd_session_status grow_cache(attnd_sessions *st, attnd_session *s, int need, double now,
                                       attnd_session_over *over) {
    if (need > s->max_len) return too_big(st, s, need, over);
    if (need <= s->cap) return SESS_OK;
    uint64_t row = (uint64_t)s->shape.row_bytes, page = (uint64_t)s->shape.page, max_rows, want,
             bytes;
    uint64_t each =
        (uint64_t)(st->lim.max_bytes_per_session < st->lim.max_bytes ? st->lim.max_bytes_per_session
                                                                     : st->lim.max_bytes);
    max_rows = row ? each / (row * page) * page : 0;
    uint64_t need_up = whole_pages(s, (uint64_t)need);
    if (need_up > max_rows) return too_big(st, s, need, over);
    want = 2 * (uint64_t)s->cap > max_rows ? max_rows : 2 * (uint64_t)s->cap;
    if (want < need_up) want = need_up;
    if (want > whole_pages(s, (uint64_t)s->max_len)) want = whole_pages(s, (uint64_t)s->max_len);
    long long have = (long long)session_bytes(s);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) want = need_up; /* no room to double: exactly what is needed */
        if (pass == 2) sweep(st, now); /* last: end the sessions past their timeout */
        if (sz_mul(want, row, (uint64_t)st->lim.max_bytes, &bytes) == 0 &&
            st->bytes - have + (long long)bytes <= st->lim.max_bytes)
            break;
        if (pass == 2) {
            *over = (attnd_session_over){.limit = OVER_BYTES,
                                         .opening = over->opening,
                                         .tokens = need,
                                         .need = rows_bytes(need_up, row),
                                         .held = st->bytes - have,
                                         .max = st->lim.max_bytes,
                                         .row = (long long)row,
                                         .retry_after_s = retry_after(st, now)};
            return SESS_FULL;
        }
    }
    char *kv = realloc(s->kv, (size_t)bytes);
    if (!kv) return SESS_NOMEM;
    if (page > 1) memset(kv + have, 0, (size_t)bytes - (size_t)have); /* bf16.h: pages zeroed */
    s->kv = kv;
    s->cap = (int)want;
    st->bytes += (long long)bytes - have;
    return SESS_OK;
}

/* Marks s busy for a step of add rows and fills the step. */
static void start_step(attnd_session *s, int add, double now, attnd_session_step *step) {
    s->busy = 1;
    s->last_used = now;
    *step = (attnd_session_step){
        .s = s, .model = s->model, .kv = s->kv, .shape = s->shape, .len = s->len, .add = add};
}

static attnd_session_status refused(attnd_sessions *st, attnd_session_status r) {
    if (r == SESS_FULL) st->totals.refused_full++;
    if (r == SESS_TOO_BIG || r == SESS_TOO_LONG) st->totals.refused_too_big++;
    return r;
}

/* ---- the API -------------------------------------------------------------- */

static int new_id(char id[ATTND_SESSION_ID_LEN + 1]) {
    unsigned char raw[ATTND_SESSION_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(id + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

int attnd_session_id_ok(const char *id) {
    size_t n = 0;
    unsigned seen = 0; /* bit d: hex digit d occurs */
    for (; id[n]; n++) {
        char c = id[n];
        if (n >= ATTND_SESSION_ID_LEN || !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        seen |= 1u << (c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return n == ATTND_SESSION_ID_LEN && __builtin_popcount(seen) >= ATTND_SESSION_ID_DIGITS;
}

/* A new session, not yet in the table: its id want_id, or a new one. NULL
 * when out of memory (or out of randomness). */
static attnd_session *session_new(void *model, const attnd_cache_shape *shape, int max_len,
                                  double now, const char *want_id) {
    attnd_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (want_id)
        memcpy(s->id, want_id, ATTND_SESSION_ID_LEN + 1);
    else if (new_id(s->id) != 0) {
        free(s);
        return NULL;
    }
    s->model = model;
    s->shape = *shape;
    if (s->shape.page < 1) s->shape.page = 1;
    s->max_len = max_len;
    s->last_used = now;
    return s;
}

/* Whether new session s, with tokens rows, fits the table (mu held): its
 * id free (an expired holder ended), a slot, and its cache in the budget. */
static attnd_session_status room_for(attnd_sessions *st, attnd_session *s, int tokens, double now,
                                     attnd_session_over *over) {
    attnd_session *same = find(st, s->id);
    if (same && !expired(st, same, now)) return SESS_ID_TAKEN;
    if (same) {
        unlink_session(st, same);
        drop(st, same);
        st->totals.expired++;
    }
    if (st->count >= st->lim.max_sessions) sweep(st, now);
    if (st->count >= st->lim.max_sessions) {
        *over = (attnd_session_over){.limit = OVER_SESSIONS,
                                     .opening = over->opening,
                                     .need = st->count + 1,
                                     .max = st->lim.max_sessions,
                                     .retry_after_s = retry_after(st, now)};
        return SESS_FULL;
    }
    return grow_cache(st, s, tokens, now, over);
}

attnd_session_status attnd_session_open(attnd_sessions *st, void *model,
                                        const attnd_cache_shape *shape, int tokens, int max_len,
                                        double now, const char *want_id,
                                        char id[ATTND_SESSION_ID_LEN + 1], attnd_session_step *step,
                                        int *retry_after_s) {
    attnd_session_over over = {.opening = 1};
    step->over = over; /* set for the two refusals before the table's too: callers pass it on */
    if (want_id && !attnd_session_id_ok(want_id)) return SESS_BAD_ID;
    attnd_session *s = session_new(model, shape, max_len, now, want_id);
    if (!s) return SESS_NOMEM;
    if (st->hold && model) st->hold(model); /* the session's own, let go when it is freed */
    s->drop = model ? st->drop : NULL;
    pthread_mutex_lock(&st->mu);
    attnd_session_status r = room_for(st, s, tokens, now, &over);
    if (r == SESS_OK) {
        size_t b = bucket_of(st, s->id);
        s->next = st->buckets[b];
        st->buckets[b] = s;
        st->count++;
        st->totals.opened++;
        start_step(s, tokens, now, step);
        step->opening = 1;
        memcpy(id, s->id, ATTND_SESSION_ID_LEN + 1);
        s = NULL; /* the table's */
    } else {
        refused(st, r);
        step->over = over;
        *retry_after_s = over.retry_after_s;
    }
    pthread_mutex_unlock(&st->mu);
    session_free(s); /* refused: grow_cache changed nothing, s holds no rows */
    return r;
}

attnd_session_status attnd_session_begin(attnd_sessions *st, const char *id, int tokens, double now,
                                         attnd_session_step *step, int *retry_after_s) {
    attnd_session_over over = {0};
    pthread_mutex_lock(&st->mu);
    attnd_session_status r = SESS_OK;
    attnd_session *s = find(st, id);
    if (s && expired(st, s, now)) {
        unlink_session(st, s);
        drop(st, s);
        st->totals.expired++;
        s = NULL;
    }
    if (!s)
        r = SESS_NOT_FOUND;
    else if (s->busy)
        r = SESS_BUSY;
    else if (tokens < 1) /* a step of no rows: the caller's mistake */
        r = SESS_TOO_LONG;
    else if (tokens > INT32_MAX - s->len) /* past any max_len */
        r = too_big(st, s, INT32_MAX, &over);
    else
        r = grow_cache(st, s, s->len + tokens, now, &over);
    if (r == SESS_OK) {
        start_step(s, tokens, now, step);
    } else {
        refused(st, r);
        step->over = over;
        *retry_after_s = over.retry_after_s;
    }
    pthread_mutex_unlock(&st->mu);
    return r;
}

void attnd_session_end(attnd_sessions *st, attnd_session_step *step, int commit, double now) {
    attnd_session *s = step->s;
    if (!s) return;
    pthread_mutex_lock(&st->mu);
    s->busy = 0;
    s->last_used = now;
    if (s->deleted) {
        drop(st, s);
    } else if (commit) {
        s->len += step->add;
        st->tokens += step->add;
    } else if (step->opening) { /* an open that failed: nobody knows its id */
        unlink_session(st, s);
        drop(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    step->s = NULL;
}

attnd_session_status attnd_session_hold(attnd_sessions *st, const char *id, double now,
                                        attnd_session_step *step) {
    pthread_mutex_lock(&st->mu);
    attnd_session_status r = SESS_OK;
    attnd_session *s = find(st, id);
    if (!s || expired(st, s, now))
        r = SESS_NOT_FOUND; /* an expired one is left to the reaper */
    else if (s->busy)
        r = SESS_BUSY;
    else
        start_step(s, 0, now, step);
    pthread_mutex_unlock(&st->mu);
    return r;
}

int attnd_sessions_list(attnd_sessions *st, double now, char (*ids)[ATTND_SESSION_ID_LEN + 1],
                        int cap) {
    int n = 0;
    pthread_mutex_lock(&st->mu);
    for (size_t b = 0; b < st->nbuckets; b++)
        for (const attnd_session *s = st->buckets[b]; s; s = s->next)
            if (!expired(st, s, now) && n++ < cap) memcpy(ids[n - 1], s->id, sizeof ids[0]);
    pthread_mutex_unlock(&st->mu);
    return n;
}

attnd_session_status attnd_session_delete(attnd_sessions *st, const char *id, double now) {
    pthread_mutex_lock(&st->mu);
    attnd_session *s = find(st, id);
    attnd_session_status r = SESS_NOT_FOUND;
    if (s && expired(st, s, now)) {
        unlink_session(st, s);
        drop(st, s);
        st->totals.expired++;
    } else if (s) {
        unlink_session(st, s);
        if (!s->busy) drop(st, s); /* else its step's end frees it */
        st->totals.deleted++;
        r = SESS_OK;
    }
    pthread_mutex_unlock(&st->mu);
    return r;
}

int attnd_sessions_expire(attnd_sessions *st, double now) {
    pthread_mutex_lock(&st->mu);
    int n = now - st->last_sweep >= 1.0 ? sweep(st, now) : 0;
    pthread_mutex_unlock(&st->mu);
    return n;
}

/* The reaper: ends idle sessions once a second until attnd_sessions_free
 * stops it, so that a daemon with no traffic frees their memory too. */
static void *reaper_main(void *arg) {
    attnd_sessions *st = arg;
    pthread_mutex_lock(&st->mu);
    while (!st->reaper_stop) {
        sweep(st, st->clock());
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        while (!st->reaper_stop &&
               pthread_cond_timedwait(&st->reaper_cv, &st->mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

int attnd_sessions_reaper_start(attnd_sessions *st, double (*clock)(void)) {
    pthread_condattr_t ca;
    if (st->reaper_on || pthread_condattr_init(&ca) != 0) return -1;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(&st->reaper_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) return -1;
    st->clock = clock;
    if (pthread_create(&st->reaper, NULL, reaper_main, st) != 0) {
        pthread_cond_destroy(&st->reaper_cv);
        return -1;
    }
    st->reaper_on = 1;
    return 0;
}

void attnd_sessions_hooks(attnd_sessions *st, void (*hold)(void *model),
                          void (*drop)(void *model)) {
    st->hold = hold;
    st->drop = drop;
}

void *attnd_session_model(attnd_sessions *st, const char *id, double now) {
    pthread_mutex_lock(&st->mu);
    attnd_session *s = find(st, id);
    void *model = s && !expired(st, s, now) ? s->model : NULL;
    if (model && st->hold) st->hold(model);
    pthread_mutex_unlock(&st->mu);
    return model;
}

void attnd_sessions_stats(attnd_sessions *st, attnd_session_stats *out) {
    pthread_mutex_lock(&st->mu);
    *out = st->totals;
    out->sessions = st->count;
    out->tokens = st->tokens;
    out->bytes = st->bytes;
    pthread_mutex_unlock(&st->mu);
}

void attnd_sessions_limits(attnd_sessions *st, attnd_session_limits *out) {
    *out = st->lim; /* set at creation, never changed */
}

const char *attnd_session_status_text(attnd_session_status s) {
    switch (s) {
    case SESS_OK:
        return "ok";
    case SESS_NOT_FOUND:
        return "no such session on this server: it was deleted, timed out, or is held by "
               "another replica or a restarted one; open a new session with the whole prefix";
    case SESS_BUSY:
        return "the session's previous step is still queued or computing; send the next step "
               "after its answer";
    case SESS_FULL:
        return "the session memory budget or session count is used up; retry later";
    case SESS_TOO_BIG:
        return "the step would take the session past max_session_bytes_each";
    case SESS_TOO_LONG:
        return "the step would take the session past the model's max_positions";
    case SESS_ID_TAKEN:
        return "a session with this id is open already";
    case SESS_BAD_ID:
        return "X-Session-Id: a session id chosen by its client must carry at least 128 random "
               "bits: 32 lowercase hex characters drawn from a random source (nginx's "
               "$request_id, os.urandom(16).hex()); anyone who guesses a session's id can read "
               "its state";
    default:
        return "out of memory for the session cache";
    }
}

/* The kind of answer each refusal of the table gets. */
static const attnd_kind SESSION_KIND[] = {
    [SESS_OK] = AERR_INTERNAL,        [SESS_NOT_FOUND] = AERR_NOT_FOUND,
    [SESS_BUSY] = AERR_CONFLICT,      [SESS_FULL] = AERR_QUEUE_FULL,
    [SESS_TOO_BIG] = AERR_TOO_LARGE,  [SESS_TOO_LONG] = AERR_TOO_LARGE,
    [SESS_NOMEM] = AERR_INTERNAL,     [SESS_ID_TAKEN] = AERR_CONFLICT,
    [SESS_BAD_ID] = AERR_BAD_REQUEST,
};

/* The sentence of a refusal by a limit that waiting does not lift (413):
 * the limit, the tokens and bytes the rows would take the session to. */
static int over_too_big(const attnd_session_over *o, attnd_kind k, attnd_error *e) {
    const char *what = o->opening ? "prefix" : "step";
    if (o->limit == OVER_LENGTH && o->max == ATTND_SESSION_MAX_LEN)
        return attnd_set_error(e, k,
                               "the %s would take the session to %d tokens, past the %lld a "
                               "session may hold; start a new session with a shorter context",
                               what, o->tokens, o->max);
    if (o->limit == OVER_LENGTH)
        return attnd_set_error(e, k,
                               "the %s would take the session to %d tokens, past the model's "
                               "max_positions %lld (positions 0 to %lld); start a new session "
                               "with a shorter context",
                               what, o->tokens, o->max, o->max - 1);
    int paged = o->need > (long long)o->tokens * o->row; /* a bf16 cache: whole pages */
    return attnd_set_error(
        e, k,
        "limits.%s: the %s would take the session to %d token%s, a cache of %lld bytes (%lld "
        "a token%s), past %s %lld bytes (%lld tokens); start a new session with a shorter context",
        o->limit == OVER_BYTES_EACH ? "max_session_bytes_each" : "max_session_bytes", what,
        o->tokens, o->tokens == 1 ? "" : "s", o->need, o->row,
        paged ? ", held in whole pages of 32 tokens" : "",
        o->limit == OVER_BYTES_EACH ? "one session's limit of" : "all sessions' limit of", o->max,
        o->fit);
}

int attnd_session_refusal(attnd_session_status s, const char *id, const attnd_session_over *over,
                          attnd_error *e) {
    attnd_kind k = (unsigned)s < countof(SESSION_KIND) ? SESSION_KIND[s] : AERR_INTERNAL;
    const attnd_session_over none = {0}, *o = over ? over : &none;
    if (s == SESS_NOT_FOUND)
        return attnd_set_error(e, k, "session '%.40s': %s", id ? id : "",
                               attnd_session_status_text(s));
    if (s == SESS_FULL && o->limit == OVER_SESSIONS)
        return attnd_set_error(e, k,
                               "limits.max_sessions: %lld sessions are open, the most this server "
                               "holds; retry after %d s (when the first idle one times out), or "
                               "close one",
                               o->max, o->retry_after_s);
    if (s == SESS_FULL && o->limit == OVER_BYTES)
        return attnd_set_error(e, k,
                               "limits.max_session_bytes: the %s needs a cache of %lld bytes "
                               "(%d tokens) while the other sessions hold %lld of the %lld bytes "
                               "all may hold; retry after %d s (when the first idle one times "
                               "out), or close a session",
                               o->opening ? "prefix" : "step", o->need, o->tokens, o->held, o->max,
                               o->retry_after_s);
    if ((s == SESS_TOO_BIG || s == SESS_TOO_LONG) && o->limit != OVER_NONE)
        return over_too_big(o, k, e);
    return attnd_set_error(e, k, "%s", attnd_session_status_text(s));
}

void attnd_sessions_metrics(attnd_sessions *t, attnd_sbuf *b) {
    attnd_session_stats st;
    attnd_sessions_stats(t, &st);
    attnd_prom_single(b, "attnd_sessions", PROM_GAUGE, "KV-cache sessions open.", st.sessions);
    attnd_prom_single(b, "attnd_session_cached_tokens", PROM_GAUGE,
                      "Tokens held by every session's cache.", st.tokens);
    attnd_prom_single(b, "attnd_session_bytes", PROM_GAUGE, "Bytes the session caches hold.",
                      st.bytes);
    attnd_prom_single(b, "attnd_sessions_opened_total", PROM_COUNTER, "Sessions opened.",
                      (long long)st.opened);
    attnd_prom_single(b, "attnd_sessions_deleted_total", PROM_COUNTER,
                      "Sessions closed by their client.", (long long)st.deleted);
    const attnd_prom_label idle = {"reason", "idle"}, full = {"reason", "full"},
                           big = {"reason", "too_large"};
    attnd_prom_family(b, "attnd_session_evictions_total", PROM_COUNTER,
                      "Sessions ended by attnd: the idle timeout.");
    attnd_prom_sample(b, "attnd_session_evictions_total", &idle, 1, (long long)st.expired);
    attnd_prom_family(b, "attnd_session_refused_total", PROM_COUNTER,
                      "Opens and steps refused, by reason.");
    attnd_prom_sample(b, "attnd_session_refused_total", &full, 1, (long long)st.refused_full);
    attnd_prom_sample(b, "attnd_session_refused_total", &big, 1, (long long)st.refused_too_big);
}
