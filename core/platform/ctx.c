/* ctx.c - the compute context: the threads a forward runs on (pool.c) and
 * the scratch it reuses from call to call, grown to the largest forward
 * seen and freed with the context. No math here: the forward plans and
 * says how much scratch of each kind it needs (ctx.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "ctx.h"
#include "mem.h"

struct attn_ctx {
    int nthreads;
    attn_pool *pool;
    float *proj; /* proj_cap floats */
    size_t proj_cap;
    float **tile; /* (nthreads) per-thread scratch, tile_cap floats each, in tile_mem */
    size_t tile_cap;
    float *tile_mem; /* one block for every thread's tile: one huge page, not one each */
    void *tasks;     /* (tasks_cap bytes) */
    size_t tasks_cap;
    void *seqs; /* (seqs_cap bytes) */
    size_t seqs_cap;
    double *freqs; /* (freqs_cap) */
    size_t freqs_cap;
    float *kv16; /* (kv16_cap) floats that hold bf16 pages, two elements a float */
    size_t kv16_cap;
    float *a16; /* (a16_cap) floats that hold rounded projection inputs, the same way */
    size_t a16_cap;
    attn_ctx_loops loops; /* the last forward's, as it ran them */
};

static int grow_floats(float **buf, size_t *cap, size_t need) {
    if (need <= *cap && *buf) return 0;
    float *p = attn_alloc_big(need * sizeof(float));
    if (!p) return -1;
    free(*buf);
    *buf = p;
    *cap = need;
    return 0;
}

/* old when it holds need items of size bytes, else a new block of need
 * items (old freed, contents not kept); NULL when out of memory (old kept). */
static void *grow(void *old, size_t *cap, size_t need, size_t size) {
    if (old && need <= *cap) return old;
    void *p = malloc(size * (need ? need : 1));
    if (!p) return NULL;
    free(old);
    *cap = need;
    return p;
}

attn_ctx *attn_ctx_new(int nthreads) {
    if (nthreads < 1) nthreads = 1;
    if (attn_blas_init(NULL, 0) < 0) return NULL;
    attn_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->nthreads = nthreads;
    ctx->tile = calloc((size_t)nthreads, sizeof *ctx->tile);
    ctx->pool = attn_pool_new(nthreads);
    if (!ctx->tile || !ctx->pool) {
        attn_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

void attn_ctx_free(attn_ctx *ctx) {
    if (!ctx) return;
    attn_pool_free(ctx->pool);
    free(ctx->tile_mem);
    free(ctx->tile);
    free(ctx->proj);
    free(ctx->tasks);
    free(ctx->seqs);
    free(ctx->freqs);
    free(ctx->kv16);
    free(ctx->a16);
    free(ctx);
}

int attn_ctx_threads(const attn_ctx *ctx) {
    return ctx->nthreads;
}

attn_pool *attn_ctx_pool(attn_ctx *ctx) {
    return ctx->pool;
}

void attn_ctx_parallel(attn_ctx *ctx, int ntasks, void (*fn)(void *arg, int task, int thread),
                       void *arg) {
    attn_pool_run(ctx->pool, ntasks, fn, arg);
}

void attn_ctx_wake(attn_ctx *ctx) {
    attn_pool_wake(ctx->pool);
}

void attn_ctx_rest(attn_ctx *ctx) {
    attn_pool_rest(ctx->pool);
}

int attn_ctx_bind(attn_ctx *ctx, const int *cpus, int n, char *err, size_t errlen) {
    int rc = attn_pool_bind(ctx->pool, cpus, n);
    if (rc == 0) return 0;
    snprintf(err, errlen, "cannot pin the compute threads to their CPUs: %s", strerror(rc));
    return -1;
}

/* One thread's tile of need floats, rounded to whole cache lines. */
static size_t tile_floats(size_t need) {
    return (need + 15) / 16 * 16;
}

/* Each thread's tile holds at least need floats; the tiles are cut from one
 * block, each a whole number of cache lines. */
static int grow_tiles(attn_ctx *ctx, size_t need) {
    if (need <= ctx->tile_cap) return 0;
    size_t each = tile_floats(need);
    float *mem = attn_alloc_big(each * sizeof(float) * (size_t)ctx->nthreads);
    if (!mem) return -1;
    free(ctx->tile_mem);
    ctx->tile_mem = mem;
    for (int t = 0; t < ctx->nthreads; t++)
        ctx->tile[t] = mem + each * (size_t)t;
    ctx->tile_cap = need;
    return 0;
}

int attn_ctx_reserve(attn_ctx *ctx, const attn_ws_size *need, attn_ws *ws) {
    if (grow_floats(&ctx->proj, &ctx->proj_cap, need->proj) < 0 ||
        grow_tiles(ctx, need->tile) < 0 ||
        grow_floats(&ctx->kv16, &ctx->kv16_cap, (need->kv16 + 1) / 2) < 0 ||
        grow_floats(&ctx->a16, &ctx->a16_cap, (need->a16 + 1) / 2) < 0)
        return -1;
    void *tasks = grow(ctx->tasks, &ctx->tasks_cap, need->tasks, 1);
    if (!tasks) return -1;
    ctx->tasks = tasks;
    void *seqs = grow(ctx->seqs, &ctx->seqs_cap, need->seqs, 1);
    if (!seqs) return -1;
    ctx->seqs = seqs;
    double *freqs = grow(ctx->freqs, &ctx->freqs_cap, need->freqs, sizeof *freqs);
    if (!freqs) return -1;
    ctx->freqs = freqs;
    *ws = (attn_ws){ctx->proj,           ctx->tile, tasks, seqs, freqs, (uint16_t *)ctx->kv16,
                    (uint16_t *)ctx->a16};
    return 0;
}

size_t attn_ctx_scratch_bytes(const attn_ctx *ctx) {
    size_t n = 0;
    if (ctx->proj) n += attn_alloc_bytes(sizeof(float) * ctx->proj_cap);
    if (ctx->tile_mem)
        n += attn_alloc_bytes(sizeof(float) * (size_t)ctx->nthreads * tile_floats(ctx->tile_cap));
    if (ctx->kv16) n += attn_alloc_bytes(sizeof(float) * ctx->kv16_cap);
    if (ctx->a16) n += attn_alloc_bytes(sizeof(float) * ctx->a16_cap);
    return n + ctx->tasks_cap + ctx->seqs_cap + sizeof(double) * ctx->freqs_cap;
}

/* What attn_ctx_reserve allocates for need, as the allocator rounds it
 * (whole huge pages for the large buffers). */
size_t attn_ws_bytes(const attn_ws_size *need, int nthreads) {
    if (nthreads < 1) nthreads = 1;
    return attn_alloc_bytes(sizeof(float) * need->proj) +
           attn_alloc_bytes(sizeof(float) * (size_t)nthreads * tile_floats(need->tile)) +
           attn_alloc_bytes(sizeof(float) * ((need->kv16 + 1) / 2)) +
           attn_alloc_bytes(sizeof(float) * ((need->a16 + 1) / 2)) + need->tasks + need->seqs +
           sizeof(double) * need->freqs;
}

void attn_ctx_loops_clear(attn_ctx *ctx) {
    ctx->loops.nloops = 0;
}

void attn_ctx_run_loop(attn_ctx *ctx, attn_loop_kind kind, int ntasks, attn_task_fn fn, void *arg) {
    attn_ctx_loops *l = &ctx->loops;
    if (l->nloops < ATTN_CTX_LOOPS) {
        l->kind[l->nloops] = kind;
        l->ntasks[l->nloops++] = (size_t)ntasks;
    }
    attn_pool_run(ctx->pool, ntasks, fn, arg);
}

const attn_ctx_loops *attn_ctx_last_loops(const attn_ctx *ctx) {
    return &ctx->loops;
}
