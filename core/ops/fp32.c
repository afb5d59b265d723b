/* fp32.c - the fp32 rows of the precision tables (ops.h): SPEC section 1's
 * numbers.
 *
 * Projections: weights packed once in fp32 (kernels/gemm.c), inputs read
 * as they are; attn_set_projections(ATTN_PROJ_OPENBLAS) runs the same tiles
 * through OpenBLAS on the unpacked weights instead, which benchmarks
 * compare.
 *
 * Attention: a no-matrix task runs the AVX-512 block (kernels/block.c)
 * where the CPU has AVX-512F and D is a multiple of 16 up to 128, else
 * OpenBLAS rows with an online softmax over key tiles (kernels/rows_blas.c).
 * Weights are whole rows of scores on OpenBLAS, and a full task's outputs
 * are those weights times V. An OpenBLAS call takes M query rows at one
 * stride: for nn.MultiheadAttention a block of up to QB rows of one head,
 * as attnd has always computed it; for decoder models (rows_alone) the R
 * heads of one row, so that a row's bits never depend on the block it is
 * in (OpenBLAS's do, on the number of rows of a call): a session step's
 * rows are then the bits of the whole sequence's. So tasks on OpenBLAS are
 * never cut for threads; the fused block's rows do not depend on their
 * block, and its tasks may be (tasks/attend.c).
 * Legend: see attn.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/block.h"
#include "../kernels/gemm.h"
#include "../kernels/rows_blas.h"
#include "../platform/blas.h"
#include "ops.h"

#ifndef ATTN_QB /* -DATTN_QB=... for tuning builds */
#define ATTN_QB 128
#endif
enum {
    QB = ATTN_QB,          /* query rows per OpenBLAS task (online softmax path) */
    FULL_FLOATS = 1 << 18, /* score floats per task on the weights path */
    FUSED_BLOCK = 64,      /* lanes (rows x heads) the AVX-512 block computes together */
    FUSED_VECTOR = 16,     /* lanes of one vector: the fewest a cut task takes */
};

/* ---- projections ------------------------------------------------------------ */

static int g_proj = ATTN_PROJ_PACKED;

int attn_set_projections(int mode) {
    int was = g_proj;
    g_proj = mode == ATTN_PROJ_OPENBLAS ? ATTN_PROJ_OPENBLAS : ATTN_PROJ_PACKED;
    return was;
}

static int proj_runs(const attn_hparams *hp) {
    (void)hp;
    return 1;
}

static void proj_unpack(attn_model *m) {
    for (int i = 0; m->packed && i < 4; i++)
        attn_packed_free(&m->packed[i]);
    free(m->packed);
    m->packed = NULL;
}

static int proj_pack(attn_model *m) {
    m->packed = calloc(4, sizeof *m->packed);
    for (int i = 0; m->packed && i < 4; i++) {
        attn_proj_shape p = attn_proj_shape_of(m, i);
        if (attn_packed_init(&m->packed[i], p.W, p.bias, p.N, p.K) < 0) {
            proj_unpack(m);
            return -1;
        }
    }
    return m->packed ? 0 : -1;
}

static const void *proj_weights(const attn_model *m, int which) {
    return m->packed ? &m->packed[which] : NULL;
}

static size_t proj_bytes(const void *w) {
    const attn_packed *pw = w;
    return (size_t)pw->panels * pw->K * ATTN_PANEL * sizeof(float);
}

static const void *proj_data(const void *w, size_t *n) {
    (void)w;
    *n = 0; /* the packed copy repeats the model's own fp32 weights */
    return NULL;
}

static size_t proj_prepared_elems(size_t M, int K) {
    (void)M;
    (void)K;
    return 0;
}

/* Rows [r0,r1) x columns [c0,c1) of C = A W^T + bias, with OpenBLAS. */
static void tile_openblas(const proj_part *p, size_t r0, size_t r1, int c0, int c1) {
    const attn_packed *pw = p->w;
    for (size_t r = r0; r < r1; r++)
        memcpy(p->C + r * p->ldc + c0, pw->bias + c0, sizeof(float) * (size_t)(c1 - c0));
    int K = pw->K;
    // A (m,K) @ W[c0:c1]^T (K,n) + C -> C (m,n)
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), c1 - c0, K, 1.0f,
               p->A + r0 * p->lda, (int)p->lda, p->W + (size_t)c0 * K, K, 1.0f,
               p->C + r0 * p->ldc + c0, (int)p->ldc);
}

static void proj_tile(const proj_part *p, size_t r0, size_t r1, int j0, int j1) {
    const attn_packed *pw = p->w;
    if (g_proj == ATTN_PROJ_OPENBLAS && p->W) {
        int c1 = j1 * ATTN_PANEL < pw->N ? j1 * ATTN_PANEL : pw->N;
        tile_openblas(p, r0, r1, j0 * ATTN_PANEL, c1);
        return;
    }
    gemm_tile(p->C + r0 * p->ldc, p->ldc, p->A + r0 * p->lda, p->lda, pw, 0, r1 - r0, j0, j1);
}

const attn_proj_ops attn_proj_fp32 = {
    .name = "fp32",
    .precision = ATTN_FP32,
    .runs = proj_runs,
    .pack = proj_pack,
    .unpack = proj_unpack,
    .weights = proj_weights,
    .bytes = proj_bytes,
    .data = proj_data,
    .prepared_elems = proj_prepared_elems,
    .prepare = NULL,
    .tile = proj_tile,
};

/* ---- attention ---------------------------------------------------------------- */

static int attend_runs(const attn_hparams *hp) {
    (void)hp;
    return 1;
}

static void attend_prepare(attn_attend *a) {
    a->kernel = attn_fused_supported(a->D) && a->H / a->G <= ATTN_FUSED_ROWS;
}

/* Rows [i0, i1) of sequence sa that read key/value head g: a block of one
 * head's rows (i1 - i0 rows, R == 1), or the R heads of row i0 (rows_alone,
 * i1 == i0 + 1). */
static attn_qrows rows_of(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1) {
    int R = a->H / a->G, D = a->D, alone = a->rows_alone;
    attn_qrows r = {.q = a->q + (sa->q0 + (size_t)i0) * a->ldq + (size_t)g * R * D,
                    .ldq = alone ? (size_t)D : a->ldq,
                    .M = alone ? R : i1 - i0,
                    .pos = i0 + sa->shift,
                    .dpos = !alone,
                    .k = sa->k + (size_t)g * D,
                    .v = sa->v + (size_t)g * D,
                    .ldkv = sa->ldkv,
                    .jend = sa->view.S};
    if (sa->view.causal && r.jend > i1 + sa->shift)
        r.jend = i1 + sa->shift; /* later keys are hidden from every row */
    return r;
}

static int block_lanes(const attn_attend *a) {
    return a->kernel ? ATTN_FUSED_ROWS : QB * (a->H / a->G);
}

/* The AVX-512 block's rows do not depend on their block: halved down to one
 * block of FUSED_BLOCK lanes, then one vector (it runs 17 to 63 lanes at
 * the cost of 64, and 16 or fewer alone); 0 past that. OpenBLAS rows are
 * never cut. */
static int fewer_lanes(const attn_attend *a, int lanes) {
    if (!a->kernel) return 0;
    return lanes > FUSED_BLOCK ? lanes / 2 : lanes > FUSED_VECTOR ? FUSED_VECTOR : 0;
}

/* The AVX-512 block's rows, and a decoder model's rows alone on OpenBLAS;
 * not MHA's OpenBLAS tiles, whose bits depend on a call's rows. */
static int rows_free(const attn_attend *a) {
    return a->kernel || a->rows_alone;
}

/* Query rows per weights task: a block of one head's rows for S keys
 * (R == 1), as many rows' R heads for decoder models; at least 8. */
static int weight_rows(const attn_attend *a, int S) {
    int r = FULL_FLOATS / ((a->H / a->G) * S);
    if (r > QB) r = QB;
    if (r < 8) r = 8;
    return r;
}

/* Scratch rows of an OpenBLAS tile: QB, or R when a row's heads are more. */
static int tile_rows(const attn_attend *a) {
    int R = a->H / a->G;
    return a->rows_alone && R > QB ? R : QB;
}

static size_t block_floats(const attn_attend *a) {
    return a->kernel ? attn_fused_floats(a->D) : attn_rows_online_floats(tile_rows(a), a->D);
}

static size_t weight_floats(const attn_attend *a, int rows, int S) {
    return (size_t)rows * (size_t)(a->H / a->G) * (size_t)S;
}

/* The weights alone: the outputs take no scratch of their own. */
static size_t full_floats(const attn_attend *a, int rows, int S) {
    return (weight_floats(a, rows, S) + 15) / 16 * 16;
}

static void block(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                  float *scratch) {
    if (a->kernel) {
        float *q = a->q + (sa->q0 + (size_t)i0) * a->ldq + (size_t)g * (a->H / a->G) * a->D;
        attn_fused_block(q, a->ldq, a->H / a->G, sa->k + (size_t)g * a->D, sa->v + (size_t)g * a->D,
                         sa->ldkv, &sa->view, i0 + sa->shift, i1 - i0, a->D, a->scale, scratch);
        return;
    }
    if (!a->rows_alone) {
        attn_qrows r = rows_of(a, sa, g, i0, i1);
        attn_rows_online(&r, &sa->view, a->D, a->scale, tile_rows(a), scratch);
        return;
    }
    for (int i = i0; i < i1; i++) {
        attn_qrows r = rows_of(a, sa, g, i, i + 1);
        attn_rows_online(&r, &sa->view, a->D, a->scale, tile_rows(a), scratch);
    }
}

/* MHA: the scores of the whole block [i0, i1) on one call (the call the
 * full path makes, so the bits are its bits), rows [r0, r1) weighed.
 * Decoder models: each row's R heads on a call of their own. */
static float *weights(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1, int r0,
                      int r1, float *scratch) {
    int S = sa->view.S, R = a->H / a->G;
    if (!a->rows_alone) {
        attn_qrows r = rows_of(a, sa, g, i0, i1);
        attn_rows_scores(&r, a->D, a->scale, scratch, S);
        attn_rows_weigh(&r, &sa->view, scratch, S, r0 - i0, r1 - i0);
        return scratch + (size_t)(r0 - i0) * S;
    }
    for (int i = r0; i < r1; i++) {
        attn_qrows r = rows_of(a, sa, g, i, i + 1);
        float *P = scratch + (size_t)(i - r0) * R * S; /* (R,S) */
        attn_rows_scores(&r, a->D, a->scale, P, S);
        attn_rows_weigh(&r, &sa->view, P, S, 0, R);
    }
    return scratch;
}

static void outputs(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                    const float *w, float *scratch) {
    (void)scratch;
    int S = sa->view.S, R = a->H / a->G;
    if (!a->rows_alone) {
        attn_qrows r = rows_of(a, sa, g, i0, i1);
        attn_rows_values(&r, a->D, w, S);
        return;
    }
    for (int i = i0; i < i1; i++) {
        attn_qrows r = rows_of(a, sa, g, i, i + 1);
        attn_rows_values(&r, a->D, w + (size_t)(i - i0) * R * S, S);
    }
}

const attn_attend_ops attn_attend_fp32 = {
    .name = "fp32",
    .pages = 0,
    .runs = attend_runs,
    .prepare = attend_prepare,
    .block_lanes = block_lanes,
    .fewer_lanes = fewer_lanes,
    .rows_free = rows_free,
    .weight_rows = weight_rows,
    .block_floats = block_floats,
    .full_floats = full_floats,
    .weight_floats = weight_floats,
    .block = block,
    .weights = weights,
    .outputs = outputs,
};
