/* proj.c - the projections of one forward, spread over the pool: each
 * projection (a "part": inputs (M,K), packed weights, outputs (M,N)) is cut
 * into tiles of rows x output columns, and every tile of every part is one
 * task, so the Q, K and V projections of a batch share one parallel loop.
 * Tiles run gemm_tile (gemm.c) on the weights packed at load, or for a
 * model that computes in bf16 gemm_bf16_tile_rounded (bf16_gemm.c) on its
 * bf16 weights, each input rounded to bf16 once beforehand (one parallel
 * loop over rows; Q, K and V of self-attention share the query's) rather
 * than by every tile that reads it; a tile's shape never changes a bit of
 * its outputs (gemm.c and bf16.h say why).
 *
 * attn_set_projections(ATTN_PROJ_OPENBLAS) runs the same tiles of an fp32
 * model through OpenBLAS on the unpacked weights instead: benchmarks
 * compare the two.
 * Legend: see attn.h.
 */
#include <string.h>

#include "internal.h"

enum {
    ROUND_ROWS = 64, /* rows per task of the rounding loop */
    ROWS = 192,      /* rows per tile at most */
    MIN_ROWS = 24,   /* rows per tile at least, when splitting for more tasks */
    PANELS = 16,     /* output panels (16 columns each) per tile at most */
    TASKS_PER_THREAD = 3,
};

static int g_proj = ATTN_PROJ_PACKED;

int attn_set_projections(int mode) {
    int was = g_proj;
    g_proj = mode == ATTN_PROJ_OPENBLAS ? ATTN_PROJ_OPENBLAS : ATTN_PROJ_PACKED;
    return was;
}

typedef struct {
    const proj_part *parts;
    int nparts;
    int by_rows;               /* tile order: 1 band of rows by band, 0 column block by block */
    int rows, panels;          /* tile shape */
    int first[PROJ_PARTS + 1]; /* first task of each part; first[nparts] = all tasks */
} proj_job;

static int panels_of(const proj_part *p) {
    return p->pw ? p->pw->panels : p->pw16->panels;
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

/* Rows [r0,r1) x columns [c0,c1) of C = A W^T + bias, with OpenBLAS. */
static void tile_openblas(const proj_part *p, size_t r0, size_t r1, int c0, int c1) {
    for (size_t r = r0; r < r1; r++)
        memcpy(p->C + r * p->ldc + c0, p->pw->bias + c0, sizeof(float) * (size_t)(c1 - c0));
    int K = p->pw->K;
    // A (m,K) @ W[c0:c1]^T (K,n) + C -> C (m,n)
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), c1 - c0, K, 1.0f,
               p->A + r0 * p->lda, (int)p->lda, p->W + (size_t)c0 * K, K, 1.0f,
               p->C + r0 * p->ldc + c0, (int)p->ldc);
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

static void proj_task(void *arg, int t, int tid) {
    (void)tid;
    const proj_job *j = arg;
    int i, j0, j1;
    size_t r0, r1;
    tile_at(j, t, &i, &r0, &r1, &j0, &j1);
    const proj_part *p = &j->parts[i];
    if (p->pw16) {
        gemm_bf16_tile_rounded(p->C + r0 * p->ldc, p->ldc, p->A16 + r0 * p->ld16, p->ld16, p->pw16,
                               0, r1 - r0, j0, j1);
        return;
    }
    if (g_proj == ATTN_PROJ_OPENBLAS) {
        int c0 = j0 * ATTN_PANEL, c1 = j1 * ATTN_PANEL < p->pw->N ? j1 * ATTN_PANEL : p->pw->N;
        tile_openblas(p, r0, r1, c0, c1);
        return;
    }
    gemm_tile(p->C + r0 * p->ldc, p->ldc, p->A + r0 * p->lda, p->lda, p->pw, 0, r1 - r0, j0, j1);
}

proj_part proj_part_of(const attn_model *m, int which, float *C, size_t ldc, const float *A,
                       size_t lda, size_t M) {
    const float *W[4] = {m->q_w, m->k_w, m->v_w, m->out_w};
    return (proj_part){.pw = m->packed ? &m->packed[which] : NULL,
                       .pw16 = m->packed16 ? &m->packed16[which] : NULL,
                       .W = W[which],
                       .A = A,
                       .lda = lda,
                       .C = C,
                       .ldc = ldc,
                       .M = M};
}

size_t proj_rounded_elems(size_t M, int K) {
    return M * (size_t)((K + ATTN_BF16_KSTEP - 1) / ATTN_BF16_KSTEP * ATTN_BF16_KSTEP);
}

/* The inputs to round: the bf16 parts' distinct A, and where each goes. */
typedef struct {
    proj_part *parts[PROJ_PARTS]; /* the first part of each distinct input */
    int n;
    int first[PROJ_PARTS + 1]; /* first task of each; first[n] = all tasks */
} round_job;

/* Rows [r0, r0 + ROUND_ROWS) of input i: rounded, zeros past K. */
static void round_task(void *arg, int t, int tid) {
    (void)tid;
    const round_job *j = arg;
    int i = 0;
    while (t >= j->first[i + 1])
        i++;
    const proj_part *p = j->parts[i];
    size_t r0 = (size_t)(t - j->first[i]) * ROUND_ROWS, r1 = r0 + ROUND_ROWS;
    int K = p->pw16->K;
    for (size_t r = r0; r < r1 && r < p->M; r++) {
        attn_bf16 *dst = p->A16 + r * p->ld16;
        attn_bf16_round(dst, p->A + r * p->lda, (size_t)K);
        memset(dst + K, 0, sizeof(attn_bf16) * (p->ld16 - (size_t)K));
    }
}

/* bf16 parts: each distinct input rounded once into a16 (successive
 * regions), the parts that read it pointed there. */
static void round_inputs(attn_pool *pool, proj_part *parts, int nparts, attn_bf16 *a16) {
    round_job j = {.n = 0};
    for (int i = 0; i < nparts; i++) {
        proj_part *p = &parts[i];
        if (!p->pw16) continue;
        int k = 0;
        while (k < j.n && (j.parts[k]->A != p->A || j.parts[k]->lda != p->lda))
            k++;
        if (k < j.n) { /* read already by an earlier part */
            p->A16 = j.parts[k]->A16;
            p->ld16 = j.parts[k]->ld16;
            continue;
        }
        p->ld16 = proj_rounded_elems(1, p->pw16->K);
        p->A16 = a16;
        a16 += proj_rounded_elems(p->M, p->pw16->K);
        j.parts[j.n++] = p;
    }
    j.first[0] = 0;
    for (int k = 0; k < j.n; k++)
        j.first[k + 1] = j.first[k] + (int)((j.parts[k]->M + ROUND_ROWS - 1) / ROUND_ROWS);
    if (j.n && pool) attn_pool_run(pool, j.first[j.n], round_task, &j);
    for (int t = 0; j.n && !pool && t < j.first[j.n]; t++)
        round_task(&j, t, 0);
}

void proj_run(attn_pool *pool, int nthreads, proj_part *parts, int nparts, int by_rows,
              attn_bf16 *a16) {
    round_inputs(pool, parts, nparts, a16);
    proj_job j = {.parts = parts, .nparts = nparts, .by_rows = by_rows};
    int n = plan_tiles(&j, pool ? nthreads : 1);
    if (!pool) {
        for (int t = 0; t < n; t++)
            proj_task(&j, t, 0);
        return;
    }
    attn_pool_run(pool, n, proj_task, &j);
}

size_t proj_describe(attn_plan_task *tasks, attn_loop_kind loop, int nthreads,
                     const proj_part *parts, int nparts, int by_rows) {
    proj_job j = {.parts = parts, .nparts = nparts, .by_rows = by_rows};
    int n = plan_tiles(&j, nthreads);
    for (int t = 0; tasks && t < n; t++) {
        int i, j0, j1;
        size_t r0, r1;
        tile_at(&j, t, &i, &r0, &r1, &j0, &j1);
        const attn_packed *pw = parts[i].pw;
        int c1 = j1 * ATTN_PANEL < pw->N ? j1 * ATTN_PANEL : pw->N;
        tasks[t] = (attn_plan_task){
            loop, loop == ATTN_LOOP_OUT ? 3 : i, (int)(r1 - r0), c1 - j0 * ATTN_PANEL, pw->K, 1};
    }
    return (size_t)n;
}
