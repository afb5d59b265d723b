/* bf16.c - the bf16 rows of the precision tables (ops.h): SPEC section 8.
 *
 * Projections: weights rounded and packed once in bf16
 * (kernels/gemm_bf16.c), the fp32 matrices then freed (the biases stay
 * fp32); each input row rounded to bf16 once (prepare) and read by every
 * tile of it.
 *
 * Attention (a model whose head width the bf16 block takes): QK^T and PV on
 * bf16 operands, keys and values read from bf16 pages (kv_pages.h: a whole
 * sequence's packed by the forward, a step's from its cache), softmax in
 * fp32. A no-matrix task runs the block (kernels/block_bf16.c) over the R
 * query heads that read one key/value head. Weights follow the block's
 * formula in plain loops: with q~ = bf16(q * scale * log2(e)) and the keys
 * k~ of the pages,
 *   x_j = q~ . k~_j (fp32 sums of exact products, d in order) + the
 *         additive mask in log2 units,
 *   c   = ceil(max_j x_j),  p_j = 2^(x_j - c) (exp.h's 2^t),
 *   w_j = p_j / sum_j p_j   (fp32), 0 for a hidden key
 * (attn_bf16_weights_row); so they differ from the p_j / l of the block's
 * output by fp32 rounding alone (its scores and sums in other orders). A
 * row's numbers depend on its own query and keys only, never on the rows
 * beside it, its block or its thread. A full task's outputs come from the
 * block too, so a row's output is the same bits whether or not its weights
 * are asked for.
 * Legend: see attn.h.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/block_bf16.h"
#include "../kernels/gemm_bf16.h"
#include "../platform/cpu.h"
#include "../prim/mask.h"
#include "../prim/softmax.h"
#include "ops.h"

enum {
    PAGE = ATTN_KV_PAGE,
    WEIGHT_FLOATS = 1 << 18, /* scores a task of the weights path holds at most */
};

/* ---- projections ------------------------------------------------------------ */

static int proj_runs(const attn_hparams *hp) {
    return hp->precision != ATTN_FP32 && attn_bf16_path() != ATTN_BF16_NONE; /* int8 too */
}

static void proj_unpack(attn_model *m) {
    for (int i = 0; m->packed16 && i < 4; i++)
        attn_packed_bf16_free(&m->packed16[i]);
    free(m->packed16);
    m->packed16 = NULL;
}

/* The model keeps its biases alone in fp32: mem shrinks to q_b | k_b |
 * v_b | out_b, and its weight matrices live in a row's packed copy only
 * (ops.h; the int8 row's too). */
int attn_keep_biases(attn_model *m) {
    size_t qd = (size_t)m->hp.num_heads * m->hp.head_dim;
    size_t kvd = (size_t)m->hp.num_kv_heads * m->hp.head_dim, E = (size_t)m->hp.embed_dim;
    float *mem = malloc(sizeof(float) * (qd + 2 * kvd + E));
    if (!mem) return -1;
    memcpy(mem, m->q_b, sizeof(float) * (qd + 2 * kvd)); /* q_b, k_b, v_b: contiguous */
    memcpy(mem + qd + 2 * kvd, m->out_b, sizeof(float) * E);
    free(m->mem);
    m->mem = mem;
    m->n_floats = qd + 2 * kvd + E;
    m->q_w = m->k_w = m->v_w = m->out_w = NULL;
    m->q_b = mem;
    m->k_b = m->q_b + qd;
    m->v_b = m->k_b + kvd;
    m->out_b = m->v_b + kvd;
    return 0;
}

static int keep_biases(attn_model *m) {
    if (attn_keep_biases(m) < 0) return -1;
    const float *bias[4] = {m->q_b, m->k_b, m->v_b, m->out_b};
    for (int i = 0; i < 4; i++)
        m->packed16[i].bias = bias[i];
    return 0;
}

static int proj_pack(attn_model *m) {
    m->packed16 = calloc(4, sizeof *m->packed16);
    int bad = !m->packed16;
    for (int i = 0; !bad && i < 4; i++) {
        attn_proj_shape p = attn_proj_shape_of(m, i);
        bad = attn_packed_bf16_init(&m->packed16[i], p.W, p.bias, p.N, p.K) < 0;
    }
    if (bad || keep_biases(m) < 0) {
        proj_unpack(m);
        return -1;
    }
    return 0;
}

static const void *proj_weights(const attn_model *m, int which) {
    return m->packed16 ? &m->packed16[which] : NULL;
}

static size_t proj_bytes(const void *w) {
    const attn_packed_bf16 *pw = w;
    return (size_t)pw->panels * ATTN_PANEL *
           (2 * (size_t)pw->kp * sizeof(attn_bf16) + sizeof(float));
}

static const void *proj_data(const void *w, size_t *n) {
    const attn_packed_bf16 *pw = w;
    *n = (size_t)pw->panels * pw->kp * 2 * ATTN_PANEL * sizeof(attn_bf16);
    return pw->p;
}

static size_t proj_prepared_elems(size_t M, int K) {
    return M * (size_t)((K + ATTN_BF16_KSTEP - 1) / ATTN_BF16_KSTEP * ATTN_BF16_KSTEP);
}

static void proj_prepare(const proj_part *p, size_t r0, size_t r1) {
    int K = p->K;
    for (size_t r = r0; r < r1 && r < p->M; r++) {
        attn_bf16 *dst = p->A16 + r * p->ld16;
        attn_bf16_round(dst, p->A + r * p->lda, (size_t)K);
        memset(dst + K, 0, sizeof(attn_bf16) * (p->ld16 - (size_t)K));
    }
}

static void proj_tile(const proj_part *p, size_t r0, size_t r1, int j0, int j1) {
    gemm_bf16_tile_rounded(p->C + r0 * p->ldc, p->ldc, p->A16 + r0 * p->ld16, p->ld16, p->w, 0,
                           r1 - r0, j0, j1);
}

const attn_proj_ops attn_proj_bf16 = {
    .name = "bf16",
    .precision = ATTN_BF16,
    .runs = proj_runs,
    .pack = proj_pack,
    .unpack = proj_unpack,
    .weights = proj_weights,
    .bytes = proj_bytes,
    .data = proj_data,
    .prepared_elems = proj_prepared_elems,
    .prepare = proj_prepare,
    .tile = proj_tile,
};

/* ---- attention ---------------------------------------------------------------- */

/* The block takes the head width on its fast paths, and a group of heads
 * fits one pass. */
static int attend_runs(const attn_hparams *hp) {
    int D = hp->head_dim;
    return attn_bf16_path() != ATTN_BF16_NONE && D % 32 == 0 && D <= ATTN_BF16_DMAX &&
           hp->num_heads / hp->num_kv_heads <= ATTN_BF16_ROWS;
}

static void attend_prepare(attn_attend *a) {
    a->kernel = 0;
}

/* Tasks are never cut: a block takes its rows in one pass. */
static int fewer_lanes(const attn_attend *a, int lanes) {
    (void)a;
    (void)lanes;
    return 0;
}

/* A row's numbers depend on its own query and keys only (above). */
static int rows_free(const attn_attend *a) {
    (void)a;
    return 1;
}

static int weight_rows(const attn_attend *a, int S) {
    size_t R = (size_t)(a->H / a->G), rows = ATTN_BF16_ROWS / R;
    if (WEIGHT_FLOATS / (R * (size_t)S) < rows) rows = WEIGHT_FLOATS / (R * (size_t)S);
    return rows < 1 ? 1 : (int)rows;
}

static int block_lanes(const attn_attend *a) {
    (void)a;
    return ATTN_BF16_ROWS;
}

/* Floats of the block's scratch, a multiple of 16 (64 bytes). */
static size_t block_floats(const attn_attend *a) {
    return (attn_bf16_scratch_bytes(a->D) + 63) / 64 * 16;
}

static size_t weight_floats(const attn_attend *a, int rows, int S) {
    size_t n = (size_t)rows * (size_t)(a->H / a->G);
    return n * a->D + (size_t)PAGE * a->D + n * S;
}

/* The weights, then the block's scratch for the outputs. */
static size_t full_floats(const attn_attend *a, int rows, int S) {
    return (weight_floats(a, rows, S) + 15) / 16 * 16 + block_floats(a);
}

/* Positions [i0, i1) of sequence sa, the R heads that read key/value head
 * g: outputs over their queries (in place) by attn_bf16_block. */
static void block(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                  float *scratch) {
    int R = a->H / a->G, D = a->D;
    float *q = a->q + (sa->q0 + (size_t)i0) * a->ldq + (size_t)g * R * D; /* (i1-i0, R*D) */
    attn_kv_bf16 kv = attn_kv_bf16_head(sa->kv16, a->G, D, g, sa->view.S);
    attn_bf16_block(q, a->ldq, q, a->ldq, &kv, &sa->view, i0 + sa->shift, i1 - i0, R, D, a->scale,
                    scratch);
}

/* kt (D, PAGE) = the keys of page p of one head, widened (exact). */
static void widen_keys(float *kt, const attn_kv_bf16 *kv, int D, size_t p) {
    const attn_bf16 *h = kv->head + p * kv->page;
    for (int t = 0; t < PAGE; t++)
        for (int d = 0; d < D; d++)
            kt[(size_t)d * PAGE + t] = attn_bf16_to_f32(h[attn_kv_key_at(D, t, d)]);
}

/* Scores of n rows against one page of keys: row r's x[r * ldx + t] =
 * q[r] (D) . kt's key t for t < nk, fp32 sums with d in order (each product
 * of two bf16 is exact, so a fused multiply-add rounds as an add does: the
 * bits are those of the plain loop). AVX-512F: a model attends in bf16 only
 * on a CPU with AVX512-BF16, which has it. Four rows at a time. */
__attribute__((target("avx512f"))) static void scores_page(float *x, size_t ldx, const float *q,
                                                           int n, const float *kt, int D, int nk) {
    __mmask16 m0 = nk >= 16 ? 0xFFFF : (__mmask16)((1u << nk) - 1);
    __mmask16 m1 = nk <= 16 ? 0 : nk >= 32 ? 0xFFFF : (__mmask16)((1u << (nk - 16)) - 1);
    for (int r = 0; r < n; r += 4) {
        int rn = n - r < 4 ? n - r : 4;
        __m512 a[4][2];
        for (int i = 0; i < 4; i++)
            a[i][0] = a[i][1] = _mm512_setzero_ps();
        for (int d = 0; d < D; d++) {
            __m512 k0 = _mm512_loadu_ps(kt + (size_t)d * PAGE);
            __m512 k1 = _mm512_loadu_ps(kt + (size_t)d * PAGE + 16);
            for (int i = 0; i < rn; i++) {
                __m512 qb = _mm512_set1_ps(q[(size_t)(r + i) * D + d]);
                a[i][0] = _mm512_fmadd_ps(qb, k0, a[i][0]);
                a[i][1] = _mm512_fmadd_ps(qb, k1, a[i][1]);
            }
        }
        for (int i = 0; i < rn; i++) {
            _mm512_mask_storeu_ps(x + (size_t)(r + i) * ldx, m0, a[i][0]);
            _mm512_mask_storeu_ps(x + (size_t)(r + i) * ldx + 16, m1, a[i][1]);
        }
    }
}

/* Scores x (S) of the row at position pos (keys [0, jend) computed, those
 * past hidden) become its weights: masks (the additive one in log2 units),
 * then attn_bf16_weights_row. */
static void weights_row(float *x, const attn_seq *s, int pos, int jend) {
    static const attn_mask_units units = {.log2 = 1, .hidden = -INFINITY};
    attn_mask_scores(x, 1, s, pos, 0, jend, &units);
    attn_bf16_weights_row(x, jend);
    memset(x + jend, 0, sizeof(float) * (size_t)(s->S - jend));
}

/* The weights of positions [r0, r1) alone: a row's bits never depend on
 * the rows beside it, so the block [i0, i1) does not matter. */
static float *weights(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1, int r0,
                      int r1, float *scratch) {
    (void)i0;
    (void)i1;
    i0 = r0;
    i1 = r1;
    const attn_seq *s = &sa->view;
    int R = a->H / a->G, D = a->D, S = s->S, n = (i1 - i0) * R;
    int jend = s->causal && S > i1 + sa->shift ? i1 + sa->shift : S; /* later keys: all hidden */
    float *qw = scratch;              /* (n, D) the rows' rounded queries, widened */
    float *kt = qw + (size_t)n * D;   /* (D, PAGE) one page's keys, widened */
    float *x = kt + (size_t)PAGE * D; /* (n, S) scores, then weights */
    float qs = a->scale * ATTN_LOG2E;
    for (int r = 0; r < n; r++) {
        const float *src =
            a->q + (sa->q0 + (size_t)(i0 + r / R)) * a->ldq + ((size_t)g * R + (size_t)(r % R)) * D;
        for (int d = 0; d < D; d++) /* as the block rounds its queries */
            qw[(size_t)r * D + d] = attn_bf16_to_f32(attn_bf16_of_ftz(src[d] * qs));
    }
    attn_kv_bf16 kv = attn_kv_bf16_head(sa->kv16, a->G, D, g, S);
    for (int j0 = 0; j0 < jend; j0 += PAGE) {
        widen_keys(kt, &kv, D, (size_t)(j0 / PAGE));
        scores_page(x + j0, (size_t)S, qw, n, kt, D, jend - j0 < PAGE ? jend - j0 : PAGE);
    }
    for (int r = 0; r < n; r++)
        weights_row(x + (size_t)r * S, s, i0 + r / R + sa->shift, jend);
    return x;
}

/* The outputs come from the block, whatever the weights. */
static void outputs(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                    const float *w, float *scratch) {
    (void)w;
    block(a, sa, g, i0, i1, scratch);
}

const attn_attend_ops attn_attend_bf16 = {
    .name = "bf16",
    .pages = 1,
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
