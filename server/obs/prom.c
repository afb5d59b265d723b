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

void attnd_prom_histogram(attnd_sbuf *b, const char *name, const char *help, const double *bounds,
                          int nb, const uint64_t *counts, double sum) {
    attnd_prom_family(b, name, PROM_HISTOGRAM, help);
    unsigned long long cum = 0;
    for (int i = 0; i <= nb; i++) {
        char le[32];
        cum += counts[i];
        if (i < nb)
            snprintf(le, sizeof le, "%g", bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        attnd_sb_printf(b, "%s_bucket{le=\"%s\"} %llu\n", name, le, cum);
    }
    attnd_sb_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, sum, name, cum);
}
