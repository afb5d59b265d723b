/* test_server_otlp.c - spans and the OTLP exporter (server/obs/otlp.c,
 * otlp_export.c): a request's spans made from its trace and times; the
 * OTLP/HTTP JSON encoding read back with Jansson, field by field; the
 * exporter against a peer on 127.0.0.1 that answers, refuses, answers with
 * partial success, or hangs: submits from several threads never wait for
 * it, what overflows the ring is dropped and counted exactly, failures are
 * counted and logged once. tests/test_server_otlp_collector.c does the
 * same against a real OpenTelemetry Collector.
 */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/obs/otlp.h"
#include "check_run.h"
#include "otlp_peer.h"

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#define T0 1700000000123456789ull /* a Unix time in ns, past 2^53: exact only as a string */

static attnd_request_times times(const attnd_trace *t, int status) {
    return (attnd_request_times){.trace = t,
                                 .method = "POST",
                                 .path = "/v1/attention",
                                 .route = "/v1/attention",
                                 .model = "default",
                                 .request_id = "req-1",
                                 .status = status,
                                 .batch_size = 3,
                                 .start_ns = T0,
                                 .end_ns = T0 + 900000,
                                 .queue_start_ns = T0 + 1000,
                                 .queue_end_ns = T0 + 251000,
                                 .compute_start_ns = T0 + 251000,
                                 .compute_end_ns = T0 + 851000};
}

static const char *str_attr(json_t *span, const char *key) {
    return json_string_value(json_object_get(json_attr(span, key), "stringValue"));
}

static const char *int_attr(json_t *span, const char *key) {
    return json_string_value(json_object_get(json_attr(span, key), "intValue"));
}

static const char *field(json_t *o, const char *key) {
    return json_string_value(json_object_get(o, key));
}

/* Encodes spans and parses the JSON back; returns the spans array's owner. */
static json_t *encode(const attnd_span *spans, int n, json_t **out_spans) {
    attnd_sbuf sb;
    attnd_sb_init(&sb);
    attnd_otlp_encode(&sb, spans, n, "9.8.7");
    ck_assert(!sb.oom);
    json_error_t e;
    json_t *root = json_loadb(sb.p, sb.len, JSON_REJECT_DUPLICATES, &e);
    ck_assert_msg(root != NULL, "not JSON: %s: %.*s", e.text, (int)sb.len, sb.p);
    attnd_sb_free(&sb);
    *out_spans = json_spans(root);
    ck_assert_int_eq((int)json_array_size(*out_spans), n);
    return root;
}

START_TEST(test_request_spans_encoded) {
    attnd_trace t;
    attnd_span sp[3];
    attnd_trace_start(&t, TP, NULL);
    attnd_request_times r = times(&t, 200);
    ck_assert_int_eq(attnd_request_spans(&r, sp), 3);
    json_t *spans, *root = encode(sp, 3, &spans);
    /* the resource and the scope */
    json_t *rs = json_array_get(json_object_get(root, "resourceSpans"), 0);
    json_t *res = json_object_get(rs, "resource");
    ck_assert_str_eq(str_attr(res, "service.name"), "attnd");
    ck_assert_str_eq(str_attr(res, "service.version"), "9.8.7");
    json_t *scope = json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "scope");
    ck_assert_str_eq(field(scope, "name"), "attnd");
    ck_assert_str_eq(field(scope, "version"), "9.8.7");
    /* the request span: the caller's trace, its own span, the caller's span as parent */
    json_t *req = json_array_get(spans, 0), *q = json_array_get(spans, 1),
           *c = json_array_get(spans, 2);
    char own[17];
    attnd_hex(own, t.span_id, 8);
    ck_assert_str_eq(field(req, "traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(field(req, "spanId"), own);
    ck_assert_str_eq(field(req, "parentSpanId"), "00f067aa0ba902b7");
    ck_assert_str_eq(field(req, "name"), "POST /v1/attention");
    ck_assert_int_eq(json_integer_value(json_object_get(req, "kind")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(req, "flags")), 0x301);
    ck_assert_str_eq(field(req, "startTimeUnixNano"), "1700000000123456789");
    ck_assert_str_eq(field(req, "endTimeUnixNano"), "1700000000124356789");
    ck_assert_str_eq(str_attr(req, "http.request.method"), "POST");
    ck_assert_str_eq(str_attr(req, "url.path"), "/v1/attention");
    ck_assert_str_eq(str_attr(req, "http.route"), "/v1/attention");
    ck_assert_str_eq(int_attr(req, "http.response.status_code"), "200");
    ck_assert_str_eq(str_attr(req, "attnd.model"), "default");
    ck_assert_str_eq(int_attr(req, "attnd.batch_size"), "3");
    ck_assert_str_eq(int_attr(req, "attnd.queue_us"), "250");
    ck_assert_str_eq(int_attr(req, "attnd.compute_us"), "600");
    ck_assert_str_eq(str_attr(req, "attnd.request_id"), "req-1");
    ck_assert_ptr_null(json_attr(req, "error.type"));
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(req, "status"), "code")),
                     0);
    /* its children: same trace, the request span as parent, their own ids */
    ck_assert_str_eq(field(q, "name"), "queue");
    ck_assert_str_eq(field(c, "name"), "compute");
    for (json_t *ch = q; ch; ch = ch == q ? c : NULL) {
        ck_assert_str_eq(field(ch, "traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");
        ck_assert_str_eq(field(ch, "parentSpanId"), own);
        ck_assert_str_ne(field(ch, "spanId"), own);
        ck_assert_int_eq((int)strlen(field(ch, "spanId")), 16);
        ck_assert_int_eq(json_integer_value(json_object_get(ch, "kind")), 1);
        ck_assert_int_eq(json_integer_value(json_object_get(ch, "flags")), 0x101);
    }
    ck_assert_str_ne(field(q, "spanId"), field(c, "spanId"));
    ck_assert_str_eq(field(q, "startTimeUnixNano"), "1700000000123457789");
    ck_assert_str_eq(field(q, "endTimeUnixNano"), "1700000000123707789");
    ck_assert_str_eq(int_attr(q, "attnd.queue_us"), "250");
    ck_assert_str_eq(field(c, "startTimeUnixNano"), "1700000000123707789");
    ck_assert_str_eq(field(c, "endTimeUnixNano"), "1700000000124307789");
    ck_assert_str_eq(int_attr(c, "attnd.compute_us"), "600");
    ck_assert_str_eq(int_attr(c, "attnd.batch_size"), "3");
    ck_assert_str_eq(str_attr(c, "attnd.model"), "default");
    json_decref(root);
}
END_TEST

START_TEST(test_request_spans_cases) {
    attnd_trace t;
    attnd_span sp[3];
    json_t *spans, *root;
    /* A 5xx: error.type and status ERROR. A new trace: no parent, not remote. */
    attnd_trace_start(&t, NULL, NULL);
    attnd_request_times r = times(&t, 503);
    r.compute_start_ns = r.compute_end_ns = 0; /* never computed */
    r.route = NULL;
    ck_assert_int_eq(attnd_request_spans(&r, sp), 2);
    root = encode(sp, 2, &spans);
    json_t *req = json_array_get(spans, 0);
    ck_assert_ptr_null(json_object_get(req, "parentSpanId"));
    ck_assert_int_eq(json_integer_value(json_object_get(req, "flags")), 0x101);
    ck_assert_str_eq(field(req, "name"), "POST /v1/attention"); /* the path, without a route */
    ck_assert_str_eq(str_attr(req, "error.type"), "503");
    json_t *st = json_object_get(req, "status");
    ck_assert_int_eq(json_integer_value(json_object_get(st, "code")), 2);
    ck_assert_str_eq(field(st, "message"), "HTTP 503");
    ck_assert_ptr_null(json_attr(req, "attnd.compute_us"));
    ck_assert_str_eq(field(json_array_get(spans, 1), "name"), "queue");
    json_decref(root);
    /* Refused before the queue: the request span alone. */
    r.queue_start_ns = r.queue_end_ns = 0;
    r.status = 400;
    ck_assert_int_eq(attnd_request_spans(&r, sp), 1);
    /* Unsampled by the caller: nothing to record. */
    attnd_trace_start(&t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", NULL);
    r = times(&t, 200);
    ck_assert_int_eq(attnd_request_spans(&r, sp), 0);
}
END_TEST

START_TEST(test_encoding_odd_strings) {
    attnd_span s;
    memset(&s, 0, sizeof s);
    s.trace_id[15] = 1;
    s.span_id[0] = 0xab;
    snprintf(s.name, sizeof s.name, "GET /a\"b\\c\n\x01");
    attnd_span_str(&s, "url.path", "/caf\xc3\xa9/\xff\xfe"); /* UTF-8, then bytes that are not */
    attnd_span_int(&s, "neg", -42);
    char big[300];
    memset(big, 'x', sizeof big - 1), big[sizeof big - 1] = 0;
    attnd_span_str(&s, "big", big);
    for (int i = 0; i < 20; i++) /* past ATTND_SPAN_ATTRS: left out */
        attnd_span_int(&s, "many", i);
    ck_assert_int_eq(s.n_attrs, ATTND_SPAN_ATTRS);
    json_t *spans, *root = encode(&s, 1, &spans);
    json_t *sp = json_array_get(spans, 0);
    ck_assert_str_eq(field(sp, "traceId"), "00000000000000000000000000000001");
    ck_assert_str_eq(field(sp, "spanId"), "ab00000000000000");
    ck_assert_str_eq(field(sp, "name"), "GET /a\"b\\c\n\x01");
    ck_assert_str_eq(str_attr(sp, "url.path"), "/caf\xc3\xa9/\xef\xbf\xbd\xef\xbf\xbd");
    ck_assert_str_eq(int_attr(sp, "neg"), "-42");
    ck_assert_int_eq((int)strlen(str_attr(sp, "big")), ATTND_SPAN_STR - 1);
    json_decref(root);
    /* No spans at all is still a well-formed request. */
    root = encode(NULL, 0, &spans);
    json_decref(root);
}
END_TEST

static attnd_otlp *exporter(int port, int queue, int batch, int interval_ms, int timeout_ms) {
    char url[64], err[256] = "";
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", port);
    attnd_otlp_opts o = {.endpoint = url,
                         .queue_spans = queue,
                         .batch_max = batch,
                         .interval_ms = interval_ms,
                         .timeout_ms = timeout_ms,
                         .shutdown_ms = 300,
                         .service_version = "9.8.7"};
    attnd_otlp *x = attnd_otlp_new(&o, err, sizeof err);
    ck_assert_msg(x != NULL, "%s", err);
    return x;
}

static attnd_span one_span(int i) {
    attnd_span s;
    memset(&s, 0, sizeof s);
    attnd_trace_random_id(s.trace_id, sizeof s.trace_id);
    attnd_trace_random_id(s.span_id, sizeof s.span_id);
    snprintf(s.name, sizeof s.name, "span %d", i);
    s.kind = ATTND_SPAN_INTERNAL;
    s.start_ns = T0 + (uint64_t)i;
    s.end_ns = T0 + (uint64_t)i + 10;
    return s;
}

static attnd_otlp_stats stats(attnd_otlp *x) {
    attnd_otlp_stats s;
    attnd_otlp_stats_get(x, &s);
    return s;
}

/* n spans named "span 0".. */
static void make_spans(attnd_span *s, int n) {
    for (int i = 0; i < n; i++)
        s[i] = one_span(i);
}

/* The peer's requests so far, and the spans of the latest (caller decrefs
 * *root). */
static int peer_spans(otlp_peer *p, json_t **root, json_t **spans) {
    pthread_mutex_lock(&p->mu);
    int n = p->requests;
    *root = json_loads(p->last_body, 0, NULL);
    pthread_mutex_unlock(&p->mu);
    ck_assert(*root != NULL);
    *spans = json_spans(*root);
    return n;
}

START_TEST(test_export_answered) {
    otlp_peer p;
    peer_start(&p, 200, "{}");
    attnd_otlp *x = exporter(p.port, 64, 4, 20, 5000);
    attnd_span s[4];
    make_spans(s, 4);
    ck_assert_int_eq(attnd_otlp_submit(x, s, 4), 4);
    peer_wait(&p, 1);
    /* The body on the wire is the encoder's. */
    json_t *root, *spans;
    ck_assert_int_eq(peer_spans(&p, &root, &spans), 1);
    ck_assert_int_eq((int)json_array_size(spans), 4);
    ck_assert_str_eq(field(json_array_get(spans, 3), "name"), "span 3");
    json_decref(root);
    /* A span alone is sent once interval_ms has passed. */
    ck_assert_int_eq(attnd_otlp_submit(x, s, 1), 1);
    peer_wait(&p, 2);
    attnd_otlp_free(x); /* sends nothing more: the ring is empty */
    ck_assert_int_eq(peer_spans(&p, &root, &spans), 2);
    ck_assert_int_eq((int)json_array_size(spans), 1);
    json_decref(root);
    peer_stop(&p);
}
END_TEST

START_TEST(test_free_flushes) {
    otlp_peer p;
    peer_start(&p, 200, "{}");
    /* A minute's interval and room for 64: nothing would be sent before free. */
    attnd_otlp *x = exporter(p.port, 64, 64, 60000, 5000);
    attnd_span s[5];
    make_spans(s, 5);
    ck_assert_int_eq(attnd_otlp_submit(x, s, 5), 5);
    ck_assert_int_eq(stats(x).queued, 5);
    attnd_otlp_free(x); /* sends them, within shutdown_ms; the peer has answered */
    json_t *root, *spans;
    ck_assert_int_eq(peer_spans(&p, &root, &spans), 1);
    peer_stop(&p);
    ck_assert_int_eq((int)json_array_size(spans), 5);
    json_decref(root);
}
END_TEST

START_TEST(test_export_partial_and_refused) {
    captured log;
    capture_start(&log);
    otlp_peer p;
    peer_start(&p, 200, "{\"partialSuccess\":{\"rejectedSpans\":\"2\",\"errorMessage\":\"no\"}}");
    attnd_otlp *x = exporter(p.port, 64, 5, 20, 5000);
    attnd_span s[5];
    make_spans(s, 5);
    ck_assert_int_eq(attnd_otlp_submit(x, s, 5), 5);
    peer_wait(&p, 1);
    attnd_otlp_free(x);
    /* Refused whole: 400 and the collector's reason. */
    p.status = 400;
    p.answer = "{\"code\":3,\"message\":\"bad\"}";
    x = exporter(p.port, 64, 5, 20, 5000);
    ck_assert_int_eq(attnd_otlp_submit(x, s, 5), 5);
    peer_wait(&p, 2);
    attnd_otlp_stats st;
    while ((st = stats(x)).failed < 5) /* the answer is read after the peer has the request */
        usleep(1000);
    ck_assert_int_eq((int)st.exported, 0);
    ck_assert_int_eq((int)st.failed, 5);
    ck_assert_int_eq((int)st.batches, 1);
    attnd_otlp_free(x);
    capture_end(&log);
    ck_assert_int_eq(count_lines(log.path, "the collector rejected 2 of 5 spans"), 1);
    ck_assert_int_eq(count_lines(log.path, "HTTP 400: {\"code\":3"), 1);
    unlink(log.path);
    peer_stop(&p);
}
END_TEST

typedef struct {
    attnd_otlp *x;
    int n, taken;
} submitter;

static void *submit_many(void *arg) {
    submitter *s = arg;
    for (int i = 0; i < s->n; i++) {
        attnd_span sp = one_span(i);
        s->taken += attnd_otlp_submit(s->x, &sp, 1);
    }
    return NULL;
}

/* n spans from each of 4 threads; returns how many the ring took. */
static int submit_from_threads(attnd_otlp *x, int n) {
    submitter s[4];
    pthread_t th[4];
    int taken = 0;
    for (int i = 0; i < 4; i++) {
        s[i] = (submitter){x, n, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, submit_many, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        taken += s[i].taken;
    }
    return taken;
}

START_TEST(test_ring_overflow_while_collector_hangs) {
    otlp_peer p;
    peer_start(&p, 0, ""); /* reads the POST, never answers */
    attnd_otlp *x = exporter(p.port, 8, 4, 10, 60000);
    attnd_span s[4];
    make_spans(s, 4);
    ck_assert_int_eq(attnd_otlp_submit(x, s, 4), 4);
    peer_wait(&p, 1); /* the exporter's thread is inside a POST that will not end */
    /* 400 spans from 4 threads: the ring takes 8, the rest are dropped, and
     * no submit waits for the hung POST (or this would never return). */
    ck_assert_int_eq(submit_from_threads(x, 100), 8);
    attnd_otlp_stats st = stats(x);
    ck_assert_int_eq((int)st.dropped, 392);
    ck_assert_int_eq(st.queued, 8);
    ck_assert_int_eq((int)st.exported, 0);
    /* All or none: a request's 3 spans do not fit in a full ring. */
    ck_assert_int_eq(attnd_otlp_submit(x, s, 3), 0);
    ck_assert_int_eq((int)stats(x).dropped, 395);
    attnd_otlp_free(x); /* cuts the hung POST at shutdown_ms */
    peer_stop(&p);
}
END_TEST

START_TEST(test_collector_down_logged_once) {
    captured log;
    capture_start(&log);
    attnd_otlp *x = exporter(free_port(), 16, 2, 5, 2000); /* nothing listens there */
    int taken = submit_from_threads(x, 200);
    attnd_otlp_stats st;
    while ((st = stats(x)).failed < (unsigned long long)taken) /* each taken span is tried */
        usleep(1000);
    ck_assert_int_eq((int)st.failed, taken);
    ck_assert_int_eq((int)(st.dropped + st.failed), 800);
    ck_assert_int_eq((int)st.exported, 0);
    ck_assert_int_ge((int)st.batches, taken / 2);
    /* Many failed POSTs, one line (at most one a minute). */
    ck_assert_int_eq(count_lines(log.path, "otlp: export to http://127.0.0.1:"), 1);
    attnd_otlp_free(x);
    capture_end(&log);
    /* At shutdown, a summary of what failed since that line. */
    if (taken > 2) ck_assert_int_eq(count_lines(log.path, "more spans in"), 1);
    unlink(log.path);
}
END_TEST

START_TEST(test_options_refused) {
    char err[256] = "";
    attnd_otlp_opts o = {.endpoint = "ftp://x/v1/traces",
                         .queue_spans = 8,
                         .batch_max = 4,
                         .interval_ms = 10,
                         .timeout_ms = 10};
    ck_assert_ptr_null(attnd_otlp_new(&o, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "tracing.otlp_endpoint"));
    o.endpoint = "http://127.0.0.1:1/v1/traces";
    o.batch_max = 9;
    ck_assert_ptr_null(attnd_otlp_new(&o, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "batch_max 9"));
    o.batch_max = 4;
    o.interval_ms = 0;
    ck_assert_ptr_null(attnd_otlp_new(&o, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "interval_ms"));
    attnd_otlp_free(NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("otlp");
    TCase *tc = tcase_create("spans");
    tcase_add_test(tc, test_request_spans_encoded);
    tcase_add_test(tc, test_request_spans_cases);
    tcase_add_test(tc, test_encoding_odd_strings);
    suite_add_tcase(s, tc);
    TCase *ex = tcase_create("exporter");
    tcase_set_timeout(ex, 60);
    tcase_add_checked_fixture(ex, NULL, capture_teardown);
    tcase_add_test(ex, test_export_answered);
    tcase_add_test(ex, test_free_flushes);
    tcase_add_test(ex, test_export_partial_and_refused);
    tcase_add_test(ex, test_ring_overflow_while_collector_hangs);
    tcase_add_test(ex, test_collector_down_logged_once);
    tcase_add_test(ex, test_options_refused);
    suite_add_tcase(s, ex);
    return s;
}

int main(void) {
    return check_run(suite());
}
