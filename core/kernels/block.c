/* block.c - the fp32 online-softmax attention of one (sequence, key/value
 * head, block of query rows) in AVX-512 registers, for head widths D that
 * are a multiple of 16 up to 128. It computes what the OpenBLAS rows of
 * rows_blas.c compute, which stay the path on other CPUs and head widths;
 * fusing saves OpenBLAS's packing of every score tile and keeps the
 * softmax in registers (bench/RESULTS.md has the numbers).
 *
 * Scores are kept transposed, sT (Sb, 64): one row per key, one lane per
 * query row, so the softmax over keys is lane-wise (vertical) arithmetic.
 * With grouped heads a row brings the R = H/G query heads that read the
 * same key/value head, one lane each, so each key is read once for all of
 * them. Lanes go in blocks of 64; the (up to 8) blocks of one call share
 * each key and value tile, copied once into a contiguous buffer (the
 * projections leave them strided).
 *
 * A lane's arithmetic never depends on the other lanes (its scores, running
 * max and sum, and output are its own; a key it may not see adds exactly
 * nothing), so a row gives the same bits whatever block it is computed in:
 * a session step's rows are the bits of the same rows of the whole sequence.
 * Legend: see attn.h.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../platform/cpu.h"
#include "../prim/exp.h"
#include "../prim/mask.h"
#include "block.h"

#define FQ 64                          /* query rows per block: four 16-lane vectors */
#define FBLOCKS (ATTN_FUSED_ROWS / FQ) /* blocks one call may take */
#ifndef ATTN_FK                        /* -DATTN_FK=... for tuning builds */
#define ATTN_FK 128
#endif
#define FK ATTN_FK /* keys per tile */

static int fused_on = 1; /* attn_set_fused() */

int attn_set_fused(int on) {
    int was = fused_on;
    fused_on = on != 0;
    return was;
}

int attn_fused_supported(int D) {
    return fused_on && attn_isa() >= ATTN_ISA_AVX512 && D % 16 == 0 && D <= 128;
}

size_t attn_fused_floats(int D) {
    return (size_t)FK * FQ + 2 * (size_t)FK * D + (size_t)FBLOCKS * 2 * D * FQ;
}

#define AVX512 __attribute__((target("avx512f")))
#define INLINE static inline __attribute__((always_inline))

/* e^x for x <= 0, 0 below the float range and at -inf (vexp.h). */
VEXP_NEG_FUNCTION(vexp_neg512, AVX512)
AVX512 INLINE __m512 exp_neg(__m512 x) {
    return (__m512)vexp_neg512((vf16)x, VEXP_ONE_FIRST);
}

/* sT (C,16*NV) = k (C,D) @ qT (D,16*NV) for C = 6, 4 or 1 keys: the first
 * NV vectors of 16 lanes (4: all 64; 1: a block of at most 16 lanes). */
AVX512 INLINE void scores_keys(float *sT, const float *k, size_t ldk, const float *qT, int D,
                               const int C, const int NV) {
    __m512 a[6][4];
    _Pragma("GCC unroll 8") for (int c = 0; c < C; c++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) a[c][j] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 qv[4];
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) qv[j] =
            _mm512_loadu_ps(qT + d * FQ + 16 * j);
        _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {
            __m512 kb = _mm512_set1_ps(k[c * ldk + d]);
            _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) a[c][j] =
                _mm512_fmadd_ps(kb, qv[j], a[c][j]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < C; c++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(sT + c * FQ + 16 * j, a[c][j]);
}

/* acc (R, 16*NC) += pT[:, r0:r0+R]^T (R,Sb) @ v (Sb, 16*NC): one chunk of at
 * most four column vectors; acc rows are D floats apart. */
AVX512 INLINE void av_rows(float *acc, int D, const float *pT, int r0, const float *v, size_t ldv,
                           int Sb, const int R, const int NC) {
    __m512 a[6][4];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++) a[r][j] =
            _mm512_loadu_ps(acc + (r0 + r) * D + 16 * j);
    for (int c = 0; c < Sb; c++) {
        __m512 vv[4];
        _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++) vv[j] =
            _mm512_loadu_ps(v + c * ldv + 16 * j);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            __m512 p = _mm512_set1_ps(pT[c * FQ + r0 + r]);
            _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++) a[r][j] =
                _mm512_fmadd_ps(p, vv[j], a[r][j]);
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++)
            _mm512_storeu_ps(acc + (r0 + r) * D + 16 * j, a[r][j]);
}

/* acc (Lb,D) += pT^T (Lb,Sb) @ v (Sb,D), rows six at a time (24 accumulators
 * and 4 vectors of v fit the 32 registers), columns four vectors at a time. */
AVX512 INLINE void av_cols(float *acc, int D, const float *pT, const float *v, size_t ldv, int Sb,
                           int Lb, const int NC) {
    int r = 0;
    for (; r + 6 <= Lb; r += 6)
        av_rows(acc, D, pT, r, v, ldv, Sb, 6, NC);
    for (; r + 4 <= Lb; r += 4)
        av_rows(acc, D, pT, r, v, ldv, Sb, 4, NC);
    for (; r < Lb; r++)
        av_rows(acc, D, pT, r, v, ldv, Sb, 1, NC);
}

AVX512 INLINE void av_block(float *acc, const float *pT, const float *v, size_t ldv, int Sb, int Lb,
                            const int ND) {
    av_cols(acc, ND * 16, pT, v, ldv, Sb, Lb, ND < 4 ? ND : 4);
    if (ND > 4) av_cols(acc + 64, ND * 16, pT, v + 64, ldv, Sb, Lb, ND - 4);
}

/* Hides masked scores of the tile: sT (Sb,64) for keys j0.., lane r at
 * position pos[r] (its scores a column of sT). */
static void mask_tile(float *sT, const attn_seq *s, const int *pos, int Lb, int j0, int Sb) {
    static const attn_mask_units units = {.log2 = 0, .hidden = -INFINITY};
    for (int r = 0; r < Lb; r++)
        attn_mask_scores(sT + r, FQ, s, pos[r], j0, Sb, &units);
}

/* Online softmax state of one block of FQ lanes. */
typedef struct {
    int Lb;            /* lanes in use */
    int pos[FQ];       /* position of each lane's row */
    float *row[FQ];    /* each lane's query, D floats, overwritten by its output */
    float *qT;         /* (D,FQ) scaled queries, transposed; zero past Lb */
    float *acc;        /* (FQ,D) unnormalised output rows */
    __m512 m[4], l[4]; /* running max and sum, one lane per row */
} fused_rows;

/* One key tile for one block: scores, masks, online softmax update, AV, on
 * the block's first NV vectors of lanes (4, or 1 when Lb <= 16: lanes past
 * Lb are never read, so a short block skips their work). */
AVX512 INLINE void tile_update(fused_rows *st, float *sT, const float *kt, size_t ldk,
                               const float *vt, size_t ldv, const attn_seq *s, int j0, int Sb,
                               int masked, const int ND, const int NV) {
    const int D = ND * 16, Lb = st->Lb;
    int c = 0;
    // k (Sb,D) @ qT (D,64) -> sT (Sb,64)
    for (; c + 6 <= Sb; c += 6)
        scores_keys(sT + c * FQ, kt + c * ldk, ldk, st->qT, D, 6, NV);
    for (; c + 4 <= Sb; c += 4)
        scores_keys(sT + c * FQ, kt + c * ldk, ldk, st->qT, D, 4, NV);
    for (; c < Sb; c++)
        scores_keys(sT + c * FQ, kt + c * ldk, ldk, st->qT, D, 1, NV);
    if (masked) mask_tile(sT, s, st->pos, Lb, j0, Sb);
    __m512 mt[4], alpha[4], mn[4], ts[4];
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) {
        mt[j] = _mm512_set1_ps(-INFINITY);
        ts[j] = _mm512_setzero_ps();
    }
    for (c = 0; c < Sb; c++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) mt[j] =
            _mm512_max_ps(mt[j], _mm512_loadu_ps(sT + c * FQ + 16 * j));
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) {
        mn[j] = _mm512_max_ps(st->m[j], mt[j]);
        /* rows with nothing visible yet keep max -inf: shift by 0, so e^-inf = 0, no NaN */
        __mmask16 none = _mm512_cmp_ps_mask(mn[j], _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
        mn[j] = _mm512_mask_blend_ps(none, mn[j], _mm512_setzero_ps());
        alpha[j] = exp_neg(_mm512_sub_ps(st->m[j], mn[j]));
        st->m[j] = _mm512_mask_blend_ps(none, mn[j], _mm512_set1_ps(-INFINITY));
    }
    for (c = 0; c < Sb; c++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) {
            __m512 p = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(sT + c * FQ + 16 * j), mn[j]));
            _mm512_storeu_ps(sT + c * FQ + 16 * j, p);
            ts[j] = _mm512_add_ps(ts[j], p);
        }
    float al[FQ];
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++) {
        st->l[j] = _mm512_fmadd_ps(st->l[j], alpha[j], ts[j]);
        _mm512_storeu_ps(al + 16 * j, alpha[j]);
    }
    if (j0 > 0)
        for (int r = 0; r < Lb; r++) {
            __m512 a = _mm512_set1_ps(al[r]);
            _Pragma("GCC unroll 8") for (int j = 0; j < ND; j++)
                _mm512_storeu_ps(st->acc + r * D + 16 * j,
                                 _mm512_mul_ps(a, _mm512_loadu_ps(st->acc + r * D + 16 * j)));
        }
    // pT^T (Lb,Sb) @ v (Sb,D) + acc -> acc (Lb,D)
    av_block(st->acc, sT, vt, ldv, Sb, Lb, ND);
}

/* Copies Sb rows of x (row stride ldx) to a contiguous (Sb,D) tile. */
static void copy_tile(float *dst, const float *x, size_t ldx, int Sb, int D) {
    for (int c = 0; c < Sb; c++)
        memcpy(dst + (size_t)c * D, x + c * ldx, sizeof(float) * D);
}

/* Block b of the call's lanes: lane r is row r / R (at position pos0 + r / R)
 * and query head r % R of q (rows ldq apart, heads D apart). */
AVX512 INLINE void rows_init(fused_rows *st, float *blk, float *q, size_t ldq, int R, int pos0,
                             int lanes, int b, float scale, const int D) {
    int r0 = b * FQ;
    st->Lb = lanes - r0 < FQ ? lanes - r0 : FQ;
    for (int r = 0; r < st->Lb; r++) {
        st->pos[r] = pos0 + (r0 + r) / R;
        st->row[r] = q + (size_t)((r0 + r) / R) * ldq + (size_t)((r0 + r) % R) * D;
    }
    st->qT = blk + (size_t)b * 2 * D * FQ;
    st->acc = st->qT + D * FQ;
    for (int d = 0; d < D; d++) {
        for (int r = 0; r < st->Lb; r++)
            st->qT[d * FQ + r] = st->row[r][d] * scale;
        for (int r = st->Lb; r < FQ; r++)
            st->qT[d * FQ + r] = 0.0f;
    }
    memset(st->acc, 0, sizeof(float) * (size_t)st->Lb * D);
    for (int j = 0; j < 4; j++) {
        st->m[j] = _mm512_set1_ps(-INFINITY);
        st->l[j] = _mm512_setzero_ps();
    }
}

/* Each lane's output, acc / sum, over its query. */
AVX512 INLINE void rows_finish(fused_rows *st, const int D) {
    float lsum[FQ];
    for (int j = 0; j < 4; j++)
        _mm512_storeu_ps(lsum + 16 * j, st->l[j]);
    for (int r = 0; r < st->Lb; r++) {
        float inv = lsum[r] > 0 ? 1.0f / lsum[r] : 0.0f; /* all keys hidden: 0 */
        for (int d = 0; d < D; d++)
            st->row[r][d] = st->acc[r * D + d] * inv;
    }
}

AVX512 INLINE void fused_rows_all(float *q, size_t ldq, int R, const float *k, const float *v,
                                  size_t ldkv, const attn_seq *s, int pos0, int lanes, float scale,
                                  float *scratch, const int ND) {
    const int D = ND * 16;
    int nb = (lanes + FQ - 1) / FQ; /* blocks of FQ lanes, at most FBLOCKS */
    float *sT = scratch;            /* (FK,FQ) scores, then probabilities, transposed */
    float *kbuf = sT + FK * FQ;     /* (FK,D) key tile, contiguous */
    float *vbuf = kbuf + FK * D;    /* (FK,D) value tile, contiguous */
    float *blk = vbuf + FK * D;     /* per block: qT (D,FQ), acc (FQ,D) */
    fused_rows st[FBLOCKS];
    for (int b = 0; b < nb; b++)
        rows_init(&st[b], blk, q, ldq, R, pos0, lanes, b, scale, D);
    int masked = s->key_padding_mask || s->attn_mask_bool || s->attn_mask_add || s->causal;
    int jend = s->S, last = pos0 + (lanes - 1) / R;
    if (s->causal && jend > last + 1) jend = last + 1; /* later keys are hidden from every row */
    for (int j0 = 0; j0 < jend; j0 += FK) {
        int Sb = jend - j0 < FK ? jend - j0 : FK;
        const float *kt = k + (size_t)j0 * ldkv, *vt = v + (size_t)j0 * ldkv;
        size_t ldkt = ldkv, ldvt = ldkv;
        if (nb > 1) { /* reused by every block: worth a contiguous copy */
            copy_tile(kbuf, kt, ldkv, Sb, D);
            copy_tile(vbuf, vt, ldkv, Sb, D);
            kt = kbuf;
            vt = vbuf;
            ldkt = ldvt = D;
        }
        for (int b = 0; b < nb; b++) {
            if (s->causal && j0 > st[b].pos[st[b].Lb - 1]) continue; /* all in the block's future */
            if (st[b].Lb <= 16)
                tile_update(&st[b], sT, kt, ldkt, vt, ldvt, s, j0, Sb, masked, ND, 1);
            else
                tile_update(&st[b], sT, kt, ldkt, vt, ldvt, s, j0, Sb, masked, ND, 4);
        }
    }
    for (int b = 0; b < nb; b++)
        rows_finish(&st[b], D);
}

/* One fused_rows_all per head width D = 16 * ND, chosen by D at run time. */
typedef void fused_fn(float *q, size_t ldq, int R, const float *k, const float *v, size_t ldkv,
                      const attn_seq *s, int pos0, int lanes, float scale, float *scratch);
#define FUSED_WIDTH(nd)                                                                            \
    AVX512 static void fused_##nd(float *q, size_t ldq, int R, const float *k, const float *v,     \
                                  size_t ldkv, const attn_seq *s, int pos0, int lanes,             \
                                  float scale, float *scratch) {                                   \
        fused_rows_all(q, ldq, R, k, v, ldkv, s, pos0, lanes, scale, scratch, nd);                 \
    }
// clang-format off
FUSED_WIDTH(1) FUSED_WIDTH(2) FUSED_WIDTH(3) FUSED_WIDTH(4)
FUSED_WIDTH(5) FUSED_WIDTH(6) FUSED_WIDTH(7) FUSED_WIDTH(8)
static fused_fn *const FUSED[8] = {fused_1, fused_2, fused_3, fused_4,
                                   fused_5, fused_6, fused_7, fused_8};
// clang-format on

void attn_fused_block(float *q, size_t ldq, int R, const float *k, const float *v, size_t ldkv,
                      const attn_seq *s, int pos0, int rows, int D, float scale, float *scratch) {
    FUSED[D / 16 - 1](q, ldq, R, k, v, ldkv, s, pos0, rows * R, scale, scratch);
}
