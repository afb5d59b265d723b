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
 * projections leave them strided). Blocks of at most 4 lanes (KV-cache
 * steps) put keys in the lanes instead (tile_few), with the same bits.
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

#define FKP ((FK + 15) / 16 * 16) /* a transposed key tile's row stride */
/* Lanes up to which a block takes the few-lane path (tile_few). Measured on
 * one call over 4096 cached keys at a cache's row stride (AVX-512 Xeon,
 * D 64 and 128): keys in lanes won at 1 to 4 lanes (1.2 to 1.6 times at
 * one), lost from 5 on, where the transposes and each lane's own passes
 * cost more than the idle lanes of the 16-lane path. */
#ifndef ATTN_FEW /* -DATTN_FEW=... for tuning builds, at most 16 */
#define ATTN_FEW 4
#endif
#define FEW ATTN_FEW

size_t attn_fused_floats(int D) {
    return (size_t)FK * FQ + 2 * (size_t)FK * D + (size_t)FBLOCKS * 2 * D * FQ + (size_t)D * FKP;
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

/* The end of a tile for a block: each lane's output so far scaled by its
 * factor al[r] for the earlier keys (none before the first tile), then
 * pT^T (Lb,Sb) @ v (Sb,D) added to it. */
AVX512 INLINE void acc_update(fused_rows *st, const float *al, int j0, const float *sT,
                              const float *vt, size_t ldv, int Sb, const int ND) {
    const int D = ND * 16, Lb = st->Lb;
    if (j0 > 0)
        for (int r = 0; r < Lb; r++) {
            __m512 a = _mm512_set1_ps(al[r]);
            _Pragma("GCC unroll 8") for (int j = 0; j < ND; j++)
                _mm512_storeu_ps(st->acc + r * D + 16 * j,
                                 _mm512_mul_ps(a, _mm512_loadu_ps(st->acc + r * D + 16 * j)));
        }
    av_block(st->acc, sT, vt, ldv, Sb, Lb, ND);
}

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
    acc_update(st, al, j0, sT, vt, ldv, Sb, ND);
}

/* The few-lane path. A decode step's block has Lb = rows * R lanes, often 1
 * to 4: one 16-lane vector per key would leave 12 to 15 lanes idle in every
 * score and softmax step. Here keys go in the vector lanes instead, from the
 * key tile transposed once into kT (D, FKP). Every score, max, e^x and sum
 * is the same operation sequence as tile_update's, so the bits are the same:
 * a score is the fma chain over d = 0..D-1 from zero (fma(k, q, a) =
 * fma(q, k, a)), the max is order-free, e^x is lane-wise, and the tile's sum
 * adds the keys one at a time in key order, as tile_update does. Masks (a
 * session step's rows are causal over its cache) go through the same
 * attn_mask_scores, on a lane's scores at stride 1 instead of FQ. */

/* kT (16,16) at kT (row stride FKP) = the transpose of rows x[0..15]. */
AVX512 INLINE void transpose16(float *kT, __m512 *x) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = (__m512)_mm512_unpacklo_pd((__m512d)t[i], (__m512d)t[i + 2]);
        u[i + 1] = (__m512)_mm512_unpackhi_pd((__m512d)t[i], (__m512d)t[i + 2]);
        u[i + 2] = (__m512)_mm512_unpacklo_pd((__m512d)t[i + 1], (__m512d)t[i + 3]);
        u[i + 3] = (__m512)_mm512_unpackhi_pd((__m512d)t[i + 1], (__m512d)t[i + 3]);
    }
    for (int i = 0; i < 4; i++) { /* 128-bit quarters: rows i, i+4 / i+8, i+12 */
        t[i] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        _mm512_storeu_ps(kT + (size_t)i * FKP, _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
        _mm512_storeu_ps(kT + (size_t)(i + 8) * FKP, _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd));
    }
}

/* kT (D, FKP) = k (Sb, D)^T, keys past Sb zero. */
AVX512 INLINE void transpose_tile(float *kT, const float *k, size_t ldk, int Sb, const int D) {
    for (int c0 = 0; c0 < Sb; c0 += 16)
        for (int d0 = 0; d0 < D; d0 += 16) {
            __m512 x[16];
            for (int i = 0; i < 16; i++)
                x[i] = c0 + i < Sb ? _mm512_loadu_ps(k + (size_t)(c0 + i) * ldk + d0)
                                   : _mm512_setzero_ps();
            transpose16(kT + (size_t)d0 * FKP + c0, x);
        }
}

/* s[c0 .. c0+16*NC) = scores of keys c0.. for the query q (D floats apart
 * by qs), NC vectors of 16 keys. */
AVX512 INLINE void scores_lane(float *s, const float *kT, int c0, const float *q, size_t qs, int D,
                               const int NC) {
    __m512 a[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++) a[j] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 qb = _mm512_set1_ps(q[d * qs]);
        _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++) a[j] =
            _mm512_fmadd_ps(_mm512_loadu_ps(kT + (size_t)d * FKP + c0 + 16 * j), qb, a[j]);
    }
    _Pragma("GCC unroll 8") for (int j = 0; j < NC; j++) _mm512_storeu_ps(s + c0 + 16 * j, a[j]);
}

/* Lane r's softmax update over the tile's scores s (Sb, padded to 16):
 * its probabilities into column r of sT, its max and sum in m, l; its
 * factor for the earlier keys returned. */
AVX512 INLINE float softmax_lane(float *sT, int r, float *s, int Sb, float *m, float *l) {
    __m512 mt = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < Sb; c += 16) {
        __mmask16 in = Sb - c >= 16 ? 0xffff : (__mmask16)((1u << (Sb - c)) - 1);
        mt = _mm512_mask_max_ps(mt, in, mt, _mm512_loadu_ps(s + c));
    }
    /* a zero max's sign may differ from tile_update's, which is harmless: it
     * changes only the sign of differences that are then zero, e^-0 = e^+0 */
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mt)); /* then max(m, tile) as tile_update */
    float mn = _mm512_cvtss_f32(_mm512_max_ps(_mm512_set1_ps(m[r]), mx));
    int none = mn == -INFINITY; /* nothing visible yet: as tile_update */
    if (none) mn = 0.0f;
    __m512 mv = _mm512_set1_ps(mn);
    float alpha = _mm512_cvtss_f32(exp_neg(_mm512_sub_ps(_mm512_set1_ps(m[r]), mv)));
    m[r] = none ? -INFINITY : mn;
    for (int c = 0; c < Sb; c += 16)
        _mm512_storeu_ps(s + c, exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + c), mv)));
    float ts = 0.0f;
    for (int c = 0; c < Sb; c++) { /* in key order, one key a step */
        ts += s[c];
        sT[c * FQ + r] = s[c];
    }
    l[r] = fmaf(l[r], alpha, ts);
    return alpha;
}

/* tile_update for a block of at most FEW lanes; kT is scratch. */
AVX512 INLINE void tile_few(fused_rows *st, float *sT, float *kT, const float *kt, size_t ldk,
                            const float *vt, size_t ldv, const attn_seq *sq, int j0, int Sb,
                            int masked, const int ND) {
    static const attn_mask_units units = {.log2 = 0, .hidden = -INFINITY}; /* as mask_tile */
    const int D = ND * 16, Lb = st->Lb;
    float s[FKP], m[16], l[16], al[16];
    transpose_tile(kT, kt, ldk, Sb, D);
    _mm512_storeu_ps(m, st->m[0]);
    _mm512_storeu_ps(l, st->l[0]);
    for (int r = 0; r < Lb; r++) {
        int c0 = 0;
        for (; c0 + 128 <= Sb; c0 += 128)
            scores_lane(s, kT, c0, st->qT + r, FQ, D, 8);
        for (; c0 < Sb; c0 += 16)
            scores_lane(s, kT, c0, st->qT + r, FQ, D, 1);
        if (masked) attn_mask_scores(s, 1, sq, st->pos[r], j0, Sb, &units);
        al[r] = softmax_lane(sT, r, s, Sb, m, l);
    }
    st->m[0] = _mm512_loadu_ps(m);
    st->l[0] = _mm512_loadu_ps(l);
    acc_update(st, al, j0, sT, vt, ldv, Sb, ND);
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
    float *kT = blk + (size_t)FBLOCKS * 2 * D * FQ; /* (D,FKP) transposed key tile, few lanes */
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
            if (st[b].Lb <= FEW)
                tile_few(&st[b], sT, kT, kt, ldkt, vt, ldvt, s, j0, Sb, masked, ND);
            else if (st[b].Lb <= 16)
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
