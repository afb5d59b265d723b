/* gemm_int8.c - projections on int8 weights: the formula of gemm_int8.h on
 * rows prepared once (their scale, then a~ + 128), weights packed once.
 *
 * AVX512-VNNI: 12 rows x 2 panels in 24 registers of int32 sums; each
 * VPDPBUSD adds the products of four inputs, a 32-bit broadcast of the row's
 * four bytes against a panel's 64 bytes. The whole K in one pass (int32
 * sums need no blocking to stay exact).
 * AVX-VNNI: the same on 256-bit registers, 4 rows x 1 panel (two halves),
 * in the VEX form, or the EVEX form where only AVX512-VNNI is there.
 * AMX-INT8: 32 rows x 2 panels in four int32 C tiles; TDPBUSD is 16 x 16 x
 * 64. The tiles are stored to a staging buffer, then scaled into C.
 * Every path ends in the same epilogue (fix-up, conversion, scale, bias).
 * Legend: see attn.h (here M rows, N output columns, K input width).
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../platform/amx.h"
#include "../platform/cpu.h"
#include "../platform/mem.h"
#include "gemm_int8.h"
#include "hints.h"

enum { NP = ATTN_PANEL, KS = ATTN_INT8_KSTEP };

#define INLINE static inline __attribute__((always_inline))
#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,prfchw")))
#define VEX __attribute__((target("avx2,fma,avxvnni")))
#define EVEX256 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma")))
#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))

/* ---- quantizing ---------------------------------------------------------------- */

static int8_t q_of(float x, float s) {
    float v = rintf(x / s); /* the default rounding: to nearest, ties to even */
    return (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
}

static float max_abs(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

float attn_int8_quantize(int8_t *q, const float *x, size_t n) {
    float s = max_abs(x, n) / 127.0f;
    for (size_t i = 0; i < n; i++)
        q[i] = s > 0.0f ? q_of(x[i], s) : 0;
    return s;
}

size_t attn_int8_row_bytes(int K) {
    return ATTN_INT8_HEAD + (size_t)(K + KS - 1) / KS * KS;
}

/* Eight rounded quotients x / s (the same bits as q_of before the clamp). */
AVX2 INLINE __m256 div8(const float *x, __m256 s) {
    return _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x), s),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Clamped to [-127, 127], + 128, packed into 32 bytes at dst in order. */
AVX2 INLINE void store32(uint8_t *dst, const __m256 r[4]) {
    __m256i v[4];
    for (int i = 0; i < 4; i++) {
        __m256 c =
            _mm256_min_ps(_mm256_max_ps(r[i], _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        v[i] = _mm256_add_epi32(_mm256_cvtps_epi32(c), _mm256_set1_epi32(128));
    }
    __m256i b =
        _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)dst, b);
}

/* 32 inputs: a~ + 128 into dst, the same bits as q_of. A division costs
 * ten times a product, so each x / s is first taken as y = x * inv (inv =
 * 1/s rounded): |y - fl(x / s)| < 2^-15, since both are within 2^-23
 * relative of x / s and |x / s| <= 127 (1 + 2^-23). Where every y is more
 * than NEAR from the nearest half-integer, fl(x / s) lies on the same side
 * of it and is no tie, so both round to the same integer; where one is not
 * (about one input in two thousand, or a NaN or infinity), the 32 inputs
 * are divided as the formula says. */
AVX2 static void prepare32(uint8_t *dst, const float *x, float scale, float inv) {
    const __m256 near = _mm256_set1_ps(0.5f - 1.0f / 4096.0f);
    __m256 r[4], vinv = _mm256_set1_ps(inv), far = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < 4; i++) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), vinv);
        r[i] = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 d = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(y, r[i]));
        far = _mm256_and_ps(far, _mm256_cmp_ps(d, near, _CMP_LT_OQ)); /* false for NaN */
    }
    if (_mm256_movemask_ps(far) != 0xFF) {
        __m256 s = _mm256_set1_ps(scale);
        for (int i = 0; i < 4; i++)
            r[i] = div8(x + 8 * i, s);
    }
    store32(dst, r);
}

/* max |x| over n, as max_abs: four chains of eight lanes (the order of a
 * max does not change it; MAXPS returns its second operand, the max so far,
 * when the first is a NaN, which max_abs skips too). */
AVX2 static float max_abs8(const float *x, size_t n) {
    __m256 m[4], sign = _mm256_set1_ps(-0.0f);
    for (int c = 0; c < 4; c++)
        m[c] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int c = 0; c < 4; c++)
            m[c] = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i + 8 * c)), m[c]);
    for (; i + 8 <= n; i += 8)
        m[0] = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m[0]);
    m[0] = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    float lanes[8], r = max_abs(x + i, n - i);
    _mm256_storeu_ps(lanes, m[0]);
    for (int l = 0; l < 8; l++)
        r = lanes[l] > r ? lanes[l] : r;
    return r;
}

/* The same two steps on AVX-512 (the AMX-INT8 and AVX512-VNNI paths), 64
 * inputs at a time: max_abs8's max, and prepare32's products checked
 * against NEAR, else divisions, clamped as q_of. */
V512 static float max_abs16(const float *x, size_t n) {
    __m512 m[4];
    for (int c = 0; c < 4; c++)
        m[c] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int c = 0; c < 4; c++)
            m[c] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i + 16 * c)), m[c]);
    for (; i + 16 <= n; i += 16)
        m[0] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m[0]);
    m[0] = _mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]));
    float r = max_abs(x + i, n - i), l = _mm512_reduce_max_ps(m[0]);
    return l > r ? l : r;
}

V512 static void prepare64(uint8_t *dst, const float *x, float scale, float inv) {
    const __m512 near = _mm512_set1_ps(0.5f - 1.0f / 4096.0f), big = _mm512_set1_ps(256.0f);
    __m512i q[4];
    __mmask16 far = 0xFFFF;
    for (int i = 0; i < 4; i++) {
        __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), _mm512_set1_ps(inv));
        q[i] = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 d = _mm512_abs_ps(_mm512_sub_ps(y, _mm512_cvtepi32_ps(q[i])));
        far &= _mm512_cmp_ps_mask(d, near, _CMP_LT_OQ) & /* false for NaN */
               _mm512_cmp_ps_mask(_mm512_abs_ps(y), big, _CMP_LT_OQ);
    }
    for (int i = 0; i < 4; i++) {
        if (far != 0xFFFF) {
            __m512 r = _mm512_roundscale_ps(
                _mm512_div_ps(_mm512_loadu_ps(x + 16 * i), _mm512_set1_ps(scale)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            q[i] = _mm512_cvtps_epi32(r);
        }
        q[i] = _mm512_min_epi32(_mm512_max_epi32(q[i], _mm512_set1_epi32(-127)),
                                _mm512_set1_epi32(127));
        _mm_storeu_si128((__m128i *)(dst + 16 * i),
                         _mm512_cvtepi32_epi8(_mm512_add_epi32(q[i], _mm512_set1_epi32(128))));
    }
}

/* The row's scale (max |x| / 127) in *s, and its inputs up to the scalar
 * tail's (returned). */
static size_t prepare_vec(uint8_t *a, const float *x, size_t n, float *s) {
    size_t i = 0;
    int path = attn_int8_path(), wide = path == ATTN_INT8_AMX || path == ATTN_INT8_AVX512;
    if (path == ATTN_INT8_NONE) { /* every int8 path has AVX2 */
        *s = max_abs(x, n) / 127.0f;
        return 0;
    }
    *s = (wide ? max_abs16(x, n) : max_abs8(x, n)) / 127.0f;
    if (!(*s > 0.0f)) return 0;
    float inv = 1.0f / *s;
    for (; wide && i + 64 <= n; i += 64)
        prepare64(a + i, x + i, *s, inv);
    for (; i + 32 <= n; i += 32)
        prepare32(a + i, x + i, *s, inv);
    return i;
}

void attn_int8_prepare_row(uint8_t *dst, const float *x, int K) {
    size_t n = (size_t)K;
    float s;
    uint8_t *a = dst + ATTN_INT8_HEAD;
    size_t i = prepare_vec(a, x, n, &s);
    memset(dst, 0, ATTN_INT8_HEAD);
    memcpy(dst, &s, sizeof s);
    for (; i < n; i++)
        a[i] = (uint8_t)((s > 0.0f ? q_of(x[i], s) : 0) + 128);
    memset(a + n, 128, attn_int8_row_bytes(K) - ATTN_INT8_HEAD - n); /* a~ = 0 */
}

static float row_scale(const uint8_t *row) {
    float s;
    memcpy(&s, row, sizeof s);
    return s;
}

/* ---- packing ------------------------------------------------------------------- */

int attn_packed_int8_init(attn_packed_int8 *pw, const float *W, const float *bias, int N, int K) {
    memset(pw, 0, sizeof *pw);
    int panels = (N + NP - 1) / NP, kq = (K + KS - 1) / KS * KS / 4;
    size_t n = (size_t)panels * kq * 4 * NP, cols = (size_t)panels * NP;
    int8_t *q = malloc((size_t)K + 1);
    char *mem = attn_alloc_big(n + cols * 12 + 64);
    if (!mem || !q) {
        free(mem);
        free(q);
        return -1;
    }
    pw->p = (int8_t *)mem;
    memset(pw->p, 0, n);
    pw->scale = (float *)(mem + n);
    pw->fix = (int32_t *)(pw->scale + cols);
    pw->bias16 = (float *)(pw->fix + cols);
    for (size_t c = 0; c < cols; c++) {
        int col = (int)c;
        pw->scale[c] = col < N ? attn_int8_quantize(q, W + (size_t)col * K, (size_t)K) : 0.0f;
        int32_t sum = 0;
        for (int k = 0; col < N && k < K; k++) {
            pw->p[(((size_t)(col / NP) * kq + (size_t)(k / 4)) * NP + (size_t)(col % NP)) * 4 +
                  (size_t)(k % 4)] = q[k];
            sum += q[k];
        }
        pw->fix[c] = 128 * sum;
        pw->bias16[c] = col < N ? bias[col] : 0.0f;
    }
    free(q);
    pw->N = N;
    pw->K = K;
    pw->panels = panels;
    pw->kq = kq;
    pw->bias = bias;
    return 0;
}

void attn_packed_int8_free(attn_packed_int8 *pw) {
    if (!pw) return;
    free(pw->p);
    memset(pw, 0, sizeof *pw);
}

/* ---- the formula, plainly -------------------------------------------------------- */

static float epilogue1(int32_t acc, float sa, float sw, float b) {
    return fmaf((float)acc, sa * sw, b);
}

void gemm_int8_ref(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                   size_t r0, size_t r1, int c0, int c1) {
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = A + r * lda;
        for (int n = c0; n < c1; n++) {
            int32_t acc = 0;
            for (int k = 0; k < pw->K; k++)
                acc += ((int32_t)row[ATTN_INT8_HEAD + k] - 128) * attn_packed_int8_at(pw, n, k);
            C[r * ldc + n] = epilogue1(acc, row_scale(row), pw->scale[n], pw->bias16[n]);
        }
    }
}

/* ---- AVX512-VNNI: MR rows x 2 panels ------------------------------------------------ */

typedef struct {
    float *C; /* row 0, column of panel 0 */
    size_t ldc;
    const uint8_t *A; /* prepared row 0 */
    size_t lda;
    const int8_t *P0, *P1; /* the panels */
    int n0;                /* first column of panel 0 */
    __mmask16 m0, m1;      /* valid columns (m1 = 0: no second panel) */
    int groups;            /* groups of four inputs */
    const attn_packed_int8 *pw;
} k512_args;

V512 INLINE void epilogue512(float *C, __m512i acc, float sa, const attn_packed_int8 *pw, int n0,
                             __mmask16 m) {
    acc = _mm512_sub_epi32(acc, _mm512_loadu_si512(pw->fix + n0));
    __m512 s = _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_loadu_ps(pw->scale + n0));
    __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, _mm512_loadu_ps(pw->bias16 + n0));
    _mm512_mask_storeu_ps(C, m, y);
}

V512 INLINE void k512_body(const k512_args *a, const int MR) {
    __m512i c[12][2];
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
        c[r][0] = c[r][1] = _mm512_setzero_si512();
        ATTN_OWN_REGISTER(c[r][0]);
        ATTN_OWN_REGISTER(c[r][1]);
    }
    const uint8_t *A = a->A + ATTN_INT8_HEAD;
    for (int g = 0; g < a->groups; g++) {
        attn_prefetch_out(a->C, a->ldc, g, MR, a->m1 != 0);
        __m512i w0 = _mm512_load_si512(a->P0 + (size_t)g * 4 * NP);
        __m512i w1 = _mm512_load_si512(a->P1 + (size_t)g * 4 * NP);
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
            int32_t four;
            memcpy(&four, A + r * a->lda + 4 * g, sizeof four);
            __m512i x = _mm512_set1_epi32(four);
            c[r][0] = _mm512_dpbusd_epi32(c[r][0], x, w0);
            c[r][1] = _mm512_dpbusd_epi32(c[r][1], x, w1);
        }
    }
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
        float sa = row_scale(a->A + r * a->lda);
        epilogue512(a->C + r * a->ldc, c[r][0], sa, a->pw, a->n0, a->m0);
        if (a->m1) epilogue512(a->C + r * a->ldc + NP, c[r][1], sa, a->pw, a->n0 + NP, a->m1);
    }
}

#define K512_ROWS(R)                                                                               \
    V512 static void k512_##R(const k512_args *a) {                                                \
        k512_body(a, R);                                                                           \
    }
K512_ROWS(1)
K512_ROWS(2)
K512_ROWS(3)
K512_ROWS(4)
K512_ROWS(5)
K512_ROWS(6)
K512_ROWS(7)
K512_ROWS(8)
K512_ROWS(9)
K512_ROWS(10)
K512_ROWS(11)
K512_ROWS(12)
static void (*const k512_rows[13])(const k512_args *) = {NULL,    k512_1,  k512_2, k512_3, k512_4,
                                                         k512_5,  k512_6,  k512_7, k512_8, k512_9,
                                                         k512_10, k512_11, k512_12};

static __mmask16 cols_mask(int left) {
    return left >= NP ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

static void tile512(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                    size_t r0, size_t r1, int j0, int j1) {
    for (int j = j0; j < j1; j += 2) {
        int n0 = j * NP, two = j + 1 < j1;
        k512_args a = {.ldc = ldc, .lda = lda, .n0 = n0, .groups = pw->kq, .pw = pw};
        a.m0 = cols_mask(pw->N - n0);
        a.m1 = two ? cols_mask(pw->N - n0 - NP) : 0;
        a.P0 = pw->p + (size_t)j * pw->kq * 4 * NP;
        a.P1 = two ? a.P0 + (size_t)pw->kq * 4 * NP : a.P0;
        for (size_t r = r0; r < r1; r += 12) {
            a.C = C + r * ldc + n0;
            a.A = A + r * lda;
            k512_rows[r1 - r < 12 ? r1 - r : 12](&a);
        }
    }
}

/* ---- AVX-VNNI: MR rows x 1 panel (two 256-bit halves) ---------------------------------- */

/* The epilogue on 256-bit registers: the same steps, the same bits. */
AVX2 INLINE void epilogue256(float *C, const int32_t *acc, float sa, const attn_packed_int8 *pw,
                             int n0, int nc) {
    for (int h = 0; h < 2 && 8 * h < nc; h++) {
        __m256i v = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(acc + 8 * h)),
                                     _mm256_loadu_si256((const __m256i *)(pw->fix + n0 + 8 * h)));
        __m256 s = _mm256_mul_ps(_mm256_set1_ps(sa), _mm256_loadu_ps(pw->scale + n0 + 8 * h));
        __m256 y =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), s, _mm256_loadu_ps(pw->bias16 + n0 + 8 * h));
        int left = nc - 8 * h;
        if (left >= 8)
            _mm256_storeu_ps(C + 8 * h, y);
        else
            _mm256_maskstore_ps(C + 8 * h,
                                _mm256_cmpgt_epi32(_mm256_set1_epi32(left),
                                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                y);
    }
}

/* MR rows (a constant once inlined, at most 4: eight sums, two panel halves
 * and a broadcast fit the sixteen registers) x one panel's two halves. */
#define K256_BODY(ATTR, DP)                                                                        \
    ATTR INLINE void k256_body_##DP(float *C, size_t ldc, const uint8_t *A, size_t lda,            \
                                    const int8_t *P, const attn_packed_int8 *pw, int n0, int nc,   \
                                    const int MR) {                                                \
        __m256i c[4][2];                                                                           \
        _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) {                                     \
            c[r][0] = c[r][1] = _mm256_setzero_si256();                                            \
            ATTN_OWN_REGISTER(c[r][0]);                                                            \
            ATTN_OWN_REGISTER(c[r][1]);                                                            \
        }                                                                                          \
        for (int g = 0; g < pw->kq; g++) {                                                         \
            __m256i w0 = _mm256_load_si256((const __m256i *)(P + (size_t)g * 4 * NP));             \
            __m256i w1 = _mm256_load_si256((const __m256i *)(P + (size_t)g * 4 * NP + 32));        \
            _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) {                                 \
                int32_t four;                                                                      \
                memcpy(&four, A + ATTN_INT8_HEAD + r * lda + 4 * g, sizeof four);                  \
                __m256i x = _mm256_set1_epi32(four);                                               \
                c[r][0] = DP(c[r][0], x, w0);                                                      \
                c[r][1] = DP(c[r][1], x, w1);                                                      \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) {                                     \
            int32_t acc[NP];                                                                       \
            _mm256_storeu_si256((__m256i *)acc, c[r][0]);                                          \
            _mm256_storeu_si256((__m256i *)(acc + 8), c[r][1]);                                    \
            epilogue256(C + r * ldc, acc, row_scale(A + r * lda), pw, n0, nc);                     \
        }                                                                                          \
    }                                                                                              \
    ATTR static void k256_##DP(float *C, size_t ldc, const uint8_t *A, size_t lda,                 \
                               const int8_t *P, const attn_packed_int8 *pw, int n0, int nc,        \
                               int MR) {                                                           \
        switch (MR) {                                                                              \
        case 4:                                                                                    \
            k256_body_##DP(C, ldc, A, lda, P, pw, n0, nc, 4);                                      \
            break;                                                                                 \
        case 3:                                                                                    \
            k256_body_##DP(C, ldc, A, lda, P, pw, n0, nc, 3);                                      \
            break;                                                                                 \
        case 2:                                                                                    \
            k256_body_##DP(C, ldc, A, lda, P, pw, n0, nc, 2);                                      \
            break;                                                                                 \
        default:                                                                                   \
            k256_body_##DP(C, ldc, A, lda, P, pw, n0, nc, 1);                                      \
            break;                                                                                 \
        }                                                                                          \
    }
K256_BODY(VEX, _mm256_dpbusd_avx_epi32)
K256_BODY(EVEX256, _mm256_dpbusd_epi32)

static void tile256(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                    size_t r0, size_t r1, int j0, int j1) {
    int vex = attn_int8_vex();
    for (int j = j0; j < j1; j++) {
        int n0 = j * NP, nc = pw->N - n0 < NP ? pw->N - n0 : NP;
        const int8_t *P = pw->p + (size_t)j * pw->kq * 4 * NP;
        for (size_t r = r0; r < r1; r += 4) {
            int mr = (int)(r1 - r < 4 ? r1 - r : 4);
            if (vex)
                k256__mm256_dpbusd_avx_epi32(C + r * ldc + n0, ldc, A + r * lda, lda, P, pw, n0, nc,
                                             mr);
            else
                k256__mm256_dpbusd_epi32(C + r * ldc + n0, ldc, A + r * lda, lda, P, pw, n0, nc,
                                         mr);
        }
    }
}

/* ---- AMX-INT8: 32 (or 16) rows x 2 panels ---------------------------------------------- */

/* Tiles 0-3 the int32 sums (rows 0-15 and 16-31 by panel 0 and 1), 4 and 5
 * the rows' inputs, 6 and 7 the panels'. stage (4, 16, 16) int32. The sums
 * start from zeros: started from -fix (a tile load at row stride 0 of a
 * row just stored) they took a fifth longer (2048 x 2304 x 768: 7.0 ms
 * against 5.8), the load waiting on those stores. */
AMX static void amx_sums(const uint8_t *A, size_t lda, const int8_t *P0, const int8_t *P1,
                         int chunks, int two_rows, int32_t *stage) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint8_t *A1 = A + 16 * lda;
    for (int c = 0; c < chunks; c++) {
        _tile_loadd(4, A + (size_t)c * KS, lda);
        _tile_loadd(6, P0 + (size_t)c * KS * NP, 64);
        _tile_loadd(7, P1 + (size_t)c * KS * NP, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        if (two_rows) {
            _tile_loadd(5, A1 + (size_t)c * KS, lda);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
    }
    _tile_stored(0, stage, 64);
    _tile_stored(1, stage + 256, 64);
    if (two_rows) {
        _tile_stored(2, stage + 512, 64);
        _tile_stored(3, stage + 768, 64);
    }
}

/* The staged sums of nr rows x the pair's panels into C (one or two
 * panels): epilogue512's steps, row by row (C's rows two lines at a time),
 * a pair's fix-ups, scales and biases loaded once. sa: the rows' scales. */
AMX static void amx_epilogue(float *C, size_t ldc, const float *sa, const attn_packed_int8 *pw,
                             const int32_t *stage, int nr, int j, int two) {
    int n0 = j * NP;
    __mmask16 m0 = cols_mask(pw->N - n0), m1 = two ? cols_mask(pw->N - n0 - NP) : 0;
    __m512 sw0 = _mm512_loadu_ps(pw->scale + n0), b0 = _mm512_loadu_ps(pw->bias16 + n0);
    __m512 sw1 = _mm512_loadu_ps(pw->scale + n0 + NP), b1 = _mm512_loadu_ps(pw->bias16 + n0 + NP);
    __m512i f0 = _mm512_loadu_si512(pw->fix + n0), f1 = _mm512_loadu_si512(pw->fix + n0 + NP);
    for (int r = 0; r < nr; r++) {
        const int32_t *st = stage + (r / 16 * 2) * 256 + (r % 16) * NP;
        float *c = C + (size_t)r * ldc + n0;
        __m512 a = _mm512_set1_ps(sa[r]);
        __m512 y0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(st), f0)),
                                    _mm512_mul_ps(a, sw0), b0);
        _mm512_mask_storeu_ps(c, m0, y0);
        if (m1) {
            __m512 y1 = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(st + 256), f1)),
                _mm512_mul_ps(a, sw1), b1);
            _mm512_mask_storeu_ps(c + NP, m1, y1);
        }
    }
}

enum { AMX_BAND = 256 }; /* rows whose scales are read at once */

/* Bands of up to AMX_BAND rows, whose scales (each on a line of its own,
 * which the tiles do not load) are read once; in each, row block of 32 by
 * row block, every panel pair: a block's inputs stay in the L1 cache while
 * the pairs' weights stream through as contiguous 1 KiB tiles, which the
 * prefetchers follow (the other way round, the inputs' strided tiles
 * streamed, and 2048 x 2304 x 768 took a third longer). */
static void tile_amx(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                     size_t r0, size_t r1, int j0, int j1) {
    int32_t stage[4 * 256] __attribute__((aligned(64)));
    float sa[AMX_BAND];
    attn_amx_begin();
    for (size_t b0 = r0; b0 < r1; b0 += AMX_BAND) {
        size_t b1 = r1 - b0 < AMX_BAND ? r1 : b0 + AMX_BAND;
        for (size_t r = b0; r < b1; r++)
            sa[r - b0] = row_scale(A + r * lda);
        for (size_t rb = b0; rb < b1; rb += 32) {
            int nr = (int)(b1 - rb < 32 ? b1 - rb : 32);
            for (int j = j0; j < j1; j += 2) {
                int two = j + 1 < j1;
                const int8_t *P0 = pw->p + (size_t)j * pw->kq * 4 * NP;
                const int8_t *P1 = two ? P0 + (size_t)pw->kq * 4 * NP : P0;
                amx_sums(A + rb * lda + ATTN_INT8_HEAD, lda, P0, P1, pw->kq * 4 / KS, nr > 16,
                         stage);
                amx_epilogue(C + rb * ldc, ldc, sa + (rb - b0), pw, stage, nr, j, two);
            }
        }
    }
    attn_amx_end();
}

/* ---- dispatch ------------------------------------------------------------------------ */

void gemm_int8_tile(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                    size_t r0, size_t r1, int j0, int j1) {
    if (j1 > pw->panels) j1 = pw->panels;
    if (j0 >= j1 || r0 >= r1) return;
    switch (attn_int8_path()) {
    case ATTN_INT8_AMX:
        tile_amx(C, ldc, A, lda, pw, r0, r1, j0, j1);
        break;
    case ATTN_INT8_AVX512:
        tile512(C, ldc, A, lda, pw, r0, r1, j0, j1);
        break;
    case ATTN_INT8_AVX:
        tile256(C, ldc, A, lda, pw, r0, r1, j0, j1);
        break;
    default:
        gemm_int8_ref(C, ldc, A, lda, pw, r0, r1, j0 * NP, j1 * NP < pw->N ? j1 * NP : pw->N);
        break;
    }
}
