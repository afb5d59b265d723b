/* softmax.c - the softmax of rows of scores (softmax.h): the online update
 * of the fp32 tiles (a running max and sum per row over tiles of keys),
 * whole fp32 rows, and a row of weights in log2 units for the bf16 paths.
 * Scores come in scaled and masked; nothing here knows heads or sequences.
 * A row that sees no key gets weights 0.
 *
 * The fp32 row kernels (max, and e^(x - m) with its sum) are compiled for
 * AVX-512, AVX2 + FMA and the baseline, and chosen from the CPU's features
 * at run time (target_clones' load-time resolvers are not safe under
 * ThreadSanitizer).
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../platform/cpu.h"
#include "exp.h"
#include "softmax.h"

VINLINE float row_max_body(const float *x, int n) {
    vf16 m = VSPLAT(-INFINITY);
    int c = 0;
    for (; c + VL <= n; c += VL) {
        vf16 v;
        memcpy(&v, x + c, sizeof v);
        m = VSELECT(v > m, v, m);
    }
    float r = -INFINITY;
    for (int l = 0; l < VL; l++)
        r = m[l] > r ? m[l] : r;
    for (; c < n; c++)
        r = x[c] > r ? x[c] : r;
    return r;
}

/* x[c] = e^(x[c] - m); returns the sum. m is finite. */
VINLINE float row_exp_sum_body(float *x, int n, float m) {
    vf16 acc = VSPLAT(0.0f), vm = VSPLAT(m);
    int c = 0;
    for (; c + VL <= n; c += VL) {
        vf16 v;
        memcpy(&v, x + c, sizeof v);
        v = vexp_neg(v - vm, VEXP_ONE_LAST);
        memcpy(x + c, &v, sizeof v);
        acc += v;
    }
    if (c < n) {
        vf16 v = VSPLAT(-INFINITY);
        memcpy(&v, x + c, sizeof(float) * (size_t)(n - c));
        v = vexp_neg(v - vm, VEXP_ONE_LAST);
        memcpy(x + c, &v, sizeof(float) * (size_t)(n - c));
        acc += v;
    }
    float s = 0;
    for (int l = 0; l < VL; l++)
        s += acc[l];
    return s;
}

#define ROW_KERNELS(suffix, attr)                                                                  \
    attr static float row_max_##suffix(const float *x, int n) {                                    \
        return row_max_body(x, n);                                                                 \
    }                                                                                              \
    attr static float row_exp_sum_##suffix(float *x, int n, float m) {                             \
        return row_exp_sum_body(x, n, m);                                                          \
    }
ROW_KERNELS(avx512, __attribute__((target("avx512f"))))
ROW_KERNELS(avx2, __attribute__((target("avx2,fma"))))
ROW_KERNELS(base, )

/* The row kernels this CPU runs. */
typedef struct {
    float (*max)(const float *x, int n);
    float (*exp_sum)(float *x, int n, float m);
} row_kernels;

static row_kernels kernels(void) {
    switch (attn_isa()) {
    case ATTN_ISA_AVX512:
        return (row_kernels){row_max_avx512, row_exp_sum_avx512};
    case ATTN_ISA_AVX2:
        return (row_kernels){row_max_avx2, row_exp_sum_avx2};
    default:
        return (row_kernels){row_max_base, row_exp_sum_base};
    }
}

void attn_softmax_online(float *sc, int ld, int M, int n, float *mx, float *sum, float *acc,
                         int D) {
    row_kernels k = kernels();
    for (int r = 0; r < M; r++) {
        float *row = sc + (size_t)r * ld;
        float mt = k.max(row, n);
        if (mt == -INFINITY) { /* nothing visible to this row in this tile */
            memset(row, 0, sizeof(float) * (size_t)n);
            continue;
        }
        float mnew = mt > mx[r] ? mt : mx[r];
        float alpha = expf(mx[r] - mnew); /* 0 when mx was -inf */
        sum[r] = sum[r] * alpha + k.exp_sum(row, n, mnew);
        if (alpha != 1.0f)
            for (int d = 0; d < D; d++)
                acc[(size_t)r * D + d] *= alpha;
        mx[r] = mnew;
    }
}

void attn_softmax_rows(float *P, size_t ld, int M, int n, int width) {
    row_kernels k = kernels();
    for (int r = 0; r < M; r++) {
        float *row = P + (size_t)r * ld;
        float mt = k.max(row, n);
        if (mt == -INFINITY) {
            memset(row, 0, sizeof(float) * (size_t)width);
            continue;
        }
        float inv = 1.0f / k.exp_sum(row, n, mt);
        for (int c = 0; c < n; c++)
            row[c] *= inv;
        if (n < width) memset(row + n, 0, sizeof(float) * (size_t)(width - n));
    }
}

/* ---- a row's weights in log2 units (the bf16 paths) ---------------------------- */

#define BF16K __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define HIDDEN (-FLT_MAX) /* below any visible score, and finite */

VEXP2_NEG_FUNCTION(exp2_neg, BF16K)

/* The first n (>= 1) of 16 lanes. */
static inline __mmask16 tail16(int n) {
    return n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
}

BF16K static void weights_row_avx512(float *x, int n) {
    const __m512 none = _mm512_set1_ps(-INFINITY);
    __m512 mx = none, sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(none, tail16(n - j), x + j));
    float m = _mm512_reduce_max_ps(mx);
    if (m == -INFINITY) { /* every key hidden */
        memset(x, 0, sizeof(float) * (size_t)n);
        return;
    }
    __m512 neg = _mm512_set1_ps(-ceilf(m)), lo = _mm512_set1_ps(HIDDEN);
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = tail16(n - j);
        __m512 v = _mm512_mask_loadu_ps(none, k, x + j);
        __m512 p = exp2_neg(_mm512_max_ps(_mm512_add_ps(v, neg), lo)); /* hidden: 0 */
        sum = _mm512_add_ps(sum, p);
        _mm512_mask_storeu_ps(x + j, k, p);
    }
    __m512 l = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = tail16(n - j);
        _mm512_mask_storeu_ps(x + j, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + j), l));
    }
}

void attn_bf16_weights_row(float *x, int n) {
    if (attn_bf16_path() != ATTN_BF16_NONE) {
        weights_row_avx512(x, n);
        return;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < n; j++)
        m = x[j] > m ? x[j] : m;
    for (int j = 0; j < n; j++) {
        x[j] = m == -INFINITY || x[j] == -INFINITY ? 0.0f : exp2f(x[j] - ceilf(m));
        l += x[j];
    }
    for (int j = 0; j < n; j++)
        x[j] = l > 0 ? x[j] / l : 0.0f;
}
