/* metrics.h - the Prometheus counters, gauges and histograms of attnd, kept
 * in atomics so HTTP threads and workers update them without a lock, and
 * written out (through prom.h) for GET /metrics. It knows no route table:
 * the HTTP side gives it the routes' labels at init and counts requests by
 * their index.
 */
#ifndef ATTND_METRICS_H
#define ATTND_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "../base/buffer.h"
#include "../base/reply.h"

#define METRICS_STATUSES 23   /* the status codes counted one by one, plus "other" */
#define METRICS_ROUTES_MAX 32 /* routes counted one by one, the unknown one included */
#define HIST_MAX_BUCKETS 16

/* A histogram with fixed upper bounds; values in the unit of its bounds
 * times `scale` (seconds histograms take microseconds, scale 1e-6). */
typedef struct {
    const char *name;
    const char *help;
    int nb;                                            /* bounds below +Inf */
    double bounds[HIST_MAX_BUCKETS];                   /* upper bounds, ascending */
    double scale;                                      /* value unit -> exported unit */
    atomic_uint_least64_t count[HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
    atomic_uint_least64_t sum;                         /* in value units */
} attnd_hist;

typedef struct {
    const char *route_label[METRICS_ROUTES_MAX]; /* (n_routes) borrowed; the last: unknown paths */
    int n_routes;
    atomic_uint_least64_t requests[METRICS_ROUTES_MAX][METRICS_STATUSES]; /* route × status */
    attnd_hist request_seconds;                  /* first byte of the request to the answer */
    attnd_hist queue_seconds;                    /* admission to compute start */
    attnd_hist compute_seconds[3];               /* attn_forward of a batch, by the precision
                                                    its model computes in: [ATTN_FP32] .. [ATTN_INT8] */
    attnd_hist batch_size;                       /* requests per batch */
    attnd_hist batch_tokens;                     /* query + key tokens per batch */
    atomic_uint_least64_t tokens;                /* query + key tokens computed */
    atomic_uint_least64_t rejected[ATTND_KINDS]; /* refusals by kind (AERR_FIRST and on) */
    atomic_uint_least64_t disconnected;          /* clients that left before their answer */
    atomic_uint_least64_t timeouts;              /* 504 answers */
} attnd_metrics;

/* Zeroes m. route_label[0..n_routes) (1 to METRICS_ROUTES_MAX, borrowed:
 * they outlive m) label the requests counted by route index; the last is
 * the label of every index past it too (paths no route matches). */
void attnd_metrics_init(attnd_metrics *m, const char *const *route_label, int n_routes);
void attnd_metrics_request(attnd_metrics *m, int route, int status, uint64_t total_us);
void attnd_hist_observe(attnd_hist *h, uint64_t v);
void attnd_metrics_reject(attnd_metrics *m, attnd_kind reason);
void attnd_metrics_disconnect(attnd_metrics *m);

/* Writes every metric; depth[i] is the queue depth of model_names[i]. */
void attnd_metrics_write(const attnd_metrics *m, attnd_sbuf *b, const char *const *model_names,
                         const int *depth, int n_models);

#endif
