/* prom.h - the Prometheus text exposition format (0.0.4), written in one
 * place: a family's # HELP and # TYPE lines, its samples with their labels
 * (values escaped as the format asks), and a histogram's cumulative
 * buckets, sum and count. Every line of GET /metrics goes through here:
 * the counters and histograms (metrics.c), the scheduler's gauges and the
 * session table's. It writes into a buffer and keeps no state.
 */
#ifndef ATTND_PROM_H
#define ATTND_PROM_H

#include <stdint.h>

#include "../base/buffer.h"

typedef enum { PROM_COUNTER, PROM_GAUGE, PROM_HISTOGRAM } attnd_prom_type;

/* One label of a sample: its name and its value (any bytes; escaped). */
typedef struct {
    const char *name;
    const char *value;
} attnd_prom_label;

/* "# HELP name help" and "# TYPE name type": once per family, before its
 * samples. */
void attnd_prom_family(attnd_sbuf *b, const char *name, attnd_prom_type type, const char *help);
/* "name{l1="v1",...} v": one sample of the family last begun; nlabels may
 * be 0 (labels NULL). */
void attnd_prom_sample(attnd_sbuf *b, const char *name, const attnd_prom_label *labels, int nlabels,
                       long long v);
/* A family of one sample without labels: its HELP, TYPE and value. */
void attnd_prom_single(attnd_sbuf *b, const char *name, attnd_prom_type type, const char *help,
                       long long v);
/* A histogram family: bounds[0..nb) ascending upper bounds, counts[0..nb]
 * the observations of each bucket (not cumulative; counts[nb] past every
 * bound), sum their total in the exported unit. Writes name_bucket{le=...}
 * cumulative up to +Inf, name_sum and name_count. */
void attnd_prom_histogram(attnd_sbuf *b, const char *name, const char *help, const double *bounds,
                          int nb, const uint64_t *counts, double sum);
/* One series of a histogram family begun with attnd_prom_family: the same
 * lines, each with labels (at most PROM_MAX_LABELS) before le. */
enum { PROM_MAX_LABELS = 4 };
void attnd_prom_histogram_series(attnd_sbuf *b, const char *name, const attnd_prom_label *labels,
                                 int nlabels, const double *bounds, int nb, const uint64_t *counts,
                                 double sum);

#endif
