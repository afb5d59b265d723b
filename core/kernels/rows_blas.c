/* rows_blas.c - fp32 attention of a group of query rows on OpenBLAS calls
 * (rows_blas.h): QK^T and AV by cblas_sgemm, masks (prim/mask.h) and the
 * softmax (prim/softmax.h) in between. Either online, over tiles of keys,
 * so that no (L,S) matrix is ever held, or as whole rows of weights, which
 * a caller that wants the attention matrix keeps.
 */
#include <math.h>
#include <string.h>

#include "../platform/blas.h"
#include "../prim/mask.h"
#include "../prim/softmax.h"
#include "rows_blas.h"

enum { KB = ATTN_ROWS_KB };

static const attn_mask_units g_units = {.log2 = 0, .hidden = -INFINITY};

/* Masks scores of rows r x keys [j0, j0+Sb) (sc at stride ldsc). */
static void mask_rows(float *sc, int ldsc, const attn_seq *s, const attn_qrows *r, int j0, int Sb) {
    for (int m = 0; m < r->M; m++)
        attn_mask_scores(sc + (size_t)m * ldsc, 1, s, r->pos + m * r->dpos, j0, Sb, &g_units);
}

size_t attn_rows_online_floats(int cap, int D) {
    return (size_t)cap * (KB + (size_t)D + 2);
}

void attn_rows_online(const attn_qrows *r, const attn_seq *s, int D, float scale, int cap,
                      float *scratch) {
    int M = r->M;
    float *sc = scratch;                /* (M,KB) scores, then probabilities */
    float *acc = sc + (size_t)cap * KB; /* (M,D) unnormalised output */
    float *mx = acc + (size_t)cap * D;  /* (M) running row max */
    float *sum = mx + cap;              /* (M) running row sum */
    memset(acc, 0, sizeof(float) * (size_t)M * D);
    for (int m = 0; m < M; m++) {
        mx[m] = -INFINITY;
        sum[m] = 0.0f;
    }
    for (int j0 = 0; j0 < r->jend; j0 += KB) {
        int Sb = r->jend - j0 < KB ? r->jend - j0 : KB;
        // q (M,D) @ k^T (D,Sb) * scale -> sc (M,Sb)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, Sb, D, scale, r->q, (int)r->ldq,
                   r->k + (size_t)j0 * r->ldkv, (int)r->ldkv, 0.0f, sc, Sb);
        mask_rows(sc, Sb, s, r, j0, Sb);
        attn_softmax_online(sc, Sb, M, Sb, mx, sum, acc, D);
        // p (M,Sb) @ v (Sb,D) + acc -> acc (M,D)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, Sb, 1.0f, sc, Sb,
                   r->v + (size_t)j0 * r->ldkv, (int)r->ldkv, 1.0f, acc, D);
    }
    for (int m = 0; m < M; m++) {
        float inv = sum[m] > 0 ? 1.0f / sum[m] : 0.0f; /* all keys hidden: 0 */
        for (int d = 0; d < D; d++)
            r->q[(size_t)m * r->ldq + d] = acc[(size_t)m * D + d] * inv;
    }
}

void attn_rows_scores(const attn_qrows *r, int D, float scale, float *P, int ldP) {
    // q (M,D) @ k^T (D,jend) * scale -> P (M,jend)
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->M, r->jend, D, scale, r->q, (int)r->ldq,
               r->k, (int)r->ldkv, 0.0f, P, ldP);
}

void attn_rows_weigh(const attn_qrows *r, const attn_seq *s, float *P, int ldP, int m0, int m1) {
    attn_qrows part = *r; /* rows m0..m1 of r */
    part.q += (size_t)m0 * r->ldq;
    part.M = m1 - m0;
    part.pos += m0 * r->dpos;
    float *rows = P + (size_t)m0 * ldP;
    mask_rows(rows, ldP, s, &part, 0, r->jend);
    attn_softmax_rows(rows, (size_t)ldP, m1 - m0, r->jend, s->S);
}

void attn_rows_values(const attn_qrows *r, int D, const float *P, int ldP) {
    // P (M,jend) @ v (jend,D) -> q's own rows (M,D): q is used up
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r->M, D, r->jend, 1.0f, P, ldP, r->v,
               (int)r->ldkv, 0.0f, r->q, (int)r->ldq);
}
