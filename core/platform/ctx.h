/* ctx.h - a compute context's threads and the scratch of its forwards
 * (ctx.c). It knows sizes, not what the scratch holds: the forward says
 * how much of each kind it needs.
 */
#ifndef ATTN_PLATFORM_CTX_H
#define ATTN_PLATFORM_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "../attn.h"
#include "pool.h"

/* Scratch sizes of one forward. */
typedef struct {
    size_t proj;  /* floats: the projections */
    size_t tile;  /* floats per thread: an attention task's scratch */
    size_t tasks; /* bytes: the attention tasks */
    size_t seqs;  /* bytes: where each sequence's rows are */
    size_t freqs; /* doubles: rotary frequencies */
    size_t kv16;  /* 16-bit elements: whole sequences' keys and values in bf16 pages */
    size_t a16;   /* 16-bit elements: projection inputs rounded once */
} attn_ws_size;

/* Where the context holds them. */
typedef struct {
    float *proj;    /* (proj) */
    float **tile;   /* (threads) each (tile) */
    void *tasks;    /* (tasks bytes) */
    void *seqs;     /* (seqs bytes) */
    double *freqs;  /* (freqs) */
    uint16_t *kv16; /* (kv16) */
    uint16_t *a16;  /* (a16) */
} attn_ws;

/* Grows ctx's scratch to need and says where it is. Returns 0, or -1 when
 * out of memory (ctx stays usable). */
int attn_ctx_reserve(attn_ctx *ctx, const attn_ws_size *need, attn_ws *ws);
size_t attn_ws_bytes(const attn_ws_size *need, int nthreads); /* need's bytes, allocated */
/* The bytes of scratch ctx holds now, as allocated: what attn_ws_bytes must
 * bound for every forward it has run (tests/test_core.c holds it to that). */
size_t attn_ctx_scratch_bytes(const attn_ctx *ctx);
attn_pool *attn_ctx_pool(attn_ctx *ctx);

/* The loops of the last forward on ctx as it ran them, for tests that hold
 * the forward to attn_plan_describe: their kinds and task counts. */
enum { ATTN_CTX_LOOPS = 8 };
typedef struct {
    int nloops;
    attn_loop_kind kind[ATTN_CTX_LOOPS];
    size_t ntasks[ATTN_CTX_LOOPS];
} attn_ctx_loops;
/* Runs fn over ntasks tasks on ctx's pool as loop `kind` of a forward, and
 * records it (a forward starts its record with attn_ctx_loops_clear). */
void attn_ctx_run_loop(attn_ctx *ctx, attn_loop_kind kind, int ntasks, attn_task_fn fn, void *arg);
void attn_ctx_loops_clear(attn_ctx *ctx);
const attn_ctx_loops *attn_ctx_last_loops(const attn_ctx *ctx);

#endif
