/* steps.c - attn_step_forward, the KV-cache step call that server/steps.c
 * makes today: its steps become cache sequences (attn_seq.kv) of one batch
 * through attn_forward, which computes them. A wrapper and nothing more: it
 * is deleted once the server sends its steps through attn_forward.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"

/* Refuses what attn_forward could not tell from a batch: no step, a step
 * without rows, cache or buffers. */
static int check_steps(const attn_model *m, const attn_step *steps, int n, size_t *N, char *err,
                       size_t errlen) {
    *N = 0;
    if (!m->mem || n < 1 || !steps) {
        snprintf(err, errlen, "steps need a model and at least one step");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const attn_step *st = &steps[i];
        if (st->n < 1 || st->len < 0 || st->len > INT32_MAX - st->n || !st->kv || !st->query ||
            !st->out) {
            snprintf(err, errlen, "step %d: needs n >= 1, len >= 0, a cache, a query and an output",
                     i);
            return -1;
        }
        *N += (size_t)st->n;
    }
    return 0;
}

int attn_step_forward(attn_ctx *ctx, const attn_model *m, attn_step *steps, int n, char *err,
                      size_t errlen) {
    size_t N, E = (size_t)m->hp.embed_dim, t = 0;
    if (check_steps(m, steps, n, &N, err, errlen) < 0) return -1;
    int rc = -1;
    attn_seq *seqs = calloc((size_t)n, sizeof *seqs);
    float *x = malloc(sizeof(float) * 2 * N * E); /* (N,E) queries, then (N,E) outputs */
    if (!seqs || !x) {
        snprintf(err, errlen, "out of memory for %zu step rows", N);
        goto cleanup;
    }
    for (int i = 0; i < n; t += (size_t)steps[i].n, i++) {
        const attn_step *st = &steps[i];
        seqs[i] = (attn_seq){.L = st->n,
                             .S = st->len + st->n,
                             .weights = st->weights,
                             .attn = st->attn,
                             .kv = st->kv,
                             .cached = st->len};
        memcpy(x + t * E, st->query, sizeof(float) * (size_t)st->n * E);
    }
    attn_batch b = {.B = n, .seqs = seqs, .query = x, .out = x + N * E};
    if (attn_forward(ctx, m, &b, err, errlen) < 0) goto cleanup;
    t = 0;
    for (int i = 0; i < n; t += (size_t)steps[i].n, i++)
        memcpy(steps[i].out, x + (N + t) * E, sizeof(float) * (size_t)steps[i].n * E);
    rc = 0;
cleanup:
    free(x);
    free(seqs);
    return rc;
}
