/* metrics.c - attnd's counters and histograms, and their text (through
 * prom.h). See metrics.h. */
#include "metrics.h"

#include <stdio.h>
#include <string.h>

#include "../../config/config.h" /* ATTND_VERSION, countof */
#include "../../config/enums.h"  /* attnd_precisions */
#include "../../core/attn.h"
#include "prom.h"

static const int STATUSES[METRICS_STATUSES - 1] = {200, 204, 400, 401, 404, 405, 413, 429,
                                                   499, 500, 503, 504, 411, 201, 409, 304,
                                                   403, 507, 408, 414, 431, 505};

static void hist_init(attnd_hist *h, const char *name, const char *help, const double *bounds,
                      int nb, double scale) {
    h->name = name;
    h->help = help;
    h->nb = nb;
    memcpy(h->bounds, bounds, (size_t)nb * sizeof(double));
    h->scale = scale;
    for (int i = 0; i <= HIST_MAX_BUCKETS; i++)
        atomic_init(&h->count[i], 0);
    atomic_init(&h->sum, 0);
}

void attnd_metrics_init(attnd_metrics *m, const char *const *route_label, int n_routes) {
    memset(m, 0, sizeof(*m));
    m->n_routes = n_routes < METRICS_ROUTES_MAX ? n_routes : METRICS_ROUTES_MAX;
    memcpy(m->route_label, route_label, (size_t)m->n_routes * sizeof(*route_label));
    static const double secs[] = {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,    0.25,   0.5,   1,      2.5,   5,    10,    30};
    static const double sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    static const double toks[] = {16, 64, 256, 1024, 4096, 16384, 65536, 262144};
    _Static_assert(countof(secs) <= HIST_MAX_BUCKETS, "HIST_MAX_BUCKETS holds every bound");
    hist_init(&m->request_seconds, "attnd_request_duration_seconds",
              "Time from a request's arrival to its answer.", secs, countof(secs), 1e-6);
    hist_init(&m->queue_seconds, "attnd_queue_seconds",
              "Time a request waited between admission and compute.", secs, countof(secs), 1e-6);
    for (int p = ATTN_FP32; p <= ATTN_INT8; p++)
        hist_init(&m->compute_seconds[p], "attnd_compute_seconds",
                  "Time of one batch's forward, by the precision its model computes in.", secs,
                  countof(secs), 1e-6);
    hist_init(&m->batch_size, "attnd_batch_size", "Requests per computed batch.", sizes,
              countof(sizes), 1);
    hist_init(&m->batch_tokens, "attnd_batch_tokens", "Query plus key tokens per computed batch.",
              toks, countof(toks), 1);
}

static int status_index(int status) {
    for (int i = 0; i < METRICS_STATUSES - 1; i++)
        if (STATUSES[i] == status) return i;
    return METRICS_STATUSES - 1;
}

void attnd_hist_observe(attnd_hist *h, uint64_t v) {
    int i = 0;
    while (i < h->nb && (double)v * h->scale > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->count[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
}

void attnd_metrics_request(attnd_metrics *m, int route, int status, uint64_t total_us) {
    if (route < 0 || route >= m->n_routes) route = m->n_routes - 1;
    if (route < 0) return; /* no labels: nothing to count under */
    atomic_fetch_add_explicit(&m->requests[route][status_index(status)], 1, memory_order_relaxed);
    attnd_hist_observe(&m->request_seconds, total_us);
}

void attnd_metrics_reject(attnd_metrics *m, attnd_kind reason) {
    if (!attnd_kind_is_error(reason) || reason >= ATTND_KINDS) reason = AERR_INTERNAL;
    atomic_fetch_add_explicit(&m->rejected[reason], 1, memory_order_relaxed);
    if (reason == AERR_TIMEOUT) atomic_fetch_add_explicit(&m->timeouts, 1, memory_order_relaxed);
}

void attnd_metrics_disconnect(attnd_metrics *m) {
    atomic_fetch_add_explicit(&m->disconnected, 1, memory_order_relaxed);
}

static uint64_t ld(const atomic_uint_least64_t *a) {
    return atomic_load_explicit((atomic_uint_least64_t *)a, memory_order_relaxed);
}

/* h's series, with label l when given (else h is a family of its own). */
static void hist_write_labeled(const attnd_hist *h, attnd_sbuf *b, const attnd_prom_label *l) {
    uint64_t counts[HIST_MAX_BUCKETS + 1];
    for (int i = 0; i <= h->nb; i++)
        counts[i] = ld(&h->count[i]);
    if (l)
        attnd_prom_histogram_series(b, h->name, l, 1, h->bounds, h->nb, counts,
                                    (double)ld(&h->sum) * h->scale);
    else
        attnd_prom_histogram(b, h->name, h->help, h->bounds, h->nb, counts,
                             (double)ld(&h->sum) * h->scale);
}

static void hist_write(const attnd_hist *h, attnd_sbuf *b) {
    hist_write_labeled(h, b, NULL);
}

/* attnd_compute_seconds: one series per precision, each always there. */
static void compute_write(const attnd_metrics *m, attnd_sbuf *b) {
    const attnd_hist *h = &m->compute_seconds[ATTN_FP32];
    attnd_prom_family(b, h->name, PROM_HISTOGRAM, h->help);
    for (int p = ATTN_FP32; p <= ATTN_INT8; p++) {
        const attnd_prom_label l = {"precision", attnd_enum_name(&attnd_precisions, p)};
        hist_write_labeled(&m->compute_seconds[p], b, &l);
    }
}

/* An info gauge (value 1): what runs, for dashboards and bug reports. */
static void build_info_write(attnd_sbuf *b) {
    const attn_blas_info *blas = attn_blas_get_info();
    const attnd_prom_label l[] = {{"version", ATTND_VERSION},
                                  {"blas_core", blas ? blas->core : "none"},
                                  {"cpu_features", blas ? blas->features : ""},
                                  {"bf16_kernels", attn_bf16_kernels()},
                                  {"int8_kernels", attn_int8_kernels()}};
    attnd_prom_family(b, "attnd_build_info", PROM_GAUGE,
                      "attnd's version, the OpenBLAS kernels in use, the CPU features they "
                      "were chosen from, and the bf16 kernels of bf16 models and the int8 kernels "
                      "of int8 models.");
    attnd_prom_sample(b, "attnd_build_info", l, countof(l), 1);
}

/* attnd_requests_total, by route and status: the pairs seen. */
static void requests_write(const attnd_metrics *m, attnd_sbuf *b) {
    attnd_prom_family(b, "attnd_requests_total", PROM_COUNTER,
                      "Answered requests by route and status.");
    for (int r = 0; r < m->n_routes; r++)
        for (int s = 0; s < METRICS_STATUSES; s++) {
            uint64_t v = ld(&m->requests[r][s]);
            if (!v) continue;
            char st[8] = "other";
            if (s < METRICS_STATUSES - 1) snprintf(st, sizeof(st), "%d", STATUSES[s]);
            const attnd_prom_label l[] = {{"route", m->route_label[r]}, {"status", st}};
            attnd_prom_sample(b, "attnd_requests_total", l, countof(l), (long long)v);
        }
}

/* attnd_rejected_total by reason, then attnd_timeouts_total. */
static void refusals_write(const attnd_metrics *m, attnd_sbuf *b) {
    attnd_prom_family(b, "attnd_rejected_total", PROM_COUNTER,
                      "Requests refused or dropped, by reason.");
    for (int i = AERR_FIRST; i < ATTND_KINDS; i++) {
        const attnd_prom_label l = {"reason", attnd_kind_reason((attnd_kind)i)};
        attnd_prom_sample(b, "attnd_rejected_total", &l, 1, (long long)ld(&m->rejected[i]));
    }
    const attnd_prom_label gone = {"reason", "disconnected"};
    attnd_prom_sample(b, "attnd_rejected_total", &gone, 1, (long long)ld(&m->disconnected));
    attnd_prom_single(b, "attnd_timeouts_total", PROM_COUNTER, "Requests answered 504.",
                      (long long)ld(&m->timeouts));
}

void attnd_metrics_write(const attnd_metrics *m, attnd_sbuf *b, const char *const *model_names,
                         const int *depth, int n_models) {
    build_info_write(b);
    requests_write(m, b);
    hist_write(&m->request_seconds, b);
    hist_write(&m->queue_seconds, b);
    compute_write(m, b);
    hist_write(&m->batch_size, b);
    hist_write(&m->batch_tokens, b);
    attnd_prom_family(b, "attnd_queue_depth", PROM_GAUGE, "Requests waiting in a model's queue.");
    for (int i = 0; i < n_models; i++) {
        const attnd_prom_label l = {"model", model_names[i]};
        attnd_prom_sample(b, "attnd_queue_depth", &l, 1, depth[i]);
    }
    attnd_prom_single(b, "attnd_tokens_total", PROM_COUNTER, "Query plus key tokens computed.",
                      (long long)ld(&m->tokens));
    refusals_write(m, b);
}
