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
 *   c   = ceil(max_j x_j),  p_j = 2^(x_j - c) (libm's exp2f),
 *   w_j = p_j / sum_j p_j   (fp32, j in order), 0 for a hidden key;
 * so they differ from the p_j / l of the block's output by fp32 rounding
 * alone (its 2^t is a polynomial, its sums in another order). A row's
 * numbers depend on its own query and keys only: never on the rows beside
 * it, its block or its thread. It does not project, rotate or pack (attn.c
 * does, before). Legend: see attn.h.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

enum {
    PAGE = ATTN_KV_PAGE,
    WEIGHT_FLOATS = 1 << 18, /* scores a task of the weights path holds at most */
};

int attn_attend16_rows(const attn_attend *a, const attn_seq *s) {
    size_t R = (size_t)(a->H / a->G), rows = ATTN_BF16_ROWS / R;
    if (s->weights != ATTN_WEIGHTS_NONE && WEIGHT_FLOATS / (R * (size_t)s->S) < rows)
        rows = WEIGHT_FLOATS / (R * (size_t)s->S);
    return rows < 1 ? 1 : (int)rows;
}

/* Floats of the block's scratch, a multiple of 16 (64 bytes). */
static size_t block_floats(int D) {
    return (attn_bf16_scratch_bytes(D) + 63) / 64 * 16;
}

size_t attn_attend16_floats(const attn_attend *a, const attn_seq *s) {
    size_t n = block_floats(a->D);
    if (s->weights == ATTN_WEIGHTS_NONE) return n;
    size_t rows = (size_t)attn_attend16_rows(a, s) * (size_t)(a->H / a->G);
    return n + rows * a->D + (size_t)PAGE * a->D + rows * s->S;
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

/* x (nk) = q (D) . kt's first nk keys: fp32 sums, d in order (each product
 * of two bf16 is exact, so a fused multiply-add gives the same bits). */
static void scores_page(float *x, const float *q, const float *kt, int D, int nk) {
    float acc[PAGE] = {0};
    for (int d = 0; d < D; d++)
        for (int t = 0; t < PAGE; t++)
            acc[t] += q[d] * kt[(size_t)d * PAGE + t];
    memcpy(x, acc, sizeof(float) * (size_t)nk);
}

/* Scores x (S) of the row at position pos (keys [0, jend) computed, those
 * past hidden) become its weights: masks, then the softmax of the file's
 * opening. */
static void weights_row(float *x, const attn_seq *s, int pos, int jend) {
    size_t m = (size_t)pos * s->S;
    float mx = -INFINITY, l = 0.0f;
    for (int j = 0; j < jend; j++) {
        int hidden = (s->causal && j > pos) || (s->key_padding_mask && s->key_padding_mask[j]) ||
                     (s->attn_mask_bool && s->attn_mask_bool[m + j]);
        float add = s->attn_mask_add ? attn_bf16_mask_log2(s->attn_mask_add[m + j]) : 0.0f;
        x[j] = hidden || add == -INFINITY ? -INFINITY : x[j] + add;
        mx = fmaxf(mx, x[j]);
    }
    float c = ceilf(mx);
    for (int j = 0; j < jend; j++) {
        x[j] = mx == -INFINITY || x[j] == -INFINITY ? 0.0f : exp2f(x[j] - c);
        l += x[j];
    }
    for (int j = 0; j < jend; j++)
        x[j] = l > 0 ? x[j] / l : 0.0f; /* every key hidden: 0 */
    memset(x + jend, 0, sizeof(float) * (size_t)(s->S - jend));
}

/* The attention weights of positions [i0, i1) for the R heads that read
 * key/value head g, into the caller's matrix (heads or their mean; heads
 * come in order, g outer, so a mean adds them in order). */
static void weights(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                    float *scratch) {
    const attn_seq *s = &sa->view;
    int R = a->H / a->G, D = a->D, S = s->S, n = (i1 - i0) * R;
    int jend = s->causal && S > i1 + sa->shift ? i1 + sa->shift : S; /* later keys: all hidden */
    float *qw = scratch;              /* (n, D) the rows' rounded queries, widened */
    float *kt = qw + (size_t)n * D;   /* (D, PAGE) one page's keys, widened */
    float *x = kt + (size_t)PAGE * D; /* (n, S) scores, then weights */
    float qs = a->scale * ATTN_LOG2E, invH = 1.0f / (float)a->H;
    for (int r = 0; r < n; r++) {
        const float *src =
            a->q + (sa->q0 + (size_t)(i0 + r / R)) * a->ldq + ((size_t)g * R + (size_t)(r % R)) * D;
        for (int d = 0; d < D; d++) /* as the block rounds its queries */
            qw[(size_t)r * D + d] = attn_bf16_to_f32(attn_bf16_of(src[d] * qs));
    }
    attn_kv_bf16 kv = attn_kv_bf16_head(sa->kv16, a->G, D, g, S);
    for (int j0 = 0; j0 < jend; j0 += PAGE) {
        widen_keys(kt, &kv, D, (size_t)(j0 / PAGE));
        for (int r = 0; r < n; r++)
            scores_page(x + (size_t)r * S + j0, qw + (size_t)r * D, kt, D,
                        jend - j0 < PAGE ? jend - j0 : PAGE);
    }
    for (int r = 0; r < n; r++) {
        int i = i0 + r / R, h = g * R + r % R;
        float *w = x + (size_t)r * S;
        weights_row(w, s, i + sa->shift, jend);
        if (s->weights == ATTN_WEIGHTS_HEADS)
            memcpy(s->attn + ((size_t)h * s->L + i) * S, w, sizeof(float) * (size_t)S);
        float *mean = s->attn + (size_t)i * S;
        for (int j = 0; s->weights == ATTN_WEIGHTS_MEAN && j < S; j++)
            mean[j] = h == 0 ? w[j] * invH : mean[j] + w[j] * invH;
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
