/* prom.c - the Prometheus text format's lines (prom.h). */
#include "prom.h"

#include <stdio.h>

static const char *const TYPE_WORDS[] = {"counter", "gauge", "histogram"};

void attnd_prom_family(attnd_sbuf *b, const char *name, attnd_prom_type type, const char *help) {
    attnd_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, TYPE_WORDS[type]);
}

/* A label value as the format quotes it: backslash, quote and newline
 * escaped. */
static void label_value(attnd_sbuf *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            attnd_sb_putc(b, '\\');
        else if (*v == '\n') {
            attnd_sb_puts(b, "\\n");
            continue;
        }
        attnd_sb_putc(b, *v);
    }
}

/* name{l1="v1",...} without the value. */
static void sample_name(attnd_sbuf *b, const char *name, const attnd_prom_label *labels,
                        int nlabels) {
    attnd_sb_puts(b, name);
    for (int i = 0; i < nlabels; i++) {
        attnd_sb_printf(b, "%c%s=\"", i ? ',' : '{', labels[i].name);
        label_value(b, labels[i].value);
        attnd_sb_putc(b, '"');
    }
    if (nlabels) attnd_sb_putc(b, '}');
}

void attnd_prom_sample(attnd_sbuf *b, const char *name, const attnd_prom_label *labels, int nlabels,
                       long long v) {
    sample_name(b, name, labels, nlabels);
    attnd_sb_printf(b, " %lld\n", v);
}

void attnd_prom_single(attnd_sbuf *b, const char *name, attnd_prom_type type, const char *help,
                       long long v) {
    attnd_prom_family(b, name, type, help);
    attnd_prom_sample(b, name, NULL, 0, v);
}

void attnd_prom_histogram_series(attnd_sbuf *b, const char *name, const attnd_prom_label *labels,
                                 int nlabels, const double *bounds, int nb, const uint64_t *counts,
                                 double sum) {
    attnd_prom_label with_le[PROM_MAX_LABELS + 1];
    char n[128], le[32];
    if (nlabels > PROM_MAX_LABELS) nlabels = PROM_MAX_LABELS;
    for (int i = 0; i < nlabels; i++)
        with_le[i] = labels[i];
    with_le[nlabels] = (attnd_prom_label){"le", le};
    snprintf(n, sizeof n, "%s_bucket", name);
    unsigned long long cum = 0;
    for (int i = 0; i <= nb; i++) {
        cum += counts[i];
        if (i < nb)
            snprintf(le, sizeof le, "%g", bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        sample_name(b, n, with_le, nlabels + 1);
        attnd_sb_printf(b, " %llu\n", cum);
    }
    snprintf(n, sizeof n, "%s_sum", name);
    sample_name(b, n, labels, nlabels);
    attnd_sb_printf(b, " %.9g\n", sum);
    snprintf(n, sizeof n, "%s_count", name);
    sample_name(b, n, labels, nlabels);
    attnd_sb_printf(b, " %llu\n", cum);
}

void attnd_prom_histogram(attnd_sbuf *b, const char *name, const char *help, const double *bounds,
                          int nb, const uint64_t *counts, double sum) {
    attnd_prom_family(b, name, PROM_HISTOGRAM, help);
    attnd_prom_histogram_series(b, name, NULL, 0, bounds, nb, counts, sum);
}
