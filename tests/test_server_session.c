/* test_server_session.c - the KV-cache session table (server/session/session.c):
 * ids, steps that append and roll back, one step at a time per session,
 * deletion (also during a step), the idle timeout, the per-session and
 * total memory budgets with their statuses and Retry-After, caches of whole
 * zeroed pages (bf16 models) counted in real bytes, the counters,
 * and many threads at once. Time is passed in, so nothing sleeps, except
 * the reaper's test, which waits for its thread on a clock it moves.
 */
#include <check.h>
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../server/session/session.h"
#include "check_run.h"

enum { ROW = 4 }; /* floats per token in these tests: 16 bytes */
static const attnd_cache_shape ROWS = {ROW * sizeof(float), 1}; /* rows of floats (fp32) */
/* Model handles: the table keeps the pointer it is given and hands it back,
 * never looking at what it points to (the daemon's are model versions). */
static int MODELS[4];

static attnd_sessions *table(int max_sessions, long long max_bytes, long long each, int idle) {
    attnd_session_limits lim = {max_sessions, max_bytes, each, idle};
    attnd_sessions *st = attnd_sessions_new(&lim);
    ck_assert(st != NULL);
    return st;
}

static attnd_session_stats stats(attnd_sessions *st) {
    attnd_session_stats s;
    attnd_sessions_stats(st, &s);
    return s;
}

/* Writes token t's row as t, t+0.25, ... */
static void fill(attnd_session_step *p) {
    float *kv = p->kv;
    size_t row = p->shape.row_bytes / sizeof(float);
    for (int t = p->len; t < p->len + p->add; t++)
        for (size_t c = 0; c < row; c++)
            kv[(size_t)t * row + c] = (float)t + 0.25f * (float)c;
}

static void check_rows(const attnd_session_step *p) {
    const float *kv = p->kv;
    size_t row = p->shape.row_bytes / sizeof(float);
    for (int t = 0; t < p->len; t++)
        for (size_t c = 0; c < row; c++)
            ck_assert_msg(kv[(size_t)t * row + c] == (float)t + 0.25f * (float)c,
                          "row %d col %zu lost", t, c);
}

/* Opens a session with a prefix of n tokens, filled and committed. */
static void open_n(attnd_sessions *st, int n, double now, char id[ATTND_SESSION_ID_LEN + 1]) {
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(
        attnd_session_open(st, &MODELS[0], &ROWS, n, 1 << 20, now, NULL, id, &p, &retry), SESS_OK);
    fill(&p);
    attnd_session_end(st, &p, 1, now);
}

START_TEST(test_open_step_end) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 60);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[3], &ROWS, 5, 1000, 0, NULL, a, &p, &retry),
                     SESS_OK);
    ck_assert_uint_eq(strlen(a), ATTND_SESSION_ID_LEN);
    for (const char *c = a; *c; c++)
        ck_assert(isxdigit((unsigned char)*c) && !isupper((unsigned char)*c));
    ck_assert_ptr_eq(p.model, &MODELS[3]);
    ck_assert_int_eq(p.len, 0);
    ck_assert_int_eq(p.add, 5);
    ck_assert_uint_eq(p.shape.row_bytes, ROW * sizeof(float));
    ck_assert_int_eq(p.shape.page, 1);
    fill(&p);
    attnd_session_end(st, &p, 1, 1);
    ck_assert_ptr_eq(attnd_session_model(st, a, 1), &MODELS[3]);
    /* steps append; the rows survive every growth of the cache */
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(attnd_session_begin(st, a, 1 + i % 3, 2, &p, &retry), SESS_OK);
        check_rows(&p);
        fill(&p);
        attnd_session_end(st, &p, 1, 2);
    }
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 3, &p, &retry), SESS_OK);
    ck_assert_int_eq(p.len, 84); /* 5 + the sum of 1 + i % 3 for i < 40 */
    check_rows(&p);
    /* a step that fails is dropped */
    attnd_session_end(st, &p, 0, 3);
    ck_assert_int_eq(attnd_session_begin(st, a, 2, 4, &p, &retry), SESS_OK);
    ck_assert_int_eq(p.len, 84);
    attnd_session_end(st, &p, 0, 4);
    attnd_session_stats s = stats(st);
    ck_assert_int_eq(s.sessions, 1);
    ck_assert_int_eq(s.tokens, 84);
    ck_assert(s.bytes >= 84 * ROW * 4 && s.bytes <= 2 * 84 * ROW * 4);
    /* ids differ */
    open_n(st, 0, 5, b);
    ck_assert_str_ne(a, b);
    ck_assert_int_eq(stats(st).opened, 2);
    attnd_sessions_free(st);
}
END_TEST

/* An open whose first step is dropped (its prefix failed, timed out, its
 * client left) leaves nothing: no session, no bytes, no slot. */
START_TEST(test_failed_open_leaves_nothing) {
    attnd_sessions *st = table(1, 1 << 20, 1 << 20, 60);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    for (int i = 0; i < 3; i++) { /* one slot: each must give it back */
        ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 5, 1000, i, NULL, a, &p, &retry),
                         SESS_OK);
        ck_assert_int_eq(p.opening, 1);
        fill(&p);
        attnd_session_end(st, &p, 0, i);
        ck_assert_ptr_null(attnd_session_model(st, a, i));
        attnd_session_stats s = stats(st);
        ck_assert_int_eq(s.sessions, 0);
        ck_assert_int_eq(s.tokens, 0);
        ck_assert_int_eq(s.bytes, 0);
    }
    /* an open kept, then a dropped step: the session stays as it was */
    open_n(st, 3, 5, b);
    ck_assert_int_eq(attnd_session_begin(st, b, 2, 6, &p, &retry), SESS_OK);
    ck_assert_int_eq(p.opening, 0);
    attnd_session_end(st, &p, 0, 6);
    ck_assert_ptr_eq(attnd_session_model(st, b, 6), &MODELS[0]);
    ck_assert_int_eq(stats(st).tokens, 3);
    /* deleted during its opening step: freed once, at the end */
    ck_assert_int_eq(attnd_session_delete(st, b, 7), SESS_OK);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 2, 1000, 8, NULL, a, &p, &retry),
                     SESS_OK);
    ck_assert_int_eq(attnd_session_delete(st, a, 8), SESS_OK);
    attnd_session_end(st, &p, 0, 8);
    ck_assert_int_eq(stats(st).sessions, 0);
    ck_assert_int_eq(stats(st).bytes, 0);
    attnd_sessions_free(st);
}
END_TEST

/* An id proposed by the caller (a load balancer's): used when free and well
 * formed; taken or malformed ones are refused. */
START_TEST(test_proposed_id) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 60);
    const char *want = "0123456789abcdef0123456789abcdef";
    char id[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 1, 100, 0, want, id, &p, &retry),
                     SESS_OK);
    ck_assert_str_eq(id, want);
    attnd_session_end(st, &p, 1, 0);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 1, 100, 0, want, id, &p, &retry),
                     SESS_ID_TAKEN);
    const char *bad[] = {"0123456789ABCDEF0123456789abcdef",
                         "0123456789abcdef",
                         "x",
                         "0123456789abcdef0123456789abcdefa",
                         "00000000000000000000000000000000",
                         "abababababababababababababababab",
                         "01234012340123401234012340123401"};
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(
            attnd_session_open(st, &MODELS[0], &ROWS, 1, 100, 0, bad[i], id, &p, &retry),
            SESS_BAD_ID);
    /* six different digits pass: a random id has fewer once in 3e12 */
    ck_assert_int_eq(attnd_session_id_ok("01234501234501234501234501234501"), 1);
    ck_assert_int_eq(attnd_session_id_ok("0123401234012340123401234012340a"), 1);
    /* once it timed out, the id may be opened again */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 1, 100, 61, want, id, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 61);
    ck_assert_int_eq(stats(st).sessions, 1);
    attnd_sessions_free(st);
}
END_TEST

START_TEST(test_one_step_at_a_time) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 60);
    char a[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p, q;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 2, 100, 0, NULL, a, &p, &retry),
                     SESS_OK);
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 0, &q, &retry), SESS_BUSY);
    fill(&p);
    attnd_session_end(st, &p, 1, 0);
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 0, &q, &retry), SESS_OK);
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 0, &p, &retry), SESS_BUSY);
    attnd_session_end(st, &q, 1, 0);
    attnd_sessions_free(st);
}
END_TEST

START_TEST(test_not_found) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 60);
    attnd_session_step p;
    int retry = 0;
    const char *ids[] = {"", "abc", "0123456789abcdef0123456789abcdef",
                         "0123456789abcdef0123456789abcdef0", NULL};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(attnd_session_begin(st, ids[i], 1, 0, &p, &retry), SESS_NOT_FOUND);
        ck_assert_int_eq(attnd_session_delete(st, ids[i], 0), SESS_NOT_FOUND);
        ck_assert_ptr_null(attnd_session_model(st, ids[i], 0));
    }
    ck_assert(strstr(attnd_session_status_text(SESS_NOT_FOUND), "open a new session") != NULL);
    attnd_sessions_free(st);
}
END_TEST

START_TEST(test_delete) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 60);
    char a[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    open_n(st, 7, 0, a);
    ck_assert_int_eq(attnd_session_delete(st, a, 1), SESS_OK);
    ck_assert_int_eq(attnd_session_delete(st, a, 1), SESS_NOT_FOUND);
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 1, &p, &retry), SESS_NOT_FOUND);
    attnd_session_stats s = stats(st);
    ck_assert(s.sessions == 0 && s.tokens == 0 && s.bytes == 0 && s.deleted == 1);
    /* deleted during its step: gone at once for others, freed at the end */
    open_n(st, 3, 2, a);
    ck_assert_int_eq(attnd_session_begin(st, a, 2, 2, &p, &retry), SESS_OK);
    ck_assert_int_eq(attnd_session_delete(st, a, 2), SESS_OK);
    ck_assert_ptr_null(attnd_session_model(st, a, 2));
    ck_assert(stats(st).bytes > 0);
    fill(&p); /* the step still owns its rows */
    attnd_session_end(st, &p, 1, 3);
    s = stats(st);
    ck_assert(s.sessions == 0 && s.tokens == 0 && s.bytes == 0 && s.deleted == 2);
    attnd_sessions_free(st);
}
END_TEST

START_TEST(test_idle_timeout) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 10);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1], c[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    open_n(st, 4, 0, a);
    open_n(st, 4, 0, b);
    open_n(st, 4, 0, c);
    /* used at 9.5: lives until 19.5 */
    ck_assert_int_eq(attnd_session_begin(st, b, 1, 9.5, &p, &retry), SESS_OK);
    attnd_session_end(st, &p, 1, 9.5);
    /* a step running past the timeout is never ended under it */
    ck_assert_int_eq(attnd_session_begin(st, c, 1, 9.9, &p, &retry), SESS_OK);
    ck_assert_int_eq(attnd_sessions_expire(st, 9.99), 0);
    ck_assert_int_eq(attnd_sessions_expire(st, 25), 2); /* a and b; c is computing */
    ck_assert_ptr_null(attnd_session_model(st, a, 25));
    attnd_session_end(st, &p, 1, 25);
    /* b expired at 19.5: a late step finds nothing */
    ck_assert_int_eq(attnd_session_begin(st, b, 1, 25, &p, &retry), SESS_NOT_FOUND);
    attnd_session_stats s = stats(st);
    ck_assert_int_eq(s.expired, 2);
    ck_assert_int_eq(s.sessions, 1);
    ck_assert_int_eq(s.tokens, 5);
    /* expire scans at most once a second */
    ck_assert_int_eq(attnd_sessions_expire(st, 35.5), 1);
    ck_assert_int_eq(stats(st).bytes, 0);
    /* a step past the timeout ends its session even with no scan between */
    open_n(st, 2, 40, a);
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 50, &p, &retry), SESS_NOT_FOUND);
    s = stats(st);
    ck_assert(s.expired == 4 && s.sessions == 0 && s.bytes == 0);
    attnd_sessions_free(st);
}
END_TEST

/* The reaper's clock: the test moves it (microseconds, so atomic). */
static _Atomic long long g_now_us;

static double fake_now(void) {
    return (double)atomic_load(&g_now_us) / 1e6;
}

/* The reaper ends idle sessions with no call into the table: time moves
 * past the timeout and the sessions go, the one with a step in flight
 * stays. Waits on the counters, up to 30 s, for the thread to run. */
START_TEST(test_reaper) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 10);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    atomic_store(&g_now_us, 0);
    ck_assert_int_eq(attnd_sessions_reaper_start(st, fake_now), 0);
    ck_assert_int_eq(attnd_sessions_reaper_start(st, fake_now), -1); /* once */
    open_n(st, 4, 0, a);
    open_n(st, 4, 0, b);
    ck_assert_int_eq(attnd_session_begin(st, b, 1, 0, &p, &retry), SESS_OK);
    atomic_store(&g_now_us, 9000000); /* not yet: 1 s short of the timeout */
    struct timespec tick = {0, 5000000};
    for (int i = 0; i < 300; i++) /* 1.5 s: the reaper has swept at 9 s */
        nanosleep(&tick, NULL);
    ck_assert_int_eq(stats(st).sessions, 2);
    atomic_store(&g_now_us, 20000000);
    for (int i = 0; i < 6000 && stats(st).expired < 1; i++)
        nanosleep(&tick, NULL);
    attnd_session_stats s = stats(st);
    ck_assert_int_eq(s.expired, 1);
    ck_assert_int_eq(s.sessions, 1); /* b's step is in flight */
    ck_assert_ptr_null(attnd_session_model(st, a, 20));
    ck_assert_ptr_eq(attnd_session_model(st, b, 20), &MODELS[0]);
    attnd_session_end(st, &p, 1, 20);
    attnd_sessions_free(st); /* stops and joins the reaper */
}
END_TEST

/* The refusal of status st after step p was refused holds each of the
 * NULL-ended words. */
static void says(attnd_session_status st, const attnd_session_step *p, const char *const *words) {
    attnd_error e;
    ck_assert_int_eq(attnd_session_refusal(st, NULL, &p->over, &e), -1);
    for (int i = 0; words[i]; i++)
        ck_assert_msg(strstr(e.msg, words[i]) != NULL, "\"%s\" lacks \"%s\"", e.msg, words[i]);
}

START_TEST(test_per_session_limits) {
    /* 16 bytes a token: 10 tokens per session, 100 in all */
    attnd_sessions *st = table(8, 1600, 160, 60);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 11, 1000, 0, NULL, a, &p, &retry),
                     SESS_TOO_BIG);
    says(SESS_TOO_BIG, &p,
         (const char *[]){"limits.max_session_bytes_each: ", "the prefix ", " 11 tokens",
                          " 176 bytes", "16 a token", " 160 bytes (10 tokens)", NULL});
    ck_assert_int_eq(stats(st).sessions, 0);
    open_n(st, 9, 0, a);
    ck_assert_int_eq(attnd_session_begin(st, a, 2, 0, &p, &retry), SESS_TOO_BIG);
    says(SESS_TOO_BIG, &p,
         (const char *[]){"limits.max_session_bytes_each: ", "the step ", " 11 tokens", NULL});
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 0, &p, &retry), SESS_OK);
    attnd_session_end(st, &p, 1, 0);
    ck_assert_int_eq(stats(st).bytes, 160); /* doubling stops at the limit */
    /* max_len: the model's max_positions */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 3, 4, 0, NULL, b, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 0);
    ck_assert_int_eq(attnd_session_begin(st, b, 2, 0, &p, &retry), SESS_TOO_LONG);
    says(SESS_TOO_LONG, &p,
         (const char *[]){"the step would take the session to 5 tokens", "max_positions 4",
                          "positions 0 to 3", NULL});
    ck_assert_int_eq(attnd_session_begin(st, b, 1, 0, &p, &retry), SESS_OK);
    attnd_session_end(st, &p, 1, 0);
    ck_assert_int_eq(stats(st).refused_too_big, 3);
    ck_assert_int_eq(stats(st).tokens, 14);
    attnd_sessions_free(st);
}
END_TEST

START_TEST(test_total_budget) {
    /* 16 bytes a token: 20 tokens in all, 16 per session */
    attnd_sessions *st = table(8, 320, 256, 30);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1], c[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    open_n(st, 12, 0, a);
    open_n(st, 6, 10, b);
    ck_assert_int_eq(stats(st).bytes, 18 * 16);
    /* a new session over the total: refused, retry when a expires (t=30) */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 4, 100, 12, NULL, c, &p, &retry),
                     SESS_FULL);
    ck_assert_int_eq(retry, 18);
    says(SESS_FULL, &p,
         (const char *[]){"limits.max_session_bytes: the prefix needs a cache of 64 bytes (4 "
                          "tokens)",
                          "hold 288 of the 320 bytes", "retry after 18 s", NULL});
    /* an append that fits the session but not the total: the same */
    ck_assert_int_eq(attnd_session_begin(st, b, 3, 12, &p, &retry), SESS_FULL);
    ck_assert_int_eq(retry, 18);
    /* a growth that cannot double takes exactly what it needs */
    ck_assert_int_eq(attnd_session_begin(st, b, 2, 12, &p, &retry), SESS_OK);
    attnd_session_end(st, &p, 1, 12);
    ck_assert_int_eq(stats(st).bytes, 320);
    /* once a has timed out, its room is taken back for a new session */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 4, 100, 31, NULL, c, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 31);
    attnd_session_stats s = stats(st);
    ck_assert_int_eq(s.refused_full, 2);
    ck_assert_int_eq(s.expired, 1);
    ck_assert_int_eq(s.sessions, 2);
    ck_assert_int_eq(s.tokens, 12);
    attnd_sessions_free(st);
}
END_TEST

/* A cache of pages (a bf16 model's: 32 tokens a page): the budgets count
 * whole pages, the cache grows by whole pages, and every new page holds
 * zeros, whatever the steps wrote before it. */
START_TEST(test_paged_cache) {
    /* 8 bytes a token, 256 a page: one session may hold 2 pages, all 3 */
    const attnd_cache_shape pages = {8, 32};
    attnd_sessions *st = table(8, 768, 512, 60);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &pages, 65, 1000, 0, NULL, a, &p, &retry),
                     SESS_TOO_BIG); /* 65 tokens take 3 pages */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &pages, 5, 1000, 0, NULL, a, &p, &retry),
                     SESS_OK);
    ck_assert_int_eq(p.shape.page, 32);
    ck_assert_int_eq(stats(st).bytes, 256); /* one whole page for 5 tokens */
    for (size_t i = 0; i < 256; i++)        /* zeroed, then the step writes its slots */
        ck_assert_int_eq(((unsigned char *)p.kv)[i], 0);
    memset(p.kv, 0xAB, 5 * 8);
    attnd_session_end(st, &p, 1, 0);
    ck_assert_int_eq(attnd_session_begin(st, a, 27, 1, &p, &retry), SESS_OK); /* fits the page */
    ck_assert_int_eq(stats(st).bytes, 256);
    memset((char *)p.kv + 5 * 8, 0xCD, 27 * 8);
    attnd_session_end(st, &p, 1, 1);
    ck_assert_int_eq(attnd_session_begin(st, a, 1, 2, &p, &retry), SESS_OK); /* a second page */
    ck_assert_int_eq(stats(st).bytes, 512);
    for (size_t i = 256; i < 512; i++)
        ck_assert_int_eq(((unsigned char *)p.kv)[i], 0);
    ck_assert_int_eq(((unsigned char *)p.kv)[255], 0xCD); /* the first page kept */
    attnd_session_end(st, &p, 1, 2);
    ck_assert_int_eq(attnd_session_begin(st, a, 32, 3, &p, &retry), SESS_TOO_BIG);
    /* another session: its page fits the total, a second one does not */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &pages, 1, 1000, 4, NULL, b, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 4);
    ck_assert_int_eq(stats(st).bytes, 768);
    ck_assert_int_eq(attnd_session_begin(st, b, 32, 5, &p, &retry), SESS_FULL);
    ck_assert_int_eq(stats(st).tokens, 34);
    attnd_sessions_free(st);
    /* a limit between pages: the refusal names the tokens of its whole pages */
    st = table(8, 4096, 600, 60);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &pages, 65, 1000, 0, NULL, a, &p, &retry),
                     SESS_TOO_BIG);
    attnd_error e;
    ck_assert_int_eq(attnd_session_refusal(SESS_TOO_BIG, NULL, &p.over, &e), -1);
    ck_assert_msg(strstr(e.msg, "a cache of 768 bytes (8 a token, held in whole pages of 32 "
                                "tokens), past one session's limit of 600 bytes (64 tokens)"),
                  "%s", e.msg);
    attnd_sessions_free(st);
}
END_TEST

START_TEST(test_session_count) {
    attnd_sessions *st = table(2, 1 << 20, 1 << 20, 30);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1], c[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    open_n(st, 0, 0, a);
    open_n(st, 1, 5, b);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 0, 100, 6, NULL, c, &p, &retry),
                     SESS_FULL);
    ck_assert_int_eq(retry, 24);
    says(SESS_FULL, &p,
         (const char *[]){"limits.max_sessions: 2 sessions are open", "retry after 24 s", NULL});
    ck_assert_int_eq(attnd_session_delete(st, a, 7), SESS_OK);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 0, 100, 7, NULL, c, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 7);
    attnd_sessions_free(st);
}
END_TEST

/* ---- threads: opens, steps and deletes at once; counts must add up ---- */

typedef struct {
    attnd_sessions *st;
    int steps, deleted;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    for (int i = 0; i < 200; i++) {
        char id[ATTND_SESSION_ID_LEN + 1];
        attnd_session_step p;
        int retry;
        if (attnd_session_open(w->st, &MODELS[0], &ROWS, 3, 1 << 20, 0, NULL, id, &p, &retry) !=
            SESS_OK)
            continue;
        fill(&p);
        attnd_session_end(w->st, &p, 1, 0);
        for (int k = 0; k < 5; k++) {
            if (attnd_session_begin(w->st, id, 2, 0, &p, &retry) != SESS_OK) break;
            check_rows(&p);
            fill(&p);
            attnd_session_end(w->st, &p, 1, 0);
            w->steps++;
        }
        if (i % 2 == 0) {
            ck_assert_int_eq(attnd_session_delete(w->st, id, 0), SESS_OK);
            w->deleted++;
        }
    }
    return NULL;
}

START_TEST(test_threads) {
    attnd_sessions *st = table(4096, 1 << 26, 1 << 20, 3600);
    enum { N = 4 };
    pthread_t t[N];
    worker w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (worker){st, 0, 0};
        ck_assert(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    int steps = 0, deleted = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        steps += w[i].steps;
        deleted += w[i].deleted;
    }
    attnd_session_stats s = stats(st);
    ck_assert_int_eq(steps, N * 200 * 5);
    ck_assert_int_eq((int)s.opened, N * 200);
    ck_assert_int_eq((int)s.deleted, deleted);
    ck_assert_int_eq(s.sessions, N * 200 - deleted);
    ck_assert_int_eq(s.tokens, (long long)(N * 200 - deleted) * 13);
    attnd_sessions_free(st);
}
END_TEST

/* Look up: a session's model while it lives, -1 once it is deleted or
 * idle past its timeout; and the cache grows by doubling as steps come. */
START_TEST(test_look_up_and_grow) {
    attnd_sessions *st = table(8, 1 << 20, 1 << 20, 60);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[3], &ROWS, 1, 100, 0, NULL, a, &p, &retry),
                     SESS_OK);
    fill(&p);
    attnd_session_end(st, &p, 1, 0);
    open_n(st, 2, 0, b);
    ck_assert_ptr_eq(attnd_session_model(st, a, 10), &MODELS[3]);
    ck_assert_ptr_eq(attnd_session_model(st, b, 10), &MODELS[0]);
    long long bytes = stats(st).bytes;
    for (int k = 0; k < 5; k++) { /* a grows to 6 rows: its cache doubles past 1, 2, 4 */
        ck_assert_int_eq(attnd_session_begin(st, a, 1, 10, &p, &retry), SESS_OK);
        fill(&p);
        check_rows(&p);
        attnd_session_end(st, &p, 1, 10);
    }
    ck_assert_int_eq(stats(st).tokens, 8);
    ck_assert_int_eq(stats(st).bytes, bytes + (8 - 1) * ROW * (long long)sizeof(float));
    ck_assert_int_eq(attnd_session_delete(st, a, 10), SESS_OK);
    ck_assert_ptr_null(attnd_session_model(st, a, 10));
    ck_assert_ptr_null(attnd_session_model(st, b, 70)); /* idle 70 s of 60 */
    attnd_sessions_free(st);
}
END_TEST

/* ---- the hooks: a session holds its model's handle from open to end ---- */

/* References the hooks hold on each of MODELS, and calls in all. */
static int g_refs[4], g_holds, g_drops;

static int handle_of(void *model) {
    ptrdiff_t i = (int *)model - MODELS;
    ck_assert_msg(i >= 0 && i < 4, "a hook got %p, no model handle", model);
    return (int)i;
}

static void hook_hold(void *model) {
    g_refs[handle_of(model)]++;
    g_holds++;
}

static void hook_drop(void *model) {
    int i = handle_of(model);
    ck_assert_msg(g_refs[i] > 0, "model %d dropped more often than held", i);
    g_refs[i]--;
    g_drops++;
}

/* The references on MODELS[0..3] are r0..r3, and the hooks were called
 * holds and drops times since the table was made. */
static void refs_are(int r0, int r1, int r2, int r3, int holds, int drops) {
    ck_assert_int_eq(g_refs[0], r0);
    ck_assert_int_eq(g_refs[1], r1);
    ck_assert_int_eq(g_refs[2], r2);
    ck_assert_int_eq(g_refs[3], r3);
    ck_assert_int_eq(g_holds, holds);
    ck_assert_int_eq(g_drops, drops);
}

/* hold at every open, drop when its session ends: a refused open, a
 * failed opening step, a delete (at its step's end when one runs), the
 * idle timeout, the table freed; a look-up holds one for its caller; a
 * NULL handle is never passed to a hook. */
START_TEST(test_hooks_hold_and_drop) {
    /* 16 bytes a token: 10 tokens per session, 2 sessions, idle 10 s */
    attnd_sessions *st = table(2, 1 << 20, 160, 10);
    memset(g_refs, 0, sizeof g_refs);
    g_holds = g_drops = 0;
    attnd_sessions_hooks(st, hook_hold, hook_drop);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1], c[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(st, &MODELS[1], &ROWS, 3, 100, 0, NULL, a, &p, &retry),
                     SESS_OK);
    refs_are(0, 1, 0, 0, 1, 0); /* held while its opening step runs */
    ck_assert_ptr_eq(p.model, &MODELS[1]);
    attnd_session_end(st, &p, 1, 0);
    refs_are(0, 1, 0, 0, 1, 0);
    /* a look-up: one more, the caller's to drop */
    ck_assert_ptr_eq(attnd_session_model(st, a, 1), &MODELS[1]);
    refs_are(0, 2, 0, 0, 2, 0);
    hook_drop(&MODELS[1]);
    ck_assert_ptr_null(attnd_session_model(st, "0123456789abcdef0123456789abcdef", 1));
    refs_are(0, 1, 0, 0, 2, 1);
    /* refused opens let their hold go at once; a malformed id never takes one */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[2], &ROWS, 11, 100, 1, NULL, b, &p, &retry),
                     SESS_TOO_BIG);
    refs_are(0, 1, 0, 0, 3, 2);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[2], &ROWS, 1, 100, 1, a, b, &p, &retry),
                     SESS_ID_TAKEN);
    refs_are(0, 1, 0, 0, 4, 3);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[2], &ROWS, 1, 100, 1, "x", b, &p, &retry),
                     SESS_BAD_ID);
    refs_are(0, 1, 0, 0, 4, 3);
    /* an opening step that fails ends its session */
    ck_assert_int_eq(attnd_session_open(st, &MODELS[2], &ROWS, 2, 100, 1, NULL, b, &p, &retry),
                     SESS_OK);
    refs_are(0, 1, 1, 0, 5, 3);
    attnd_session_end(st, &p, 0, 1);
    refs_are(0, 1, 0, 0, 5, 4);
    /* the table full: refused, nothing kept */
    open_n(st, 1, 1, b); /* MODELS[0] */
    refs_are(1, 1, 0, 0, 6, 4);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[3], &ROWS, 1, 100, 1, NULL, c, &p, &retry),
                     SESS_FULL);
    refs_are(1, 1, 0, 0, 7, 5);
    /* a delete; during a step, the drop waits for the step's end */
    ck_assert_int_eq(attnd_session_delete(st, b, 2), SESS_OK);
    refs_are(0, 1, 0, 0, 7, 6);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[3], &ROWS, 1, 100, 2, NULL, c, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 2);
    ck_assert_int_eq(attnd_session_begin(st, c, 1, 3, &p, &retry), SESS_OK);
    ck_assert_int_eq(attnd_session_delete(st, c, 3), SESS_OK);
    refs_are(0, 1, 0, 1, 8, 6);
    attnd_session_end(st, &p, 1, 3);
    refs_are(0, 1, 0, 0, 8, 7);
    /* the idle timeout: a (last used at 0) ends at 10 */
    ck_assert_int_eq(attnd_sessions_expire(st, 9.5), 0);
    refs_are(0, 1, 0, 0, 8, 7);
    ck_assert_int_eq(attnd_sessions_expire(st, 12), 1);
    refs_are(0, 0, 0, 0, 8, 8);
    /* a NULL handle: no hook is called for it */
    ck_assert_int_eq(attnd_session_open(st, NULL, &ROWS, 1, 100, 12, NULL, a, &p, &retry), SESS_OK);
    attnd_session_end(st, &p, 1, 12);
    ck_assert_ptr_null(attnd_session_model(st, a, 12));
    refs_are(0, 0, 0, 0, 8, 8);
    /* the table freed with its sessions */
    ck_assert_int_eq(attnd_session_delete(st, a, 12), SESS_OK);
    open_n(st, 2, 12, a);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[3], &ROWS, 1, 100, 12, NULL, b, &p, &retry),
                     SESS_OK);
    attnd_session_end(st, &p, 1, 12);
    refs_are(1, 0, 0, 1, 10, 8);
    attnd_sessions_free(st);
    refs_are(0, 0, 0, 0, 10, 10);
}
END_TEST

/* Each refusal's kind and sentence; a missing session's names its id. */
START_TEST(test_refusals) {
    static const struct {
        attnd_session_status s;
        attnd_kind k;
    } want[] = {{SESS_NOT_FOUND, AERR_NOT_FOUND}, {SESS_BUSY, AERR_CONFLICT},
                {SESS_FULL, AERR_QUEUE_FULL},     {SESS_TOO_BIG, AERR_TOO_LARGE},
                {SESS_TOO_LONG, AERR_TOO_LARGE},  {SESS_NOMEM, AERR_INTERNAL},
                {SESS_ID_TAKEN, AERR_CONFLICT},   {SESS_BAD_ID, AERR_BAD_REQUEST}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        attnd_error e;
        ck_assert_int_eq(attnd_session_refusal(want[i].s, "abc", NULL, &e), -1);
        ck_assert_int_eq(e.code, want[i].k);
        ck_assert_str_ne(e.msg, "");
        ck_assert_int_eq(strstr(e.msg, "'abc'") != NULL, want[i].s == SESS_NOT_FOUND);
    }
}
END_TEST

/* The table's counters as /metrics shows them. */
START_TEST(test_metrics_text) {
    attnd_sessions *st = table(1, 1 << 20, 1 << 20, 60);
    char a[ATTND_SESSION_ID_LEN + 1], b[ATTND_SESSION_ID_LEN + 1];
    attnd_session_step p;
    int retry = 0;
    open_n(st, 3, 0, a);
    ck_assert_int_eq(attnd_session_open(st, &MODELS[0], &ROWS, 1, 100, 0, NULL, b, &p, &retry),
                     SESS_FULL);
    attnd_sbuf t;
    attnd_sb_init(&t);
    attnd_sessions_metrics(st, &t);
    const char *lines[] = {"# TYPE attnd_sessions gauge\nattnd_sessions 1\n",
                           "\nattnd_session_cached_tokens 3\n",
                           "\nattnd_session_bytes 48\n",
                           "\nattnd_sessions_opened_total 1\n",
                           "\nattnd_sessions_deleted_total 0\n",
                           "\nattnd_session_evictions_total{reason=\"idle\"} 0\n",
                           "\nattnd_session_refused_total{reason=\"full\"} 1\n",
                           "\nattnd_session_refused_total{reason=\"too_large\"} 0\n"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        ck_assert_msg(strstr(t.p, lines[i]) != NULL, "missing %s in\n%s", lines[i], t.p);
    attnd_sb_free(&t);
    attnd_sessions_free(st);
}
END_TEST

static Suite *session_suite(void) {
    Suite *s = suite_create("session");
    TCase *t = tcase_create("table");
    tcase_set_timeout(t, 60); /* test_reaper waits for a thread that wakes each second */
    tcase_add_test(t, test_open_step_end);
    tcase_add_test(t, test_failed_open_leaves_nothing);
    tcase_add_test(t, test_proposed_id);
    tcase_add_test(t, test_one_step_at_a_time);
    tcase_add_test(t, test_not_found);
    tcase_add_test(t, test_delete);
    tcase_add_test(t, test_idle_timeout);
    tcase_add_test(t, test_reaper);
    tcase_add_test(t, test_per_session_limits);
    tcase_add_test(t, test_total_budget);
    tcase_add_test(t, test_paged_cache);
    tcase_add_test(t, test_session_count);
    tcase_add_test(t, test_threads);
    tcase_add_test(t, test_look_up_and_grow);
    tcase_add_test(t, test_hooks_hold_and_drop);
    tcase_add_test(t, test_refusals);
    tcase_add_test(t, test_metrics_text);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(session_suite());
}
