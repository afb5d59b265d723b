/* attend_bf16.c - the attention tasks of a model that attends in bf16
 * (attn_model.attn16): QK^T and PV on bf16 operands, the keys and values
 * read from bf16 pages (a whole sequence's packed by attn.c, a step's from
 * its cache), softmax in fp32 (SPEC section 8, core/bf16.h). Two kinds of
 * task, cut like attend.c's:
 *
 *   no matrix asked for   (sequence, key/value head g, row block):
 *                         attn_bf16_block over the R query heads that read g;
 *   a matrix asked for    (sequence, row block), every head: per key/value
 *                         head, the attention weights of its rows (below),
 *                         then attn_bf16_block for their outputs, so that a
 *                         row's output is the same bits whether or not its
 *                         weights are asked for.
 *
 * The weights follow the block's formula (bf16.h) in plain loops: with
 * q~ = bf16(q * scale * log2(e)) and the keys k~ of the pages,
 *   x_j = q~ . k~_j (fp32 sums of exact products, d in order) + the
 *         additive mask in log2 units,
 *   c   = ceil(max_j x_j),  p_j = 2^(x_j - c) (the block's 2^t),
 *   w_j = p_j / sum_j p_j   (fp32), 0 for a hidden key
 * (attn_bf16_weights_row); so they differ from the p_j / l of the block's
 * output by fp32 rounding alone (its scores and sums in other orders). A row's
 * numbers depend on its own query and keys only: never on the rows beside
 * it, its block or its thread, so select.c computes a selection's rows
 * alone by attn_attend16_weights and gets the whole matrix's bits. It does
 * not project, rotate or pack (attn.c does, before). Legend: see attn.h.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "internal.h"

enum {
    PAGE = ATTN_KV_PAGE,
    WEIGHT_FLOATS = 1 << 18, /* scores a task of the weights path holds at most */
};

int attn_attend16_weight_rows(const attn_attend *a, int S) {
    size_t R = (size_t)(a->H / a->G), rows = ATTN_BF16_ROWS / R;
    if (WEIGHT_FLOATS / (R * (size_t)S) < rows) rows = WEIGHT_FLOATS / (R * (size_t)S);
    return rows < 1 ? 1 : (int)rows;
}

int attn_attend16_rows(const attn_attend *a, const attn_seq *s) {
    if (attn_full_weights(a, s)) return attn_attend16_weight_rows(a, s->S);
    int rows = ATTN_BF16_ROWS / (a->H / a->G);
    return rows < 1 ? 1 : rows;
}

/* Floats of the block's scratch, a multiple of 16 (64 bytes). */
static size_t block_floats(int D) {
    return (attn_bf16_scratch_bytes(D) + 63) / 64 * 16;
}

size_t attn_attend16_weight_floats(const attn_attend *a, int rows, int S) {
    size_t n = (size_t)rows * (size_t)(a->H / a->G);
    return n * a->D + (size_t)PAGE * a->D + n * S;
}

size_t attn_attend16_floats(const attn_attend *a, const attn_seq *s) {
    size_t n = block_floats(a->D);
    if (!attn_full_weights(a, s)) return n;
    return n + attn_attend16_weight_floats(a, attn_attend16_rows(a, s), s->S);
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

/* kt (D, PAGE) = the keys of page p of one head, widened (exact), from the
 * layout of bf16.h: key d of token 16b + t at ((b*D/2 + d/2)*16 + t)*2 + d%2. */
static void widen_keys(float *kt, const attn_kv_bf16 *kv, int D, size_t p) {
    const attn_bf16 *h = kv->head + p * kv->page;
    for (int b = 0; b < 2; b++)
        for (int dp = 0; dp < D / 2; dp++) {
            const attn_bf16 *src = h + ((size_t)b * (D / 2) + (size_t)dp) * 32; /* (16, 2) */
            for (int t = 0; t < 16; t++)
                for (int e = 0; e < 2; e++)
                    kt[(size_t)(2 * dp + e) * PAGE + 16 * b + t] = attn_bf16_to_f32(src[2 * t + e]);
        }
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
    size_t m = (size_t)pos * s->S;
    for (int j = 0; s->attn_mask_add && j < jend; j++) {
        float add = attn_bf16_mask_log2(s->attn_mask_add[m + j]);
        x[j] = add == -INFINITY ? -INFINITY : x[j] + add;
    }
    for (int j = 0; s->key_padding_mask && j < jend; j++)
        if (s->key_padding_mask[j]) x[j] = -INFINITY;
    for (int j = 0; s->attn_mask_bool && j < jend; j++)
        if (s->attn_mask_bool[m + j]) x[j] = -INFINITY;
    for (int j = pos + 1; s->causal && j < jend; j++)
        x[j] = -INFINITY;
    attn_bf16_weights_row(x, jend);
    memset(x + jend, 0, sizeof(float) * (size_t)(s->S - jend));
}

float *attn_attend16_weights(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                             float *scratch) {
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
            qw[(size_t)r * D + d] = attn_bf16_to_f32(attn_bf16_of(src[d] * qs));
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

/* The attention weights of positions [i0, i1) for the R heads that read
 * key/value head g, into the caller's matrix (heads or their mean; heads
 * come in order, g outer, so a mean adds them in order). */
static void weights(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                    float *scratch) {
    const attn_seq *s = &sa->view;
    int R = a->H / a->G, S = s->S, n = (i1 - i0) * R;
    float invH = 1.0f / (float)a->H;
    const float *x = attn_attend16_weights(a, sa, g, i0, i1, scratch); /* (n, S) */
    for (int r = 0; r < n; r++) {
        int i = i0 + r / R, h = g * R + r % R;
        const float *w = x + (size_t)r * S;
        if (s->weights == ATTN_WEIGHTS_HEADS)
            memcpy(s->attn + ((size_t)h * s->L + i) * S, w, sizeof(float) * (size_t)S);
        if (s->weights == ATTN_WEIGHTS_MEAN)
            attn_mean_add(s->attn + (size_t)i * S, w, (size_t)S, invH, h == 0);
    }
}

void attn_attend16_task(const attn_attend *a, const attn_task *tk, float *scratch) {
    const attn_seq_at *sa = &a->seqs[tk->seq];
    if (tk->head >= 0) {
        block(a, sa, tk->head, tk->i0, tk->i1, scratch);
        return;
    }
    for (int g = 0; g < a->G; g++) {
        weights(a, sa, g, tk->i0, tk->i1, scratch + block_floats(a->D));
        block(a, sa, g, tk->i0, tk->i1, scratch);
    }
}
