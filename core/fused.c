/* fused.c - the online-softmax attention of one (sequence, head, block of
 * up to 64 query rows) in AVX-512 registers, for head widths D that are a
 * multiple of 16 up to 128. It computes the same thing as attend_tiled() in
 * attn.c with OpenBLAS, which stays the path on other CPUs and head widths;
 * fusing saves OpenBLAS's packing of every score tile and keeps the
 * softmax in registers (measured in bench/, see README "Core").
 *
 * Scores are kept transposed, sT (Sb, 64): one row per key, one lane per
 * query row, so the softmax over keys is lane-wise (vertical) arithmetic.
 * Legend: see attn.h.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "internal.h"

#define FQ 64  /* query rows per block: four 16-lane vectors */
#ifndef ATTN_FK
#define ATTN_FK 128
#endif
#define FK ATTN_FK /* keys per tile */

static int fused_on = 1; /* attn_set_fused() */

int attn_set_fused(int on)
{
    int was = fused_on;
    fused_on = on != 0;
    return was;
}

int attn_fused_supported(int D)
{
    return fused_on && __builtin_cpu_supports("avx512f") && D % 16 == 0 && D <= 128;
}

size_t attn_fused_floats(int D)
{
    return (size_t)D * FQ + (size_t)FK * FQ + (size_t)FQ * D;
}

#define AVX512 __attribute__((target("avx512f")))
#define INLINE static inline __attribute__((always_inline))

/* e^x for x <= 0, 0 below the float range and at -inf (as vexp_neg in attn.c). */
AVX512 INLINE __m512 exp_neg(__m512 x)
{
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    __m512 n = _mm512_sub_ps(t, magic);
    __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mul_ps(~tiny, p, scale);
}

/* sT (C,64) = k (C,D) @ qT (D,64) for C = 4 keys or 1 key. */
AVX512 INLINE void scores_keys(float *sT, const float *k, size_t ldk, const float *qT, int D,
                               const int C)
{
    __m512 a[4][4];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < C; c++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) a[c][j] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 q0 = _mm512_loadu_ps(qT + d * FQ), q1 = _mm512_loadu_ps(qT + d * FQ + 16);
        __m512 q2 = _mm512_loadu_ps(qT + d * FQ + 32), q3 = _mm512_loadu_ps(qT + d * FQ + 48);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < C; c++) {
            __m512 kb = _mm512_set1_ps(k[c * ldk + d]);
            a[c][0] = _mm512_fmadd_ps(kb, q0, a[c][0]);
            a[c][1] = _mm512_fmadd_ps(kb, q1, a[c][1]);
            a[c][2] = _mm512_fmadd_ps(kb, q2, a[c][2]);
            a[c][3] = _mm512_fmadd_ps(kb, q3, a[c][3]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int c = 0; c < C; c++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(sT + c * FQ + 16 * j, a[c][j]);
}

/* acc (R,D) += pT[:, r0:r0+R]^T (R,Sb) @ v (Sb,D), ND = D/16 vectors a row. */
AVX512 INLINE void av_rows(float *acc, const float *pT, int r0, const float *v, size_t ldv,
                           int Sb, const int R, const int ND)
{
    __m512 a[4][8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ND; j++) a[r][j] = _mm512_loadu_ps(acc + (r0 + r) * ND * 16 + 16 * j);
    for (int c = 0; c < Sb; c++) {
        __m512 vv[8];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ND; j++) vv[j] = _mm512_loadu_ps(v + c * ldv + 16 * j);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            __m512 p = _mm512_set1_ps(pT[c * FQ + r0 + r]);
            _Pragma("GCC unroll 8")
            for (int j = 0; j < ND; j++) a[r][j] = _mm512_fmadd_ps(p, vv[j], a[r][j]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ND; j++) _mm512_storeu_ps(acc + (r0 + r) * ND * 16 + 16 * j, a[r][j]);
}

AVX512 INLINE void av_block(float *acc, const float *pT, const float *v, size_t ldv, int Sb,
                            int Lb, const int ND)
{
    const int R = ND <= 2 ? 4 : ND <= 4 ? 4 : 2; /* R * ND + ND vectors fit the 32 registers */
    int r = 0;
    for (; r + R <= Lb; r += R) av_rows(acc, pT, r, v, ldv, Sb, R, ND);
    for (; r < Lb; r++) av_rows(acc, pT, r, v, ldv, Sb, 1, ND);
}

/* Hides masked scores of the tile: sT (Sb,64) for keys j0.. and rows i0... */
static void mask_tile(float *sT, const attn_seq *s, int i0, int Lb, int j0, int Sb)
{
    for (int c = 0; c < Sb; c++) {
        int j = j0 + c;
        float *row = sT + (size_t)c * FQ;
        if (s->key_padding_mask && s->key_padding_mask[j]) {
            for (int r = 0; r < FQ; r++) row[r] = -INFINITY;
            continue;
        }
        if (s->attn_mask_add)
            for (int r = 0; r < Lb; r++) row[r] += s->attn_mask_add[(size_t)(i0 + r) * s->S + j];
        if (s->attn_mask_bool)
            for (int r = 0; r < Lb; r++)
                if (s->attn_mask_bool[(size_t)(i0 + r) * s->S + j]) row[r] = -INFINITY;
        if (s->causal && j > i0) /* rows i < j are hidden from key j */
            for (int r = 0; r < Lb && i0 + r < j; r++) row[r] = -INFINITY;
    }
}

AVX512 INLINE void fused_block(float *out, size_t ldo, const float *q, size_t ldq, const float *k,
                               size_t ldk, const float *v, size_t ldv, const attn_seq *s, int i0,
                               int Lb, float scale, float *scratch, const int ND)
{
    const int D = ND * 16;
    float *qT = scratch;           /* (D,64) scaled queries, transposed; zero past Lb */
    float *sT = qT + D * FQ;       /* (FK,64) scores, then probabilities, transposed */
    float *acc = sT + FK * FQ;     /* (64,D) unnormalised output rows */
    for (int d = 0; d < D; d++) {
        for (int r = 0; r < Lb; r++) qT[d * FQ + r] = q[(size_t)r * ldq + d] * scale;
        for (int r = Lb; r < FQ; r++) qT[d * FQ + r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)Lb * D);
    __m512 m[4], l[4];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 4; j++) {
        m[j] = _mm512_set1_ps(-INFINITY);
        l[j] = _mm512_setzero_ps();
    }
    int masked = s->key_padding_mask || s->attn_mask_bool || s->attn_mask_add || s->causal;
    int jend = s->S;
    if (s->causal && jend > i0 + Lb) jend = i0 + Lb; /* later keys are hidden from every row */
    for (int j0 = 0; j0 < jend; j0 += FK) {
        int Sb = jend - j0 < FK ? jend - j0 : FK;
        const float *kt = k + (size_t)j0 * ldk;
        int c = 0;
        // k (Sb,D) @ qT (D,64) -> sT (Sb,64)
        for (; c + 4 <= Sb; c += 4) scores_keys(sT + c * FQ, kt + c * ldk, ldk, qT, D, 4);
        for (; c < Sb; c++) scores_keys(sT + c * FQ, kt + c * ldk, ldk, qT, D, 1);
        if (masked) mask_tile(sT, s, i0, Lb, j0, Sb);
        __m512 mt[4], alpha[4], mn[4];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) mt[j] = _mm512_set1_ps(-INFINITY);
        for (c = 0; c < Sb; c++)
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 4; j++) mt[j] = _mm512_max_ps(mt[j], _mm512_loadu_ps(sT + c * FQ + 16 * j));
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) {
            mn[j] = _mm512_max_ps(m[j], mt[j]);
            /* rows with nothing visible yet keep max -inf: shift by 0, so e^-inf = 0, no NaN */
            __mmask16 none = _mm512_cmp_ps_mask(mn[j], _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
            mn[j] = _mm512_mask_blend_ps(none, mn[j], _mm512_setzero_ps());
            alpha[j] = exp_neg(_mm512_sub_ps(m[j], mn[j]));
            m[j] = _mm512_mask_blend_ps(none, mn[j], _mm512_set1_ps(-INFINITY));
        }
        __m512 ts[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (c = 0; c < Sb; c++)
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 4; j++) {
                __m512 p = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(sT + c * FQ + 16 * j), mn[j]));
                _mm512_storeu_ps(sT + c * FQ + 16 * j, p);
                ts[j] = _mm512_add_ps(ts[j], p);
            }
        float al[FQ];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) {
            l[j] = _mm512_fmadd_ps(l[j], alpha[j], ts[j]);
            _mm512_storeu_ps(al + 16 * j, alpha[j]);
        }
        if (j0 > 0)
            for (int r = 0; r < Lb; r++) {
                __m512 a = _mm512_set1_ps(al[r]);
                _Pragma("GCC unroll 8")
                for (int j = 0; j < ND; j++)
                    _mm512_storeu_ps(acc + r * D + 16 * j, _mm512_mul_ps(a, _mm512_loadu_ps(acc + r * D + 16 * j)));
            }
        // pT^T (Lb,Sb) @ v (Sb,D) + acc -> acc (Lb,D)
        av_block(acc, sT, v + (size_t)j0 * ldv, ldv, Sb, Lb, ND);
    }
    float lsum[FQ];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 4; j++) _mm512_storeu_ps(lsum + 16 * j, l[j]);
    for (int r = 0; r < Lb; r++) {
        float inv = lsum[r] > 0 ? 1.0f / lsum[r] : 0.0f; /* all keys hidden: 0 */
        for (int d = 0; d < D; d++) out[(size_t)r * ldo + d] = acc[r * D + d] * inv;
    }
}

AVX512 void attn_fused_block(float *out, size_t ldo, const float *q, size_t ldq, const float *k,
                             size_t ldk, const float *v, size_t ldv, const attn_seq *s, int i0,
                             int Lb, int D, float scale, float *scratch)
{
    switch (D / 16) {
    case 1: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 1); break;
    case 2: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 2); break;
    case 3: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 3); break;
    case 4: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 4); break;
    case 5: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 5); break;
    case 6: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 6); break;
    case 7: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 7); break;
    default: fused_block(out, ldo, q, ldq, k, ldk, v, ldv, s, i0, Lb, scale, scratch, 8); break;
    }
}
