/* plan.c - a forward's plan as data (attn_plan_describe): the loops
 * fwd_loops builds for the forward, each task with its work, from the
 * same planning and binding the forward does (fwd.h), so the two cannot
 * drift. The scratch is allocated and never touched; b's tensors are not
 * read. bench/bench_scale.c simulates the loops at thread counts a machine
 * does not have. Legend: see attn.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kv_pages.h"
#include "../ops/seq.h"
#include "check.h"
#include "fwd.h"

/* Keys that rows [i0, i1) of sequence s read: all S, or under causal up to
 * the block's last row (a step is causal over its cache, its row 0 at
 * position cached, as the forward places it). */
static int task_keys(const attn_seq *s, int i1) {
    int shift = attn_seq_step(s) ? s->cached : 0;
    return (s->causal || attn_seq_step(s)) && i1 + shift < s->S ? i1 + shift : s->S;
}

/* Task t of loop l of forward f, with its work. */
static attn_plan_task describe(const fwd *f, const fwd_loop *l, int t) {
    attn_plan_task k = {.loop = l->kind, .heads = 1};
    const attn_attend *a = l->arg;
    const attn_task *tk;
    size_t r0 = (size_t)t * FWD_PREP_ROWS;
    switch (l->kind) {
    case ATTN_LOOP_ROUND:
    case ATTN_LOOP_OUT_ROUND:
        proj_prepare_describe(l->arg, t, &k);
        k.loop = l->kind;
        break;
    case ATTN_LOOP_PROJ:
    case ATTN_LOOP_OUT:
        proj_tile_describe(l->arg, t, l->kind, &k);
        break;
    case ATTN_LOOP_PREP:
        k.rows = (int)(f->T - r0 < FWD_PREP_ROWS ? f->T - r0 : FWD_PREP_ROWS);
        break;
    case ATTN_LOOP_PACK:
        k.rows = ATTN_KV_PAGE;
        k.depth = 2 * f->KW;
        break;
    case ATTN_LOOP_SELECT:
    case ATTN_LOOP_ATTEND:
        tk = &a->tasks[t];
        k.part = tk->seq;
        k.rows = tk->i1 - tk->i0;
        k.cols = task_keys(&f->b->seqs[tk->seq], tk->i1);
        k.depth = a->D;
        k.heads = tk->head >= 0 ? a->H / a->G : a->H;
        break;
    default:
        break;
    }
    return k;
}

/* Scratch for the plan: allocated, not touched (the tiles are never run). */
static void ws_free(attn_ws *ws) {
    free(ws->proj);
    free(ws->tasks);
    free(ws->seqs);
    free(ws->freqs);
    free(ws->kv16);
    free(ws->a16);
}

static int ws_alloc(attn_ws *ws, const attn_ws_size *need) {
    *ws = (attn_ws){.proj = malloc(sizeof(float) * (need->proj + 1)),
                    .tasks = malloc(need->tasks + 1),
                    .seqs = malloc(need->seqs + 1),
                    .freqs = malloc(sizeof(double) * (need->freqs + 1)),
                    .kv16 = malloc(sizeof(uint16_t) * (need->kv16 + 1)),
                    .a16 = malloc(sizeof(uint16_t) * (need->a16 + 1))};
    if (ws->proj && ws->tasks && ws->seqs && ws->freqs && ws->kv16 && ws->a16) return 0;
    ws_free(ws);
    return -1;
}

/* Fills out's loops and tasks from f's loops. Returns 0, or -1 when out of memory. */
static int fill(attn_plan *out, const fwd *f, const fwd_loop *loops, int n) {
    size_t total = 0;
    for (int l = 0; l < n; l++)
        total += (size_t)loops[l].ntasks;
    out->tasks = malloc(sizeof *out->tasks * (total ? total : 1));
    if (!out->tasks) return -1;
    for (int l = 0; l < n; l++) {
        out->loops[l].kind = loops[l].kind;
        out->loops[l].first = out->ntasks;
        out->loops[l].ntasks = (size_t)loops[l].ntasks;
        for (int t = 0; t < loops[l].ntasks; t++)
            out->tasks[out->ntasks++] = describe(f, &loops[l], t);
    }
    out->nloops = n;
    return 0;
}

int attn_plan_describe(attn_plan *out, const attn_model *m, const attn_batch *b, int nthreads,
                       char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (attn_check_packed(m, err, errlen) < 0) return -1;
    size_t T, U;
    fwd_tokens(b, &T, &U);
    fwd f;
    attn_ws ws;
    fwd_plan(&f, m, b, T, U, nthreads < 1 ? 1 : nthreads);
    if (ws_alloc(&ws, &f.need) < 0) {
        snprintf(err, errlen, "out of memory for the plan of %zu query tokens", T);
        return -1;
    }
    float *tile = NULL;
    ws.tile = &tile;
    fwd_bind(&f, &ws);
    fwd_loop loops[FWD_LOOPS];
    int n = fwd_loops(&f, loops), rc = fill(out, &f, loops, n);
    ws_free(&ws);
    if (rc < 0) {
        attn_plan_free(out);
        snprintf(err, errlen, "out of memory for the plan of %zu query tokens", T);
    }
    return rc;
}

void attn_plan_free(attn_plan *plan) {
    if (!plan) return;
    free(plan->tasks);
    memset(plan, 0, sizeof *plan);
}
