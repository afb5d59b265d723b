/* test_server_otlp_collector.c - the OTLP exporter against a real
 * OpenTelemetry Collector (tests/otel/, built by `make otelcol`; its path
 * in ATTND_OTELCOL): the collector's OTLP/HTTP receiver takes the spans and
 * its file exporter writes what it understood as JSON lines, where every
 * span is found again with its ids, parent, name, kind, times, attributes
 * and status. Then the collector is stopped: submits still return at once,
 * every span fails or is dropped and is counted, the failure is logged once;
 * and started again on the same port: export resumes.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../server/obs/otlp.h"
#include "check_run.h"
#include "otlp_peer.h"

extern char **environ;

#define WAIT_S 60 /* the longest any wait below lasts before it fails the test */

typedef struct {
    char dir[64];
    char out[96]; /* the file exporter's output */
    int port;
    pid_t pid;
} collector;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Writes its config (the out file named `name`) and starts it; returns once
 * its OTLP/HTTP port accepts connections. */
static void collector_start(collector *c, const char *name) {
    const char *bin = getenv("ATTND_OTELCOL");
    ck_assert_msg(
        bin && access(bin, X_OK) == 0,
        "ATTND_OTELCOL does not name the collector; run `make otelcol` (or make test-unit)");
    char cfg[128], logf[128];
    snprintf(c->out, sizeof c->out, "%s/%s", c->dir, name);
    snprintf(cfg, sizeof cfg, "%s/config.yaml", c->dir);
    snprintf(logf, sizeof logf, "%s/collector.log", c->dir);
    FILE *f = fopen(cfg, "w");
    ck_assert(f != NULL);
    fprintf(f,
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:%d\n"
            "exporters:\n  file:\n    path: %s\n    flush_interval: 100ms\n"
            "service:\n  telemetry:\n    metrics:\n      level: none\n    logs:\n"
            "      level: warn\n  pipelines:\n    traces:\n      receivers: [otlp]\n"
            "      exporters: [file]\n",
            c->port, c->out);
    fclose(f);
    /* posix_spawn, not fork: the exporter's thread may be running. */
    char arg[160];
    snprintf(arg, sizeof arg, "--config=file:%s", cfg);
    char *argv[] = {(char *)bin, arg, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logf, O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    ck_assert_int_eq(posix_spawn(&c->pid, bin, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    double until = now_s() + WAIT_S;
    while (!port_open(c->port)) {
        int st;
        ck_assert_msg(waitpid(c->pid, &st, WNOHANG) == 0, "the collector exited; see %s", logf);
        ck_assert_msg(now_s() < until, "the collector did not listen within %d s", WAIT_S);
        usleep(20000);
    }
}

/* A collector of its own on a free port, in a new folder under /tmp. */
static void collector_new(collector *c, const char *name) {
    memset(c, 0, sizeof *c);
    c->port = free_port();
    snprintf(c->dir, sizeof c->dir, "/tmp/attnd-otelcol-XXXXXX");
    ck_assert(mkdtemp(c->dir) != NULL);
    collector_start(c, name);
}

static void collector_stop(collector *c) {
    int st;
    kill(c->pid, SIGTERM);
    waitpid(c->pid, &st, 0);
    c->pid = 0;
}

/* Every span in the collector's output file, by span id: a JSON object
 * {spanId: {"span": ..., "resource": ..., "scope": ...}}. */
static json_t *read_spans(const char *path) {
    json_t *all = json_object();
    FILE *f = fopen(path, "r");
    static char line[1 << 20];
    while (f && fgets(line, sizeof line, f)) {
        json_t *doc = json_loads(line, 0, NULL), *rs, *ss, *sp;
        size_t i, j, k;
        json_array_foreach(json_object_get(doc, "resourceSpans"), i, rs) {
            json_array_foreach(json_object_get(rs, "scopeSpans"), j, ss) {
                json_array_foreach(json_object_get(ss, "spans"), k, sp) {
                    json_object_set_new(all, json_string_value(json_object_get(sp, "spanId")),
                                        json_pack("{s:O,s:O,s:O}", "span", sp, "resource",
                                                  json_object_get(rs, "resource"), "scope",
                                                  json_object_get(ss, "scope")));
                }
            }
        }
        json_decref(doc);
    }
    if (f) fclose(f);
    return all;
}

/* Waits until the output holds every span of spans[0..n). */
static json_t *wait_for_spans(const char *path, const attnd_span *spans, int n) {
    double until = now_s() + WAIT_S;
    for (;;) {
        json_t *all = read_spans(path);
        int found = 0;
        for (int i = 0; i < n; i++) {
            char id[17];
            attnd_hex(id, spans[i].span_id, 8);
            found += json_object_get(all, id) != NULL;
        }
        if (found == n) return all;
        json_decref(all);
        ck_assert_msg(now_s() < until, "%d of %d spans reached %s", found, n, path);
        usleep(50000);
    }
}

/* The collector's record of s holds everything s said. */
static void check_span(json_t *all, const attnd_span *s) {
    char id[33], want[32];
    attnd_hex(id, s->span_id, 8);
    json_t *rec = json_object_get(all, id), *sp = json_object_get(rec, "span");
    ck_assert_ptr_nonnull(sp);
    attnd_hex(id, s->trace_id, 16);
    ck_assert_str_eq(json_string_value(json_object_get(sp, "traceId")), id);
    json_t *parent = json_object_get(sp, "parentSpanId");
    attnd_hex(id, s->parent_id, 8);
    if (strcmp(id, "0000000000000000") == 0)
        ck_assert(!parent || strcmp(json_string_value(parent), "") == 0);
    else
        ck_assert_str_eq(json_string_value(parent), id);
    ck_assert_str_eq(json_string_value(json_object_get(sp, "name")), s->name);
    ck_assert_int_eq(json_integer_value(json_object_get(sp, "kind")), s->kind);
    snprintf(want, sizeof want, "%llu", (unsigned long long)s->start_ns);
    ck_assert_str_eq(json_string_value(json_object_get(sp, "startTimeUnixNano")), want);
    snprintf(want, sizeof want, "%llu", (unsigned long long)s->end_ns);
    ck_assert_str_eq(json_string_value(json_object_get(sp, "endTimeUnixNano")), want);
    ck_assert_int_eq(json_integer_value(json_object_get(sp, "flags")),
                     s->trace_flags | 0x100 | (s->parent_remote ? 0x200 : 0));
    for (int i = 0; i < s->n_attrs; i++) {
        const attnd_span_attr *a = &s->attrs[i];
        json_t *v = json_attr(sp, a->key);
        ck_assert_msg(v != NULL, "span %s lost attribute %s", s->name, a->key);
        if (a->is_int) {
            snprintf(want, sizeof want, "%lld", a->i);
            ck_assert_str_eq(json_string_value(json_object_get(v, "intValue")), want);
        } else {
            ck_assert_str_eq(json_string_value(json_object_get(v, "stringValue")), a->s);
        }
    }
    json_t *status = json_object_get(sp, "status");
    ck_assert_int_eq(json_integer_value(json_object_get(status, "code")), s->code);
    if (s->message[0])
        ck_assert_str_eq(json_string_value(json_object_get(status, "message")), s->message);
    json_t *res = json_object_get(rec, "resource");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_attr(res, "service.name"), "stringValue")), "attnd");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_attr(res, "service.version"), "stringValue")),
        "9.8.7");
    json_t *scope = json_object_get(rec, "scope");
    ck_assert_str_eq(json_string_value(json_object_get(scope, "name")), "attnd");
}

static attnd_otlp *exporter(int port) {
    char url[64], err[256] = "";
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", port);
    attnd_otlp_opts o = {.endpoint = url,
                         .queue_spans = 32,
                         .batch_max = 8,
                         .interval_ms = 20,
                         .timeout_ms = 3000,
                         .shutdown_ms = 5000,
                         .service_version = "9.8.7"};
    attnd_otlp *x = attnd_otlp_new(&o, err, sizeof err);
    ck_assert_msg(x != NULL, "%s", err);
    return x;
}

static void wait_stats(attnd_otlp *x, unsigned long long exported, unsigned long long settled) {
    double until = now_s() + WAIT_S;
    attnd_otlp_stats st;
    for (;;) {
        attnd_otlp_stats_get(x, &st);
        if (st.exported >= exported && st.exported + st.failed + st.dropped >= settled &&
            st.queued == 0)
            return;
        ck_assert_msg(now_s() < until, "exported %llu failed %llu dropped %llu queued %d",
                      st.exported, st.failed, st.dropped, st.queued);
        usleep(20000);
    }
}

/* Two requests' spans: one continuing a caller's trace, sampled, with
 * queue and compute; one new trace answered 503 before compute. */
static int two_requests(attnd_span out[6]) {
    attnd_trace a, b;
    attnd_trace_start(&a, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", NULL);
    attnd_trace_start(&b, NULL, NULL);
    uint64_t t = attnd_unix_ns();
    attnd_request_times ra = {.trace = &a,
                              .method = "POST",
                              .path = "/v1/attention",
                              .route = "/v1/attention",
                              .model = "default",
                              .request_id = "0123456789abcdef",
                              .status = 200,
                              .batch_size = 2,
                              .start_ns = t,
                              .end_ns = t + 5000000,
                              .queue_start_ns = t + 100000,
                              .queue_end_ns = t + 1100000,
                              .compute_start_ns = t + 1100000,
                              .compute_end_ns = t + 4100000};
    attnd_request_times rb = {.trace = &b,
                              .method = "POST",
                              .path = "/v2/models/default/infer",
                              .route = "/v2/models/{name}/infer",
                              .model = "default",
                              .status = 503,
                              .start_ns = t + 7,
                              .end_ns = t + 2000007,
                              .queue_start_ns = t + 1000,
                              .queue_end_ns = t + 2000000};
    int n = attnd_request_spans(&ra, out);
    ck_assert_int_eq(n, 3);
    n += attnd_request_spans(&rb, out + n);
    ck_assert_int_eq(n, 5);
    return n;
}

START_TEST(test_spans_reach_the_collector) {
    collector c;
    collector_new(&c, "spans.jsonl");
    attnd_otlp *x = exporter(c.port);
    attnd_span s[6];
    int n = two_requests(s);
    ck_assert_int_eq(attnd_otlp_submit(x, s, 3), 3);
    ck_assert_int_eq(attnd_otlp_submit(x, s + 3, n - 3), n - 3);
    wait_stats(x, (unsigned)n, (unsigned)n);
    json_t *all = wait_for_spans(c.out, s, n);
    for (int i = 0; i < n; i++)
        check_span(all, &s[i]);
    json_decref(all);
    attnd_otlp_stats st;
    attnd_otlp_stats_get(x, &st);
    ck_assert_int_eq((int)st.failed, 0);
    ck_assert_int_eq((int)st.dropped, 0);
    attnd_otlp_free(x);
    collector_stop(&c);
}
END_TEST

typedef struct {
    attnd_otlp *x;
    int taken;
} submitter;

static void *submit_requests(void *arg) {
    submitter *s = arg;
    for (int i = 0; i < 50; i++) {
        attnd_span sp[6];
        int n = two_requests(sp);
        s->taken += attnd_otlp_submit(s->x, sp, 3);
        s->taken += attnd_otlp_submit(s->x, sp + 3, n - 3);
    }
    return NULL;
}

START_TEST(test_collector_down_then_back) {
    collector c;
    collector_new(&c, "before.jsonl");
    captured log;
    capture_start(&log);
    attnd_otlp *x = exporter(c.port);
    attnd_span s[6];
    int n = two_requests(s);
    attnd_otlp_submit(x, s, n);
    wait_stats(x, (unsigned)n, (unsigned)n);
    collector_stop(&c);
    /* Down: 4 threads submit 50 requests each (250 spans each) into a ring of
     * 32; every call returns, every span is counted. */
    submitter sub[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        sub[i] = (submitter){x, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, submit_requests, &sub[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    wait_stats(x, (unsigned)n, (unsigned)n + 4 * 50 * 5);
    attnd_otlp_stats st;
    attnd_otlp_stats_get(x, &st);
    ck_assert_int_eq((int)st.exported, n);
    ck_assert_int_gt((int)st.failed, 0);
    /* How many fail and how many overflow the ring depends on how the
     * threads interleave (a refused connection fails in microseconds);
     * test_server_otlp counts the drops exactly. */
    ck_assert_int_eq((int)(st.failed + st.dropped), 4 * 50 * 5);
    ck_assert_int_eq(count_lines(log.path, "failed: "), 1);
    /* Back on the same port: export resumes. */
    collector_start(&c, "after.jsonl");
    n = two_requests(s);
    ck_assert_int_eq(attnd_otlp_submit(x, s, n), n);
    wait_stats(x, st.exported + (unsigned)n, 0);
    json_t *all = wait_for_spans(c.out, s, n);
    for (int i = 0; i < n; i++)
        check_span(all, &s[i]);
    json_decref(all);
    attnd_otlp_free(x);
    capture_end(&log);
    ck_assert_int_eq(count_lines(log.path, "works again"), 1);
    ck_assert_int_eq(count_lines(log.path, "failed: "), 1);
    unlink(log.path);
    collector_stop(&c);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("otlp_collector");
    TCase *tc = tcase_create("collector");
    tcase_set_timeout(tc, 4 * WAIT_S);
    tcase_add_checked_fixture(tc, NULL, capture_teardown);
    tcase_add_test(tc, test_spans_reach_the_collector);
    tcase_add_test(tc, test_collector_down_then_back);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return check_run(suite());
}
