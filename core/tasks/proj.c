/* proj.c - the projections of one forward, spread over the pool: each
 * projection (a "part": inputs (M,K), packed weights, outputs (M,N)) is cut
 * into tiles of rows x output columns, and every tile of every part is one
 * task, so the Q, K and V projections of a batch share one parallel loop.
 * Tiles run the model's projection row (ops.h); where the row prepares its
 * inputs (bf16: rounds them), each distinct input is prepared once
 * beforehand, in a loop over rows of its own (Q, K and V of
 * self-attention share the query's), rather than by every tile that reads
 * it. A tile's shape never changes a bit of its outputs.
 * Legend: see attn.h.
 */
#include <string.h>

#include "../kernels/gemm.h"
#include "proj.h"

enum {
    ROUND_ROWS = 64, /* rows per task of the rounding loop */
    ROWS = 192,      /* rows per tile at most */
    MIN_ROWS = 24,   /* rows per tile at least, when splitting for more tasks */
    PANELS = 16,     /* output panels (16 columns each) per tile at most */
    TASKS_PER_THREAD = 3,
};

/* Panels of ATTN_PANEL output columns: every row packs its weights so. */
static int panels_of(const proj_part *p) {
    return (p->N + ATTN_PANEL - 1) / ATTN_PANEL;
}

static int tiles_of(const proj_part *p, int rows, int panels) {
    int rb = (int)((p->M + (size_t)rows - 1) / (size_t)rows);
    int cb = (panels_of(p) + panels - 1) / panels;
    return rb * cb;
}

static int count_tasks(proj_job *j) {
    j->first[0] = 0;
    for (int i = 0; i < j->nparts; i++)
        j->first[i + 1] = j->first[i] + tiles_of(&j->parts[i], j->rows, j->panels);
    return j->first[j->nparts];
}

/* Tiles small enough that every thread gets a few, large enough to keep
 * the kernel's blocking (a multiple of its 12 rows); then the rows spread
 * evenly over as many bands (a multiple of 4 rows each), so that no band
 * is a short remainder: each thread's share of the tiles (pool.c) then
 * holds about as many rows as the others'. 1024 rows went in 5 bands of
 * 192 and one of 64, so on 2 threads an output projection by bands of rows
 * gave one thread 576 rows and the other 448; in bands of 172 and 164 it
 * gives 516 and 508. */
static int plan_tiles(proj_job *j, int nthreads) {
    j->rows = ROWS;
    j->panels = PANELS;
    int want = nthreads > 1 ? TASKS_PER_THREAD * nthreads : 1;
    int n = count_tasks(j);
    while (n < want && (j->panels > 2 || j->rows > MIN_ROWS)) {
        if (j->panels > 2)
            j->panels /= 2;
        else
            j->rows /= 2;
        n = count_tasks(j);
    }
    size_t M = 0;
    for (int i = 0; i < j->nparts; i++)
        if (j->parts[i].M > M) M = j->parts[i].M;
    size_t bands = (M + (size_t)j->rows - 1) / (size_t)j->rows;
    if (bands > 1) {
        size_t even = ((M + bands - 1) / bands + 3) / 4 * 4;
        if (even < (size_t)j->rows) j->rows = (int)even;
        n = count_tasks(j);
    }
    return n;
}

/* Task t of job j: part *i, rows [r0,r1) x panels [j0,j1) (past N clipped).
 * Within a part, tiles go column block by column block (neighbours share
 * weights), or with by_rows band of rows by band, so that a thread's share
 * (pool.c) is a band of rows. */
static void tile_at(const proj_job *j, int t, int *i, size_t *r0, size_t *r1, int *j0, int *j1) {
    for (*i = 0; t >= j->first[*i + 1];)
        (*i)++;
    const proj_part *p = &j->parts[*i];
    int local = t - j->first[*i];
    int rb = (int)((p->M + (size_t)j->rows - 1) / (size_t)j->rows);
    int cbs = (panels_of(p) + j->panels - 1) / j->panels;
    int cb = j->by_rows ? local % cbs : local / rb, r = j->by_rows ? local / cbs : local % rb;
    *r0 = (size_t)r * j->rows;
    *r1 = *r0 + (size_t)j->rows < p->M ? *r0 + j->rows : p->M;
    *j0 = cb * j->panels;
    *j1 = *j0 + j->panels;
}

void proj_tile_task(void *job, int t, int tid) {
    (void)tid;
    const proj_job *j = job;
    int i, j0, j1;
    size_t r0, r1;
    tile_at(j, t, &i, &r0, &r1, &j0, &j1);
    const proj_part *p = &j->parts[i];
    p->ops->tile(p, r0, r1, j0, j1);
}

int proj_tile_tasks(const proj_job *j) {
    return j->first[j->nparts];
}

void proj_tile_describe(const proj_job *j, int t, attn_loop_kind loop, attn_plan_task *out) {
    int i, j0, j1;
    size_t r0, r1;
    tile_at(j, t, &i, &r0, &r1, &j0, &j1);
    const proj_part *p = &j->parts[i];
    int c1 = j1 * ATTN_PANEL < p->N ? j1 * ATTN_PANEL : p->N;
    *out = (attn_plan_task){
        loop, loop == ATTN_LOOP_OUT ? 3 : i, (int)(r1 - r0), c1 - j0 * ATTN_PANEL, p->K, 1};
}

proj_part proj_part_of(const attn_proj_ops *ops, const attn_model *m, int which, float *C,
                       size_t ldc, const float *A, size_t lda, size_t M) {
    attn_proj_shape s = attn_proj_shape_of(m, which);
    return (proj_part){.ops = ops,
                       .w = ops->weights(m, which),
                       .N = s.N,
                       .K = s.K,
                       .W = s.W,
                       .A = A,
                       .lda = lda,
                       .C = C,
                       .ldc = ldc,
                       .M = M};
}

/* The part before p (in parts) that reads the same input, or NULL. */
static const proj_part *same_input(const proj_part *parts, const proj_part *p) {
    for (const proj_part *q = parts; q < p; q++)
        if (q->A == p->A && q->lda == p->lda && q->M == p->M) return q;
    return NULL;
}

size_t proj_prepared_elems(const proj_part *parts, int nparts) {
    size_t n = 0;
    for (int i = 0; i < nparts; i++)
        if (!same_input(parts, &parts[i]))
            n += parts[i].ops->prepared_elems(parts[i].M, parts[i].K);
    return n;
}

/* Each distinct input of a preparing row laid out in a16 (successive
 * regions), the parts that read it pointed there. */
static void lay_inputs(proj_job *j, uint16_t *a16) {
    j->ninputs = 0;
    j->ifirst[0] = 0;
    for (int i = 0; i < j->nparts; i++) {
        proj_part *p = &j->parts[i];
        if (!p->ops->prepare) continue;
        const proj_part *q = same_input(j->parts, p);
        if (q) { /* prepared already for an earlier part */
            p->A16 = q->A16;
            p->ld16 = q->ld16;
            continue;
        }
        p->ld16 = p->ops->prepared_elems(2, p->K) - p->ops->prepared_elems(1, p->K);
        p->A16 = a16;
        if (a16) a16 += p->ops->prepared_elems(p->M, p->K);
        j->inputs[j->ninputs++] = p;
        j->ifirst[j->ninputs] =
            j->ifirst[j->ninputs - 1] + (int)((p->M + ROUND_ROWS - 1) / ROUND_ROWS);
    }
}

void proj_job_init(proj_job *j, proj_part *parts, int nparts, int by_rows, int nthreads,
                   uint16_t *a16) {
    *j = (proj_job){.parts = parts, .nparts = nparts, .by_rows = by_rows};
    lay_inputs(j, a16);
    plan_tiles(j, nthreads);
}

int proj_prepare_tasks(const proj_job *j) {
    return j->ifirst[j->ninputs];
}

/* Preparing task t: input *i, rows [*r0, *r0 + ROUND_ROWS). */
static const proj_part *prepare_at(const proj_job *j, int t, size_t *r0) {
    int i = 0;
    while (t >= j->ifirst[i + 1])
        i++;
    *r0 = (size_t)(t - j->ifirst[i]) * ROUND_ROWS;
    return j->inputs[i];
}

void proj_prepare_task(void *job, int t, int tid) {
    (void)tid;
    size_t r0;
    const proj_part *p = prepare_at(job, t, &r0);
    p->ops->prepare(p, r0, r0 + ROUND_ROWS);
}

void proj_prepare_describe(const proj_job *j, int t, attn_plan_task *out) {
    size_t r0;
    const proj_part *p = prepare_at(j, t, &r0);
    int rows = (int)(p->M - r0 < ROUND_ROWS ? p->M - r0 : ROUND_ROWS);
    *out = (attn_plan_task){ATTN_LOOP_ROUND, 0, rows, 0, p->K, 1};
}
