/* softmax.c - the softmax of rows of scores, for the attention paths that
 * hold scores row by row (attend.c): the OpenBLAS tiles, which update a
 * running max and sum per row over tiles of keys (an online softmax), and
 * the full-matrix path, which normalises whole rows. The fused AVX-512
 * kernel (fused.c) keeps its scores transposed in registers and does the
 * same online update lane by lane, with the same exponential (vexp.h).
 *
 * The two row kernels (max, and e^(x - m) with its sum) are compiled for
 * AVX-512, AVX2 + FMA and the baseline, and chosen from the CPU's features
 * (cpu.c) at run time (target_clones' load-time resolvers are not safe under
 * ThreadSanitizer). A row that sees no key gets weights 0. Scores come in
 * scaled and masked (attend.c); nothing here knows heads or sequences.
 */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "vexp.h"

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
