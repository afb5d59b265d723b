/* metrics.c - Prometheus text format for attnd's counters. See metrics.h. */
#include "metrics.h"

#include <stdio.h>
#include <string.h>

#include "../../core/attn.h"
#include "../http/http.h" /* ATTND_VERSION */

static const int STATUSES[METRICS_STATUSES - 1] = {200, 204, 400, 401, 404, 405, 413, 429,
                                                   499, 500, 503, 504, 411, 201, 409, 304};

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

void attnd_metrics_init(attnd_metrics *m) {
    memset(m, 0, sizeof(*m));
    static const double secs[] = {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,    0.25,   0.5,   1,      2.5,   5,    10,    30};
    static const double sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    static const double toks[] = {16, 64, 256, 1024, 4096, 16384, 65536, 262144};
#define NB(a) (int)countof(a)
    _Static_assert(NB(secs) <= HIST_MAX_BUCKETS, "HIST_MAX_BUCKETS holds every bound");
    hist_init(&m->request_seconds, "attnd_request_duration_seconds",
              "Time from a request's arrival to its answer.", secs, NB(secs), 1e-6);
    hist_init(&m->queue_seconds, "attnd_queue_seconds",
              "Time a request waited between admission and compute.", secs, NB(secs), 1e-6);
    hist_init(&m->compute_seconds, "attnd_compute_seconds", "Time of one batch's forward.", secs,
              NB(secs), 1e-6);
    hist_init(&m->batch_size, "attnd_batch_size", "Requests per computed batch.", sizes, NB(sizes),
              1);
    hist_init(&m->batch_tokens, "attnd_batch_tokens", "Query plus key tokens per computed batch.",
              toks, NB(toks), 1);
#undef NB
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

void attnd_metrics_request(attnd_metrics *m, attnd_route_id route, int status, uint64_t total_us) {
    if (route > R_COUNT) route = R_UNKNOWN;
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

static void hist_write(const attnd_hist *h, attnd_sbuf *b) {
    attnd_sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    uint64_t cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += ld(&h->count[i]);
        attnd_sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->bounds[i],
                        (unsigned long long)cum);
    }
    cum += ld(&h->count[h->nb]);
    attnd_sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", h->name, (unsigned long long)cum);
    attnd_sb_printf(b, "%s_sum %.9g\n", h->name, (double)ld(&h->sum) * h->scale);
    attnd_sb_printf(b, "%s_count %llu\n", h->name, (unsigned long long)cum);
}

/* An info gauge (value 1): what runs, for dashboards and bug reports. */
static void build_info_write(attnd_sbuf *b) {
    const attn_blas_info *blas = attn_blas_get_info();
    attnd_sb_printf(
        b,
        "# HELP attnd_build_info attnd's version, the OpenBLAS kernels in use and the CPU "
        "features they were chosen from.\n"
        "# TYPE attnd_build_info gauge\n"
        "attnd_build_info{version=\"%s\",blas_core=\"%s\",cpu_features=\"%s\"} 1\n",
        ATTND_VERSION, blas ? blas->core : "none", blas ? blas->features : "");
}

void attnd_metrics_write(const attnd_metrics *m, attnd_sbuf *b, const char *const *model_names,
                         const int *depth, int n_models) {
    build_info_write(b);
    attnd_sb_puts(b, "# HELP attnd_requests_total Answered requests by route and status.\n"
                     "# TYPE attnd_requests_total counter\n");
    for (int r = 0; r <= R_COUNT; r++)
        for (int s = 0; s < METRICS_STATUSES; s++) {
            uint64_t v = ld(&m->requests[r][s]);
            if (!v) continue;
            char st[8] = "other";
            if (s < METRICS_STATUSES - 1) snprintf(st, sizeof(st), "%d", STATUSES[s]);
            attnd_sb_printf(b, "attnd_requests_total{route=\"%s\",status=\"%s\"} %llu\n",
                            attnd_route_label((attnd_route_id)r), st, (unsigned long long)v);
        }
    hist_write(&m->request_seconds, b);
    hist_write(&m->queue_seconds, b);
    hist_write(&m->compute_seconds, b);
    hist_write(&m->batch_size, b);
    hist_write(&m->batch_tokens, b);
    attnd_sb_puts(b, "# HELP attnd_queue_depth Requests waiting in a model's queue.\n"
                     "# TYPE attnd_queue_depth gauge\n");
    for (int i = 0; i < n_models; i++)
        attnd_sb_printf(b, "attnd_queue_depth{model=\"%s\"} %d\n", model_names[i], depth[i]);
    attnd_sb_printf(b,
                    "# HELP attnd_tokens_total Query plus key tokens computed.\n"
                    "# TYPE attnd_tokens_total counter\nattnd_tokens_total %llu\n",
                    (unsigned long long)ld(&m->tokens));
    attnd_sb_puts(b, "# HELP attnd_rejected_total Requests refused or dropped, by reason.\n"
                     "# TYPE attnd_rejected_total counter\n");
    for (int i = AERR_FIRST; i < ATTND_KINDS; i++)
        attnd_sb_printf(b, "attnd_rejected_total{reason=\"%s\"} %llu\n",
                        attnd_kind_reason((attnd_kind)i), (unsigned long long)ld(&m->rejected[i]));
    attnd_sb_printf(b, "attnd_rejected_total{reason=\"disconnected\"} %llu\n",
                    (unsigned long long)ld(&m->disconnected));
    attnd_sb_printf(b,
                    "# HELP attnd_timeouts_total Requests answered 504.\n"
                    "# TYPE attnd_timeouts_total counter\nattnd_timeouts_total %llu\n",
                    (unsigned long long)ld(&m->timeouts));
}
