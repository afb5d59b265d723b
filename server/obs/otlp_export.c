/* otlp_export.c - the OTLP exporter: a ring of spans bounded at creation
 * and a thread that empties it. attnd_otlp_submit copies spans in under a
 * mutex and returns; what does not fit is dropped and counted. The thread
 * wakes when a batch is full or interval_ms has passed, takes up to
 * batch_max spans, encodes them (otlp.c) and POSTs them with libcurl, one
 * reused handle (keep-alive), with a timeout. A failed POST is not retried:
 * its spans count as failed, and the failure is logged at most once per
 * fail_log_s with a count of what failed since. At shutdown the thread
 * sends what is queued until shutdown_ms has passed, then stops.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/refuse.h"
#include "../base/clock.h"
#include "log.h"
#include "otlp.h"
#include "prom.h"

#define RESPONSE_MAX 4096 /* bytes of a collector's answer kept (partialSuccess) */

struct attnd_otlp {
    attnd_otlp_opts o; /* endpoint and service_version point at copies below */
    char *endpoint, *version;
    pthread_mutex_t mu;
    pthread_cond_t wake;          /* a batch is full, or stop */
    attnd_span *ring;             /* (o.queue_spans) */
    int head, count;              /* oldest span, spans held: under mu */
    int stop;                     /* under mu */
    _Atomic uint64_t deadline_us; /* monotonic: the thread stops sending then; 0 before free */
    pthread_t thread;
    _Atomic unsigned long long exported, dropped, failed, batches;
    /* The thread's own: */
    CURL *curl;
    struct curl_slist *headers;
    attnd_span *batch; /* (o.batch_max) */
    attnd_sbuf body, answer;
    char curl_err[CURL_ERROR_SIZE];
    uint64_t logged_us;                      /* when a failure was last logged; 0: never */
    unsigned long long unlogged, unlogged_n; /* failed spans and POSTs since */
    char last_why[160];                      /* the latest failure's reason */
    int failing;                             /* 1: the latest POST failed */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- the ring ----------------------------------------------------------------- */

int attnd_otlp_submit(attnd_otlp *x, const attnd_span *spans, int n) {
    int cap = x->o.queue_spans;
    if (n <= 0) return 0;
    pthread_mutex_lock(&x->mu);
    if (x->stop || x->count + n > cap) {
        pthread_mutex_unlock(&x->mu);
        x->dropped += (unsigned long long)n;
        return 0;
    }
    for (int i = 0; i < n; i++)
        x->ring[(x->head + x->count + i) % cap] = spans[i];
    x->count += n;
    if (x->count >= x->o.batch_max && x->count - n < x->o.batch_max) pthread_cond_signal(&x->wake);
    pthread_mutex_unlock(&x->mu);
    return n;
}

void attnd_otlp_stats_get(attnd_otlp *x, attnd_otlp_stats *out) {
    pthread_mutex_lock(&x->mu);
    out->queued = x->count;
    pthread_mutex_unlock(&x->mu);
    out->exported = x->exported;
    out->dropped = x->dropped;
    out->failed = x->failed;
    out->batches = x->batches;
}

void attnd_otlp_metrics(attnd_otlp *x, attnd_sbuf *b) {
    attnd_otlp_stats st = {0};
    if (x) attnd_otlp_stats_get(x, &st);
    attnd_prom_single(b, "attnd_trace_spans_exported_total", PROM_COUNTER,
                      "Spans the OTLP collector took.", (long long)st.exported);
    attnd_prom_single(b, "attnd_trace_spans_dropped_total", PROM_COUNTER,
                      "Spans dropped: the export queue was full (tracing.queue_spans), or they "
                      "were left at shutdown.",
                      (long long)st.dropped);
    attnd_prom_single(b, "attnd_trace_spans_failed_total", PROM_COUNTER,
                      "Spans sent and not taken: collector unreachable, slow or refusing.",
                      (long long)st.failed);
    attnd_prom_single(b, "attnd_trace_export_batches_total", PROM_COUNTER,
                      "OTLP/HTTP export requests made.", (long long)st.batches);
    attnd_prom_single(b, "attnd_trace_spans_queued", PROM_GAUGE, "Spans waiting for export.",
                      st.queued);
}

/* Waits (mu held) until a batch is full, interval_ms has passed with spans
 * queued, or stop; then takes up to batch_max spans. Returns how many, or
 * -1 when the thread is to end. */
static void after_ms(struct timespec *t, int ms) {
    clock_gettime(CLOCK_MONOTONIC, t);
    long long ns = t->tv_nsec + (long long)ms * 1000000;
    t->tv_sec += ns / 1000000000;
    t->tv_nsec = ns % 1000000000;
}

static int take_batch(attnd_otlp *x) {
    struct timespec until;
    after_ms(&until, x->o.interval_ms);
    while (!x->stop && x->count < x->o.batch_max) {
        if (pthread_cond_timedwait(&x->wake, &x->mu, &until) != ETIMEDOUT) continue;
        if (x->count > 0) break;
        after_ms(&until, x->o.interval_ms); /* nothing came: wait another interval */
    }
    if (x->stop && (x->count == 0 || attnd_mono_us() >= x->deadline_us)) return -1;
    int n = x->count < x->o.batch_max ? x->count : x->o.batch_max;
    for (int i = 0; i < n; i++)
        x->batch[i] = x->ring[(x->head + i) % x->o.queue_spans];
    x->head = (x->head + n) % x->o.queue_spans;
    x->count -= n;
    return n;
}

/* ---- one POST ----------------------------------------------------------------- */

static size_t on_answer(char *p, size_t size, size_t nmemb, void *arg) {
    attnd_sbuf *b = arg;
    size_t n = size * nmemb;
    if (b->len < RESPONSE_MAX)
        attnd_sb_put(b, p, n < RESPONSE_MAX - b->len ? n : RESPONSE_MAX - b->len);
    return n;
}

/* Cuts a POST short once the shutdown deadline has passed. */
static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    attnd_otlp *x = arg;
    (void)dt, (void)dn, (void)ut, (void)un;
    uint64_t d = x->deadline_us;
    return d && attnd_mono_us() >= d;
}

/* Spans the collector refused in a 2xx answer: partialSuccess.rejectedSpans
 * (an int64, so a string in JSON; a number is read too). */
static long long rejected_spans(const attnd_sbuf *answer) {
    json_t *root = json_loadb(answer->p ? answer->p : "", answer->len, 0, NULL);
    json_t *r = json_object_get(json_object_get(root, "partialSuccess"), "rejectedSpans");
    long long n = json_is_integer(r)  ? (long long)json_integer_value(r)
                  : json_is_string(r) ? atoll(json_string_value(r))
                                      : 0;
    json_decref(root);
    return n > 0 ? n : 0;
}

/* Counts a failure and logs it when none was logged for fail_log_s. */
static void note_failure(attnd_otlp *x, int n, const char *why) {
    uint64_t now = attnd_mono_us();
    x->failed += (unsigned long long)n;
    x->unlogged += (unsigned long long)n;
    x->unlogged_n++;
    x->failing = 1;
    snprintf(x->last_why, sizeof x->last_why, "%s", why);
    if (x->logged_us && now - x->logged_us < (uint64_t)x->o.fail_log_s * 1000000) return;
    attnd_log(LOG_WARN,
              "otlp: export to %s failed: %s; %llu spans in %llu batches failed since the last "
              "such line (logged at most once every %d s)",
              x->endpoint, why, x->unlogged, x->unlogged_n, x->o.fail_log_s);
    x->logged_us = now;
    x->unlogged = x->unlogged_n = 0;
}

static void post_batch(attnd_otlp *x, int n) {
    char why[160];
    x->body.len = x->answer.len = 0;
    x->body.oom = x->answer.oom = 0;
    attnd_otlp_encode(&x->body, x->batch, n, x->version);
    if (x->body.oom) {
        note_failure(x, n, "out of memory for the request body");
        return;
    }
    x->curl_err[0] = '\0';
    uint64_t deadline = x->deadline_us, now = attnd_mono_us();
    if (deadline) { /* shutting down: no POST outlives the deadline */
        long left = deadline > now ? (long)((deadline - now) / 1000) + 1 : 1;
        curl_easy_setopt(x->curl, CURLOPT_TIMEOUT_MS,
                         left < x->o.timeout_ms ? left : (long)x->o.timeout_ms);
    }
    curl_easy_setopt(x->curl, CURLOPT_POSTFIELDS, x->body.p);
    curl_easy_setopt(x->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->body.len);
    CURLcode rc = curl_easy_perform(x->curl);
    long status = 0;
    curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
    x->batches++;
    if (rc != CURLE_OK) {
        note_failure(x, n,
                     rc == CURLE_ABORTED_BY_CALLBACK ? "no answer by the shutdown deadline"
                     : x->curl_err[0]                ? x->curl_err
                                                     : curl_easy_strerror(rc));
    } else if (status < 200 || status > 299) {
        int k = snprintf(why, sizeof why, "HTTP %ld: ", status);
        for (size_t i = 0; i < x->answer.len && k < (int)sizeof why - 1; i++)
            why[k++] = (unsigned char)x->answer.p[i] < 0x20 ? ' ' : x->answer.p[i];
        why[k] = '\0';
        note_failure(x, n, why);
    } else {
        long long rejected = rejected_spans(&x->answer);
        if (rejected > n) rejected = n;
        x->exported += (unsigned long long)(n - rejected);
        if (rejected) {
            snprintf(why, sizeof why, "the collector rejected %lld of %d spans", rejected, n);
            note_failure(x, (int)rejected, why);
        } else if (x->failing) {
            x->failing = 0;
            attnd_log(LOG_INFO, "otlp: export to %s works again", x->endpoint);
        }
    }
}

static void *run(void *arg) {
    attnd_otlp *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        int n = take_batch(x);
        if (n < 0) break;
        pthread_mutex_unlock(&x->mu);
        post_batch(x, n);
        pthread_mutex_lock(&x->mu);
    }
    x->dropped += (unsigned long long)x->count; /* left at shutdown */
    x->count = 0;
    pthread_mutex_unlock(&x->mu);
    if (x->unlogged)
        attnd_log(LOG_WARN, "otlp: export to %s: %llu more spans in %llu batches failed; last: %s",
                  x->endpoint, x->unlogged, x->unlogged_n, x->last_why);
    return NULL;
}

/* ---- life --------------------------------------------------------------------- */

static int opts_ok(const attnd_otlp_opts *o, char *err, size_t errlen) {
    if (!o->endpoint ||
        (strncmp(o->endpoint, "http://", 7) != 0 && strncmp(o->endpoint, "https://", 8) != 0))
        return cfg_fail(err, errlen,
                        "tracing.otlp_endpoint: \"%.100s\" is not an http:// or https:// URL.",
                        o->endpoint ? o->endpoint : "");
    if (o->queue_spans < 1 || o->batch_max < 1 || o->batch_max > o->queue_spans)
        return cfg_fail(err, errlen,
                        "otlp: queue_spans %d and batch_max %d: both >= 1, batch_max <= "
                        "queue_spans.",
                        o->queue_spans, o->batch_max);
    if (o->interval_ms < 1 || o->timeout_ms < 1 || o->shutdown_ms < 0 || o->fail_log_s < 0)
        return cfg_fail(err, errlen,
                        "otlp: interval_ms, timeout_ms >= 1; shutdown_ms, "
                        "fail_log_s >= 0.");
    return 0;
}

static int curl_setup(attnd_otlp *x) {
    x->curl = curl_easy_init();
    x->headers = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h = x->headers ? curl_slist_append(x->headers, "Expect:") : NULL;
    if (!x->curl || !h) return -1;
    x->headers = h;
    curl_easy_setopt(x->curl, CURLOPT_URL, x->endpoint);
    curl_easy_setopt(x->curl, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(x->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x->curl, CURLOPT_TIMEOUT_MS, (long)x->o.timeout_ms);
    curl_easy_setopt(x->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)x->o.timeout_ms);
    curl_easy_setopt(x->curl, CURLOPT_ERRORBUFFER, x->curl_err);
    curl_easy_setopt(x->curl, CURLOPT_WRITEFUNCTION, on_answer);
    curl_easy_setopt(x->curl, CURLOPT_WRITEDATA, &x->answer);
    curl_easy_setopt(x->curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(x->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(x->curl, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(x->curl, CURLOPT_USERAGENT, "attnd-otlp");
    return 0;
}

static void release(attnd_otlp *x) {
    curl_slist_free_all(x->headers);
    if (x->curl) curl_easy_cleanup(x->curl);
    attnd_sb_free(&x->body);
    attnd_sb_free(&x->answer);
    free(x->ring);
    free(x->batch);
    free(x->endpoint);
    free(x->version);
    pthread_cond_destroy(&x->wake);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

attnd_otlp *attnd_otlp_new(const attnd_otlp_opts *o, char *err, size_t errlen) {
    if (opts_ok(o, err, errlen) != 0) return NULL;
    pthread_once(&curl_once, curl_init);
    attnd_otlp *x = calloc(1, sizeof *x);
    if (!x) return cfg_fail(err, errlen, "otlp: out of memory."), NULL;
    x->o = *o;
    if (!x->o.fail_log_s) x->o.fail_log_s = 60;
    pthread_mutex_init(&x->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&x->wake, &ca);
    pthread_condattr_destroy(&ca);
    attnd_sb_init(&x->body);
    attnd_sb_init(&x->answer);
    x->endpoint = strdup(o->endpoint);
    x->version = strdup(o->service_version ? o->service_version : "");
    x->ring = malloc((size_t)o->queue_spans * sizeof *x->ring);
    x->batch = malloc((size_t)o->batch_max * sizeof *x->batch);
    if (curl_init_rc != CURLE_OK || !x->endpoint || !x->version || !x->ring || !x->batch ||
        curl_setup(x) != 0 || pthread_create(&x->thread, NULL, run, x) != 0) {
        cfg_fail(err, errlen, "otlp: cannot start the exporter (out of memory or threads).");
        release(x);
        return NULL;
    }
    return x;
}

void attnd_otlp_free(attnd_otlp *x) {
    if (!x) return;
    pthread_mutex_lock(&x->mu);
    x->deadline_us = attnd_mono_us() + (uint64_t)x->o.shutdown_ms * 1000;
    x->stop = 1;
    pthread_cond_signal(&x->wake);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
    release(x);
}
