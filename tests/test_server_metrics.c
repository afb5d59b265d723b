/* test_server_metrics.c - the /metrics text (server/obs/metrics.c through
 * server/obs/prom.c), parsed back line by line the way a scraper reads the
 * text format: every sample belongs to a family announced by one # HELP
 * and one # TYPE line before it; names and label values as written; a
 * histogram's buckets ascend, are cumulative, end at +Inf equal to its
 * _count, with a _sum; and the values are those counted. Label values are
 * escaped. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/attn.h" /* ATTN_FP32, ATTN_BF16 */
#include "../server/obs/metrics.h"
#include "../server/obs/prom.h"
#include "check_run.h"

enum { MAX_LINES = 512 };

/* One sample line, parsed. */
typedef struct {
    char name[96];    /* the metric's name, a histogram's _bucket/_sum/_count included */
    char labels[160]; /* what stood between the braces, "" when none */
    double value;
} sample;

/* What the text says, and whether its structure holds. */
typedef struct {
    sample s[MAX_LINES];
    int n;
    char families[64][96]; /* (nf) names with HELP and TYPE */
    char types[64][16];
    int nf;
} parsed;

/* The family a sample's name belongs to: a histogram's suffix taken off. */
static int family_of(const parsed *p, const char *name) {
    for (int i = 0; i < p->nf; i++) {
        size_t k = strlen(p->families[i]);
        if (strncmp(name, p->families[i], k) != 0) continue;
        const char *rest = name + k;
        if (!*rest) return i;
        if (strcmp(p->types[i], "histogram") == 0 &&
            (!strcmp(rest, "_bucket") || !strcmp(rest, "_sum") || !strcmp(rest, "_count")))
            return i;
    }
    return -1;
}

/* A # HELP or # TYPE line: the family's HELP first, then its TYPE once. */
static void comment_line(parsed *p, const char *line) {
    char name[96], word[64];
    if (sscanf(line, "# HELP %95s %63s", name, word) == 2) {
        for (int i = 0; i < p->nf; i++)
            ck_assert_msg(strcmp(p->families[i], name) != 0, "%s announced twice", name);
        ck_assert_int_lt(p->nf, 64);
        snprintf(p->families[p->nf], sizeof p->families[0], "%s", name);
        p->types[p->nf][0] = '\0';
        p->nf++;
        return;
    }
    ck_assert_msg(sscanf(line, "# TYPE %95s %15s", name, word) == 2, "bad line: %s", line);
    ck_assert_msg(p->nf > 0 && !strcmp(p->families[p->nf - 1], name) && !p->types[p->nf - 1][0],
                  "TYPE of %s without its HELP just before", name);
    ck_assert_msg(!strcmp(word, "counter") || !strcmp(word, "gauge") || !strcmp(word, "histogram"),
                  "type %s", word);
    snprintf(p->types[p->nf - 1], sizeof p->types[0], "%.15s", word);
}

/* A sample line: name, {labels}, value; its family announced already. */
static void sample_line(parsed *p, const char *line) {
    sample *s = &p->s[p->n++];
    size_t k = strcspn(line, "{ ");
    ck_assert_uint_lt(k, sizeof s->name);
    memcpy(s->name, line, k);
    s->name[k] = '\0';
    const char *rest = line + k;
    s->labels[0] = '\0';
    if (*rest == '{') {
        const char *end = strstr(rest, "} ");
        ck_assert_msg(end != NULL, "unclosed labels: %s", line);
        snprintf(s->labels, sizeof s->labels, "%.*s", (int)(end - rest - 1), rest + 1);
        rest = end + 1;
    }
    char *after;
    s->value = strtod(rest, &after);
    ck_assert_msg(after != rest + 1 && *after == '\0', "bad value: %s", line);
    ck_assert_msg(family_of(p, s->name) >= 0, "%s has no # HELP/# TYPE before it", s->name);
}

static void parse(parsed *p, const char *text) {
    memset(p, 0, sizeof *p);
    char line[512];
    for (const char *t = text; *t;) {
        size_t k = strcspn(t, "\n");
        ck_assert_msg(t[k] == '\n', "the text does not end in a newline");
        ck_assert_uint_lt(k, sizeof line);
        memcpy(line, t, k);
        line[k] = '\0';
        t += k + 1;
        ck_assert_int_lt(p->n, MAX_LINES);
        if (line[0] == '#')
            comment_line(p, line);
        else
            sample_line(p, line);
    }
}

/* The value of the sample name{labels}; fails when there is none. */
static double value_of(const parsed *p, const char *name, const char *labels) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].name, name) && !strcmp(p->s[i].labels, labels)) return p->s[i].value;
    ck_abort_msg("no sample %s{%s}", name, labels);
    return NAN;
}

/* A histogram's series with labels `with` ("" for none, else e.g.
 * precision="fp32"): ascending bounds, cumulative counts, +Inf last and
 * equal to _count. Returns the number of buckets. */
static int check_series(const parsed *p, const char *name, const char *with) {
    char bucket[128], count[128], prefix[128];
    snprintf(bucket, sizeof bucket, "%s_bucket", name);
    snprintf(count, sizeof count, "%s_count", name);
    snprintf(prefix, sizeof prefix, "%s%sle=\"", with, *with ? "," : "");
    double last_le = -INFINITY, last = 0;
    int nb = 0, inf = 0;
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->s[i].name, bucket) != 0 ||
            strncmp(p->s[i].labels, prefix, strlen(prefix)) != 0)
            continue;
        const char *at = p->s[i].labels + strlen(prefix);
        ck_assert_msg(!inf, "%s: a bucket after +Inf", name);
        double le = strncmp(at, "+Inf", 4) == 0 ? INFINITY : strtod(at, NULL);
        inf = isinf(le);
        ck_assert_msg(le > last_le, "%s: bounds not ascending", name);
        ck_assert_msg(p->s[i].value >= last, "%s: buckets not cumulative", name);
        last_le = le;
        last = p->s[i].value;
        nb++;
    }
    ck_assert_msg(inf, "%s{%s}: no +Inf bucket", name, with);
    ck_assert(last == value_of(p, count, with));
    char sum[128];
    snprintf(sum, sizeof sum, "%s_sum", name);
    (void)value_of(p, sum, with);
    return nb;
}

static int check_histogram(const parsed *p, const char *name) {
    return check_series(p, name, "");
}

static const char *const LABELS[] = {"/v1/attention", "/v2/models/:name/infer", "unknown"};

START_TEST(test_metrics_parse_back) {
    static attnd_metrics m;
    attnd_metrics_init(&m, LABELS, 3);
    attnd_metrics_request(&m, 0, 200, 1500);
    attnd_metrics_request(&m, 0, 200, 2400000);
    attnd_metrics_request(&m, 1, 429, 10);
    attnd_metrics_request(&m, 17, 404, 10); /* past the labels: unknown */
    attnd_metrics_request(&m, 1, 418, 10);  /* a status not counted alone: other */
    attnd_metrics_reject(&m, AERR_QUEUE_FULL);
    attnd_metrics_reject(&m, AERR_TIMEOUT);
    attnd_metrics_disconnect(&m);
    attnd_hist_observe(&m.compute_seconds[ATTN_FP32], 300);
    attnd_hist_observe(&m.compute_seconds[ATTN_FP32], 40000);
    attnd_hist_observe(&m.compute_seconds[ATTN_BF16], 2000);
    attnd_hist_observe(&m.compute_seconds[ATTN_INT8], 700);
    attnd_hist_observe(&m.compute_seconds[ATTN_INT8], 800);
    attnd_hist_observe(&m.batch_size, 3);
    attnd_hist_observe(&m.batch_size, 1000); /* past every bound */
    attnd_sbuf b;
    attnd_sb_init(&b);
    const char *names[2] = {"default", "enc.1"};
    int depth[2] = {7, 0};
    attnd_metrics_write(&m, &b, names, depth, 2);
    ck_assert(!b.oom);
    static parsed p;
    parse(&p, b.p);
    ck_assert(value_of(&p, "attnd_requests_total", "route=\"/v1/attention\",status=\"200\"") == 2);
    ck_assert(value_of(&p, "attnd_requests_total",
                       "route=\"/v2/models/:name/infer\",status=\"429\"") == 1);
    ck_assert(value_of(&p, "attnd_requests_total", "route=\"unknown\",status=\"404\"") == 1);
    ck_assert(value_of(&p, "attnd_requests_total",
                       "route=\"/v2/models/:name/infer\",status=\"other\"") == 1);
    ck_assert_int_eq(check_histogram(&p, "attnd_request_duration_seconds"), 17);
    ck_assert(value_of(&p, "attnd_request_duration_seconds_count", "") == 5);
    ck_assert(fabs(value_of(&p, "attnd_request_duration_seconds_sum", "") - 2.40153) < 1e-9);
    ck_assert(value_of(&p, "attnd_request_duration_seconds_bucket", "le=\"0.0025\"") == 4);
    ck_assert_int_eq(check_histogram(&p, "attnd_batch_size"), 10);
    ck_assert(value_of(&p, "attnd_batch_size_bucket", "le=\"2\"") == 0);
    ck_assert(value_of(&p, "attnd_batch_size_bucket", "le=\"4\"") == 1);
    ck_assert(value_of(&p, "attnd_batch_size_bucket", "le=\"+Inf\"") == 2);
    check_histogram(&p, "attnd_queue_seconds");
    /* compute by precision: both series, each observation in its own */
    ck_assert_int_eq(check_series(&p, "attnd_compute_seconds", "precision=\"fp32\""), 17);
    ck_assert_int_eq(check_series(&p, "attnd_compute_seconds", "precision=\"bf16\""), 17);
    ck_assert(value_of(&p, "attnd_compute_seconds_count", "precision=\"fp32\"") == 2);
    ck_assert(value_of(&p, "attnd_compute_seconds_count", "precision=\"bf16\"") == 1);
    ck_assert_int_eq(check_series(&p, "attnd_compute_seconds", "precision=\"int8\""), 17);
    ck_assert(value_of(&p, "attnd_compute_seconds_count", "precision=\"int8\"") == 2);
    ck_assert(value_of(&p, "attnd_compute_seconds_bucket", "precision=\"bf16\",le=\"0.001\"") == 0);
    ck_assert(value_of(&p, "attnd_compute_seconds_bucket", "precision=\"bf16\",le=\"0.0025\"") ==
              1);
    check_histogram(&p, "attnd_batch_tokens");
    ck_assert(value_of(&p, "attnd_queue_depth", "model=\"default\"") == 7);
    ck_assert(value_of(&p, "attnd_queue_depth", "model=\"enc.1\"") == 0);
    ck_assert(value_of(&p, "attnd_rejected_total", "reason=\"queue_full\"") == 1);
    ck_assert(value_of(&p, "attnd_rejected_total", "reason=\"disconnected\"") == 1);
    ck_assert(value_of(&p, "attnd_rejected_total", "reason=\"conflict\"") == 0);
    ck_assert(value_of(&p, "attnd_timeouts_total", "") == 1);
    ck_assert(value_of(&p, "attnd_tokens_total", "") == 0);
    attnd_sb_free(&b);
}
END_TEST

/* The writer alone: label values escaped, one HELP and TYPE a family. */
START_TEST(test_prom_writer) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    const attnd_prom_label l[] = {{"path", "a\"b\\c\nd"}, {"k", "v"}};
    attnd_prom_family(&b, "x_total", PROM_COUNTER, "Things.");
    attnd_prom_sample(&b, "x_total", l, 2, 3);
    attnd_prom_single(&b, "y", PROM_GAUGE, "One gauge.", -2);
    const double bounds[] = {0.5, 1};
    const uint64_t counts[] = {1, 0, 2};
    attnd_prom_histogram(&b, "h", "A histogram.", bounds, 2, counts, 4.5);
    ck_assert_str_eq(b.p, "# HELP x_total Things.\n# TYPE x_total counter\n"
                          "x_total{path=\"a\\\"b\\\\c\\nd\",k=\"v\"} 3\n"
                          "# HELP y One gauge.\n# TYPE y gauge\ny -2\n"
                          "# HELP h A histogram.\n# TYPE h histogram\n"
                          "h_bucket{le=\"0.5\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 3\n"
                          "h_sum 4.5\nh_count 3\n");
    static parsed p;
    parse(&p, b.p);
    ck_assert_int_eq(p.nf, 3);
    ck_assert_int_eq(check_histogram(&p, "h"), 3);
    attnd_sb_free(&b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_metrics");
    TCase *tc = tcase_create("metrics");
    tcase_add_test(tc, test_metrics_parse_back);
    tcase_add_test(tc, test_prom_writer);
    suite_add_tcase(s, tc);
    return check_run(s);
}
