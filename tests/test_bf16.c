/* test_bf16.c - Check suite for the bf16 kernels (core/kernels/block_bf16.h).
 *
 * Every test runs each path the CPU has: AMX-BF16, AVX512-BF16 (twice: on
 * VDPBF16PS, and with its products on FMAs, core/kernels/bf16_fma.h), and
 * the plain loops of a CPU with neither (forced with attn_bf16_force); a
 * path the CPU lacks is skipped with a line that says so. Groups:
 *   rounding   tests/data/golden/bf16/rounding.json (tests/gen_golden_bf16.py:
 *              ties, NaN, infinities, subnormals, random patterns) through the
 *              scalar rounding, the portable loop and each path's vector
 *              code; a million random patterns give the same bits on all.
 *   gemm       golden products: the "exact" cases bit for bit (their sums are
 *              exact in any order), the others within the bound below; random
 *              ragged shapes (both K tails, odd panels, K blocks) against a
 *              float64 sum; writes stay in their rows and columns; a row's
 *              bits do not depend on the call's rows or panels.
 *   attention  golden blocks (every mask, hidden rows, widths 32..256,
 *              grouped heads, a decoding step) within the file's bound, in
 *              calls of every size; random shapes against a float64 model
 *              of the same formula and bound; the reference too.
 *   layout     the page layout of bf16.h, token by token, packed, and as rows.
 *   fma bits   the GEMM and the block on FMAs give VDPBF16PS's bits (memcmp),
 *              at unit scale and where its flushes of denormals decide.
 *
 * Bounds, and why they are tight (fp32 accumulation order only):
 *   gemm: every path sums K+1 terms (bias and exact bf16 x bf16 products) in
 *   fp32, in its own order; each addition rounds once, by at most 2^-23 of a
 *   partial sum (2^-24 to nearest; 2^-23 covers a unit that truncates), and
 *   a partial sum is at most sum|terms|. So |c - exact| <= (K+1) 2^-23
 *   sum|terms|. A kernel that skipped or truncated the rounding of A would
 *   miss it on the unit cases (K <= 70: its error is about 2^-9
 *   sum|terms| / sqrt(K), 27x the bound), and cannot match the exact cases.
 *   attention: the bound of tests/gen_golden_bf16.py (bound()), rebuilt here
 *   for random cases by model_row(): fp32 sums of the scores, the row sum
 *   and P V in any order, the 2^t polynomial (4e-7), and one bf16 ulp of a
 *   probability that lies within that error of a rounding tie. The generator
 *   checks that dropping any one rounding (q, k and v, P, or q truncated)
 *   exceeds it on thousands of outputs.
 * ATTND_GOLDEN_DIR overrides the golden folder (default tests/data/golden;
 * the files are in its bf16/ folder).
 */
#include "../core/kernels/bf16_fma.h"
#include "../core/kernels/block_bf16.h"
#include "../core/kernels/gemm_bf16.h"
#include "../core/kernels/kv_pages.h"
#include "../core/platform/cpu.h"
#include "../core/prim/bf16.h"

#include "check_run.h"
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* For loops over elements: Check's ck_assert records its location on every
 * call, even a passing one, which is slow over millions of elements. */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

#define U (1.0 / 16777216.0) /* unit roundoff of float32 */
#define E_EXP 4e-7           /* the kernels' 2^t, relative (bf16_attn.c: 1.8e-7 measured) */
static const float LOG2E = 1.44269504088896341f;

/* AVX512-BF16 twice: with VDPBF16PS, and with its products on FMAs
 * (core/kernels/bf16_fma.h), whichever this CPU would choose. */
static const int PATHS[] = {ATTN_BF16_NONE, ATTN_BF16_AVX512, ATTN_BF16_AVX512, ATTN_BF16_AMX};
static const int ON_FMA[] = {0, 0, 1, 0};
#define NPATHS 4
static const char *const PATH_CPU[] = {"plain loops", "AVX512-BF16", "AVX512-BF16 on FMAs",
                                       "AMX-BF16"};

/* Largest ratio |difference| / bound seen, printed by the tests. */
static double g_worst;

/* ------------------------------------------------------------ helpers */

/* The suite's own stream, not test_rand.h's: its random cases are the
 * inputs the bf16 kernels' bounds were set on, kept draw for draw. */
static uint32_t g_seed = 2025;

static uint32_t rnd(void) {
    g_seed = g_seed * 1664525u + 1013904223u;
    return g_seed;
}

static float frand(void) { /* uniform in [-1, 1) */
    return (float)(rnd() >> 8) / 8388608.0f - 1.0f;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    ck_assert_msg(p != NULL, "out of memory");
    return p;
}

static void *xaligned(size_t bytes) {
    void *p = NULL;
    ck_assert_msg(posix_memalign(&p, 64, bytes ? bytes : 64) == 0, "out of memory");
    return p;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double rb(float x) { /* x rounded to bf16, widened */
    return attn_bf16_to_f32(attn_bf16_of_ftz(x));
}

/* Every path back to what the CPU chooses. */
static void paths_reset(void) {
    attn_bf16_force(-1);
    attn_bf16_fma_force(-1);
}

/* Forces PATHS[i] when the CPU has it (returns 1); else says so (returns 0). */
static int use_path(int i, const char *test) {
    if (PATHS[i] > attn_bf16_level()) {
        printf("%s: %s not on this CPU: its kernels were not run\n", test, PATH_CPU[i]);
        return 0;
    }
    attn_bf16_force(PATHS[i]);
    attn_bf16_fma_force(ON_FMA[i]);
    ck_assert_int_eq(attn_bf16_path(), PATHS[i]);
    return 1;
}

static void check_within(double got, double want, double tol, const char *what, size_t at) {
    double d = fabs(got - want);
    REQUIRE(d <= tol, "%s: element %zu: %.9g, want %.9g, bound %.3g", what, at, got, want, tol);
    if (tol > 0 && d / tol > g_worst) g_worst = d / tol;
}

/* ------------------------------------------------------------ golden files */

static json_t *load_golden(const char *name) {
    const char *dir = getenv("ATTND_GOLDEN_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/bf16/%s", dir && *dir ? dir : "tests/data/golden", name);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    ck_assert_msg(j != NULL, "%s: %s (make them with tests/gen_golden_bf16.py)", path, e.text);
    json_t *cases = json_object_get(j, "cases");
    ck_assert_msg(json_is_array(cases) && json_array_size(cases) > 0, "%s: no cases", path);
    return j;
}

/* A flat array of numbers ("-inf" for minus infinity), or NULL for null. */
static float *json_floats(const json_t *o, const char *key, size_t count) {
    const json_t *a = json_object_get(o, key);
    if (json_is_null(a)) return NULL;
    ck_assert_msg(json_is_array(a) && json_array_size(a) == count, "%s: want %zu values", key,
                  count);
    float *p = xcalloc(count, sizeof(float));
    for (size_t i = 0; i < count; i++) {
        const json_t *x = json_array_get(a, i);
        int ninf = json_is_string(x) && strcmp(json_string_value(x), "-inf") == 0;
        REQUIRE(json_is_number(x) || ninf, "%s[%zu]: not a number", key, i);
        p[i] = ninf ? -INFINITY : (float)json_number_value(x);
    }
    return p;
}

static uint8_t *json_bools(const json_t *o, const char *key, size_t count) {
    const json_t *a = json_object_get(o, key);
    if (json_is_null(a)) return NULL;
    ck_assert_msg(json_is_array(a) && json_array_size(a) == count, "%s: want %zu", key, count);
    uint8_t *p = xcalloc(count, 1);
    for (size_t i = 0; i < count; i++)
        p[i] = json_is_true(json_array_get(a, i));
    return p;
}

static int json_int(const json_t *o, const char *key) {
    const json_t *x = json_object_get(o, key);
    ck_assert_msg(json_is_integer(x) || json_is_boolean(x), "%s: not an integer", key);
    return json_is_boolean(x) ? json_is_true(x) : (int)json_integer_value(x);
}

/* ------------------------------------------------------------ rounding */

/* dst = bf16 of src (n) on path p's vector code (the portable loop for NONE). */
static void round_on(int p, attn_bf16 *dst, const float *src, size_t n) {
    if (p == ATTN_BF16_NONE) {
        attn_bf16_round_portable(dst, src, n);
        return;
    }
    attn_bf16_round(dst, src, n);
}

START_TEST(test_rounding_golden) {
    json_t *j = load_golden("rounding.json");
    const json_t *cases = json_object_get(j, "cases");
    size_t n = json_array_size(cases);
    float *src = xcalloc(n, sizeof(float));
    attn_bf16 *want = xcalloc(n, sizeof(attn_bf16)), *got = xcalloc(n + 1, sizeof(attn_bf16));
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(cases, i);
        src[i] = bits_f32((uint32_t)json_integer_value(json_array_get(c, 0)));
        want[i] = (attn_bf16)json_integer_value(json_array_get(c, 1));
        attn_bf16 b = attn_bf16_of_ftz(src[i]);
        REQUIRE(b == want[i], "%#010x (%s): %#06x, want %#06x", f32_bits(src[i]),
                json_string_value(json_array_get(c, 2)), b, want[i]);
    }
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(p, "rounding")) continue;
        for (size_t len = 1; len <= 70; len++) /* every tail of the vector loops */
            for (size_t at = 0; at + len <= n; at += len * 7) {
                got[len] = 0x1234; /* a sentinel past the end */
                round_on(PATHS[p], got, src + at, len);
                REQUIRE(memcmp(got, want + at, len * sizeof(attn_bf16)) == 0 && got[len] == 0x1234,
                        "%s: %zu values from %zu", PATH_CPU[p], len, at);
            }
        round_on(PATHS[p], got, src, n);
        for (size_t i = 0; i < n; i++)
            REQUIRE(got[i] == want[i], "%s: %#010x: %#06x, want %#06x", PATH_CPU[p],
                    f32_bits(src[i]), got[i], want[i]);
    }
    paths_reset();
    free(src);
    free(want);
    free(got);
    json_decref(j);
}
END_TEST

/* A million random bit patterns: every path gives the scalar rule's bits,
 * and widening back is exact. */
START_TEST(test_rounding_random) {
    enum { N = 1 << 20 };
    float *src = xcalloc(N, sizeof(float)), *back = xcalloc(N, sizeof(float));
    attn_bf16 *want = xcalloc(N, sizeof(attn_bf16)), *got = xcalloc(N, sizeof(attn_bf16));
    for (size_t i = 0; i < N; i++) {
        uint32_t u = rnd();
        if (i % 8 == 1) u = (u & 0xFFFF0000u) | 0x8000u; /* ties */
        if (i % 64 == 2) u &= 0x807FFFFFu;               /* subnormals */
        if (i % 64 == 3) u |= 0x7F800000u;               /* infinities and NaNs */
        src[i] = bits_f32(u);
        want[i] = attn_bf16_of_ftz(src[i]);
    }
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(p, "rounding")) continue;
        round_on(PATHS[p], got, src, N);
        for (size_t i = 0; i < N; i++)
            REQUIRE(got[i] == want[i], "%s: %#010x: %#06x, want %#06x", PATH_CPU[p],
                    f32_bits(src[i]), got[i], want[i]);
    }
    paths_reset();
    attn_bf16_widen(back, want, N);
    for (size_t i = 0; i < N; i++) {
        REQUIRE(f32_bits(back[i]) == (uint32_t)want[i] << 16, "widening %#06x", want[i]);
        REQUIRE(attn_bf16_of_ftz(back[i]) == want[i], "%#06x is not kept", want[i]);
    }
    free(src);
    free(back);
    free(want);
    free(got);
}
END_TEST

/* ------------------------------------------------------------ gemm */

typedef struct {
    int M, N, K, exact;
    float *A;     /* (M,K) */
    float *W;     /* (N,K) */
    float *bias;  /* (N) */
    float *C;     /* (M,N) the golden file's answer, or NULL: the float64 sum here */
    double *want; /* (M,N) */
    double *tol;  /* (M,N): 0 for exact cases */
} gcase;

static void gcase_free(gcase *g) {
    free(g->A);
    free(g->W);
    free(g->bias);
    free(g->C);
    free(g->want);
    free(g->tol);
}

/* The expected outputs and their bounds (see the file's head). */
static void gemm_expect(gcase *g) {
    size_t M = (size_t)g->M, N = (size_t)g->N, K = (size_t)g->K;
    g->want = xcalloc(M * N, sizeof(double));
    g->tol = xcalloc(M * N, sizeof(double));
    for (size_t r = 0; r < M; r++)
        for (size_t n = 0; n < N; n++) {
            double sum = g->bias[n], mag = fabs(g->bias[n]);
            for (size_t k = 0; k < K; k++) {
                double t = rb(g->A[r * K + k]) * rb(g->W[n * K + k]);
                sum += t;
                mag += fabs(t);
            }
            double want = g->C ? g->C[r * N + n] : sum; /* a golden C is rounded to fp32 */
            g->want[r * N + n] = want;
            g->tol[r * N + n] = g->exact ? 0 : (K + 1) * 2 * U * mag + (g->C ? U * fabs(want) : 0);
        }
}

/* gemm_bf16_tile_rounded on A rounded once (rows of K rounded up to 32,
 * zeros past K, at a stride past that) gives C (ldc) bit for bit. */
static void gemm_check_rounded(const gcase *g, const attn_packed_bf16 *pw, const float *C,
                               size_t ldc, const char *what) {
    size_t M = (size_t)g->M, N = (size_t)g->N, K = (size_t)g->K;
    size_t ld = (K + 31) / 32 * 32 + 8;
    attn_bf16 *A = xcalloc(M * ld, sizeof(attn_bf16));
    float *C2 = xcalloc(M * ldc, sizeof(float));
    for (size_t r = 0; r < M; r++)
        attn_bf16_round(A + r * ld, g->A + r * K, K);
    gemm_bf16_tile_rounded(C2, ldc, A, ld, pw, 0, M, 0, pw->panels);
    for (size_t r = 0; r < M; r++)
        REQUIRE(memcmp(C2 + r * ldc, C + r * ldc, N * sizeof(float)) == 0,
                "%s: row %zu from rows rounded once differs", what, r);
    free(A);
    free(C2);
}

/* Runs gemm_bf16_tile (ref = 0) or gemm_bf16_ref on every row and column,
 * with A and C at strides wider than K and N, and checks the outputs and
 * that nothing past N was written. */
static void gemm_check(const gcase *g, int ref, const char *what) {
    size_t M = (size_t)g->M, N = (size_t)g->N, K = (size_t)g->K, lda = K + 3, ldc = N + 5;
    float *A = xcalloc(M * lda, sizeof(float)), *C = xcalloc(M * ldc, sizeof(float));
    for (size_t r = 0; r < M; r++)
        memcpy(A + r * lda, g->A + r * K, sizeof(float) * K);
    for (size_t i = 0; i < M * ldc; i++)
        C[i] = bits_f32(0x7FC01234u); /* a NaN no kernel makes */
    attn_packed_bf16 pw;
    ck_assert_int_eq(attn_packed_bf16_init(&pw, g->W, g->bias, g->N, g->K), 0);
    if (ref)
        gemm_bf16_ref(C, ldc, A, lda, &pw, 0, M, 0, g->N);
    else
        gemm_bf16_tile(C, ldc, A, lda, &pw, 0, M, 0, pw.panels);
    for (size_t r = 0; r < M; r++) {
        for (size_t n = 0; n < N; n++)
            check_within(C[r * ldc + n], g->want[r * N + n], g->tol[r * N + n], what, r * N + n);
        for (size_t n = N; n < ldc; n++)
            REQUIRE(f32_bits(C[r * ldc + n]) == 0x7FC01234u, "%s: row %zu col %zu written", what, r,
                    n);
    }
    if (!ref) gemm_check_rounded(g, &pw, C, ldc, what);
    attn_packed_bf16_free(&pw);
    free(A);
    free(C);
}

/* Every path and the reference on one case. */
static void gemm_all_paths(const gcase *g, const char *name) {
    char what[160];
    snprintf(what, sizeof what, "%s (%dx%dx%d) reference", name, g->M, g->N, g->K);
    gemm_check(g, 1, what);
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(p, name)) continue;
        snprintf(what, sizeof what, "%s (%dx%dx%d) %s", name, g->M, g->N, g->K, PATH_CPU[p]);
        gemm_check(g, 0, what);
    }
    paths_reset();
}

START_TEST(test_gemm_golden) {
    json_t *j = load_golden("gemm.json");
    const json_t *cases = json_object_get(j, "cases"), *c;
    size_t i, exact = 0;
    g_worst = 0;
    json_array_foreach(cases, i, c) {
        gcase g = {.M = json_int(c, "M"), .N = json_int(c, "N"), .K = json_int(c, "K")};
        g.exact = json_int(c, "exact");
        size_t M = (size_t)g.M, N = (size_t)g.N, K = (size_t)g.K;
        g.A = json_floats(c, "A", M * K);
        g.W = json_floats(c, "W", N * K);
        g.bias = json_floats(c, "bias", N);
        g.C = json_floats(c, "C", M * N);
        gemm_expect(&g);
        gemm_all_paths(&g, json_string_value(json_object_get(c, "name")));
        exact += (size_t)g.exact;
        gcase_free(&g);
    }
    ck_assert_msg(exact >= 2, "the golden products hold %zu exact cases", exact);
    printf("gemm golden: %zu cases, largest difference %.3f of its bound\n", i, g_worst);
    json_decref(j);
}
END_TEST

/* Ragged shapes against the float64 sum: rows around the kernels' 12, 16
 * and 32; panels odd and even, N past a panel; K tails around 32, and K
 * past the kernels' K blocks (256 and 1024 inputs). */
static const int GEMM_SHAPES[][3] = {
    {1, 1, 1},    {1, 16, 32},   {2, 17, 33},   {12, 31, 31},   {13, 48, 64},
    {16, 33, 95}, {17, 64, 100}, {31, 65, 257}, {32, 250, 40},  {33, 40, 300},
    {45, 7, 513}, {97, 20, 90},  {7, 18, 1100}, {34, 33, 2049}, {200, 300, 64},
};
#define NGEMM ((int)(sizeof(GEMM_SHAPES) / sizeof(GEMM_SHAPES[0])))

static gcase gemm_random(int M, int N, int K) {
    gcase g = {.M = M, .N = N, .K = K};
    g.A = xcalloc((size_t)M * K, sizeof(float));
    g.W = xcalloc((size_t)N * K, sizeof(float));
    g.bias = xcalloc((size_t)N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++)
        g.A[i] = frand() * 2.0f;
    for (size_t i = 0; i < (size_t)N * K; i++)
        g.W[i] = frand() / sqrtf((float)K);
    for (int i = 0; i < N; i++)
        g.bias[i] = frand();
    gemm_expect(&g);
    return g;
}

START_TEST(test_gemm_random) {
    g_worst = 0;
    gcase g = gemm_random(GEMM_SHAPES[_i][0], GEMM_SHAPES[_i][1], GEMM_SHAPES[_i][2]);
    gemm_all_paths(&g, "random");
    printf("gemm %dx%dx%d: largest difference %.3f of its bound\n", g.M, g.N, g.K, g_worst);
    gcase_free(&g);
}
END_TEST

/* gemm_bf16_tile on the current path over every row and panel. */
static float *gemm_out(const gcase *g, const attn_packed_bf16 *pw) {
    float *C = xcalloc((size_t)g->M * g->N, sizeof(float));
    gemm_bf16_tile(C, (size_t)g->N, g->A, (size_t)g->K, pw, 0, (size_t)g->M, 0, pw->panels);
    return C;
}

/* AVX512-BF16's products on FMAs give VDPBF16PS's bits, memcmp, on every
 * random shape at unit scale and with A, W and the bias scaled to 2^-125
 * (products, sums and a bias below fp32's normal range: VDPBF16PS's flushes
 * must be made). */
START_TEST(test_gemm_fma_bits) {
    if (attn_bf16_level() < ATTN_BF16_AVX512) {
        printf("gemm fma bits: AVX512-BF16 not on this CPU: not run\n");
        return;
    }
    int nonzero = 0;
    for (int tiny = 0; tiny < 2; tiny++)
        for (int i = 0; i < NGEMM; i++) {
            gcase g = gemm_random(GEMM_SHAPES[i][0], GEMM_SHAPES[i][1], GEMM_SHAPES[i][2]);
            size_t M = (size_t)g.M, N = (size_t)g.N, K = (size_t)g.K;
            for (size_t j = 0; tiny && j < M * K; j++)
                g.A[j] = ldexpf(g.A[j], -60);
            for (size_t j = 0; tiny && j < N * K; j++)
                g.W[j] = ldexpf(g.W[j], -65);
            for (size_t j = 0; tiny && j < N; j++)
                g.bias[j] = ldexpf(g.bias[j], -126);
            attn_packed_bf16 pw;
            ck_assert_int_eq(attn_packed_bf16_init(&pw, g.W, g.bias, g.N, g.K), 0);
            attn_bf16_force(ATTN_BF16_AVX512);
            attn_bf16_fma_force(0);
            float *vdp = gemm_out(&g, &pw);
            attn_bf16_fma_force(1);
            float *fma = gemm_out(&g, &pw);
            for (size_t j = 0; j < M * N; j++) {
                REQUIRE(memcmp(&vdp[j], &fma[j], sizeof(float)) == 0,
                        "%zux%zux%zu%s: C %zu: %a on VDPBF16PS, %a on FMAs", M, N, K,
                        tiny ? " (tiny)" : "", j, vdp[j], fma[j]);
                nonzero |= tiny && vdp[j] != 0.0f;
            }
            free(vdp);
            free(fma);
            attn_packed_bf16_free(&pw);
            gcase_free(&g);
        }
    ck_assert_msg(nonzero, "the tiny cases gave only zeros: they test nothing");
    paths_reset();
}
END_TEST

/* One path: the whole product in one call, then in calls of other rows and
 * panels, bit for bit (batch invariance), and a call on a part of the rows
 * and panels writes that part alone. */
static void gemm_cuts(int p) {
    enum { M = 70, N = 77, K = 1100, LDC = 80 };
    gcase g = gemm_random(M, N, K);
    attn_packed_bf16 pw;
    ck_assert_int_eq(attn_packed_bf16_init(&pw, g.W, g.bias, N, K), 0);
    float *whole = xcalloc((size_t)M * LDC, sizeof(float)), *C = xcalloc((size_t)M * LDC, 4);
    gemm_bf16_tile(whole, LDC, g.A, K, &pw, 0, M, 0, pw.panels);
    static const int rows[] = {1, 3, 16, 17, 33}, panels[] = {1, 2, 3};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 3; b++) {
            memset(C, 0, sizeof(float) * M * LDC);
            for (int r = 0; r < M; r += rows[a])
                for (int j = 0; j < pw.panels; j += panels[b])
                    gemm_bf16_tile(C, LDC, g.A, K, &pw, r, r + rows[a] < M ? r + rows[a] : M, j,
                                   j + panels[b]);
            for (int r = 0; r < M; r++)
                REQUIRE(memcmp(C + r * LDC, whole + r * LDC, sizeof(float) * N) == 0,
                        "%s: row %d differs in calls of %d rows x %d panels", PATH_CPU[p], r,
                        rows[a], panels[b]);
        }
    for (size_t i = 0; i < (size_t)M * LDC; i++)
        C[i] = bits_f32(0x7FC01234u);
    gemm_bf16_tile(C, LDC, g.A, K, &pw, 5, M - 3, 1, pw.panels - 1);
    for (int r = 0; r < M; r++)
        for (int n = 0; n < LDC; n++) {
            int in = r >= 5 && r < M - 3 && n >= 16 && n < 16 * (pw.panels - 1);
            uint32_t got = f32_bits(C[r * LDC + n]);
            REQUIRE(in ? got == f32_bits(whole[r * LDC + n]) : got == 0x7FC01234u,
                    "%s: rows 5..%d, panels 1..%d: row %d col %d", PATH_CPU[p], M - 3,
                    pw.panels - 1, r, n);
        }
    attn_packed_bf16_free(&pw);
    free(whole);
    free(C);
    gcase_free(&g);
}

START_TEST(test_gemm_cuts) {
    for (int p = 0; p < NPATHS; p++)
        if (use_path(p, "gemm cuts")) gemm_cuts(p);
    paths_reset();
}
END_TEST

/* ------------------------------------------------------------ attention */

enum { G = 2, HEAD = 1 }; /* the pages hold two key/value heads; cases use head 1 */

typedef struct {
    int D, S, L, R, i0, causal;
    float scale;
    float *q;       /* (L, R*D): rows at positions i0.., R heads each */
    float *k, *v;   /* (S, G*D): head HEAD is the case's, the other filler */
    uint8_t *kpm;   /* (S) or NULL */
    uint8_t *mbool; /* (i0+L, S) by position, or NULL */
    float *madd;    /* (i0+L, S) by position, or NULL */
    double *want;   /* (L, R*D) */
    double *tol;    /* (L, R*D) */
    attn_bf16 *kv;  /* the pages of k and v: one element into kv_mem, so not 64-byte aligned */
    attn_bf16 *kv_mem;
    const char *name;
} acase;

static void acase_free(acase *a) {
    free(a->q);
    free(a->k);
    free(a->v);
    free(a->kpm);
    free(a->mbool);
    free(a->madd);
    free(a->want);
    free(a->tol);
    free(a->kv_mem);
}

static void acase_pages(acase *a) {
    size_t n = attn_kv_bf16_elems((size_t)a->S, G, a->D);
    a->kv_mem = xaligned((n + 1) * sizeof(attn_bf16));
    a->kv = a->kv_mem + 1;
    memset(a->kv, 0xFF, n * sizeof(attn_bf16)); /* pack must zero the last page's tail */
    attn_kv_bf16_pack(a->kv, G, a->D, (size_t)a->S, a->k, (size_t)G * a->D, a->v, (size_t)G * a->D);
}

static attn_seq acase_seq(const acase *a) {
    return (attn_seq){.L = a->i0 + a->L,
                      .S = a->S,
                      .causal = a->causal,
                      .key_padding_mask = a->kpm,
                      .attn_mask_bool = a->mbool,
                      .attn_mask_add = a->madd};
}

/* Runs the block (ref = 0) or its reference over every row, in calls of at
 * most `block` positions, with q and out at strides wider than R*D (out = q
 * when `alias`), and checks the outputs against want within tol. */
static void attn_run(const acase *a, int ref, int block, int alias, const char *what) {
    size_t w = (size_t)a->R * a->D, ldq = w + 4, ldo = alias ? ldq : w + 8;
    float *q = xcalloc((size_t)a->L * ldq, sizeof(float));
    float *out = alias ? q : xcalloc((size_t)a->L * ldo, sizeof(float));
    for (int i = 0; i < a->L; i++)
        memcpy(q + i * ldq, a->q + i * w, sizeof(float) * w);
    if (!alias)
        for (size_t i = 0; i < (size_t)a->L * ldo; i++)
            out[i] = NAN;
    void *scratch = xaligned(attn_bf16_scratch_bytes(a->D));
    memset(scratch, 0xFF, attn_bf16_scratch_bytes(a->D)); /* NaNs: nothing may rely on zeros */
    attn_kv_bf16 kv = attn_kv_bf16_head(a->kv, G, a->D, HEAD, a->S);
    attn_seq s = acase_seq(a);
    for (int p0 = 0; p0 < a->L; p0 += block) {
        int n = a->L - p0 < block ? a->L - p0 : block;
        if (ref)
            attn_bf16_block_ref(out + p0 * ldo, ldo, q + p0 * ldq, ldq, &kv, &s, a->i0 + p0, n,
                                a->R, a->D, a->scale);
        else
            attn_bf16_block(out + p0 * ldo, ldo, q + p0 * ldq, ldq, &kv, &s, a->i0 + p0, n, a->R,
                            a->D, a->scale, scratch);
    }
    for (int i = 0; i < a->L; i++)
        for (size_t c = 0; c < w; c++)
            check_within(out[i * ldo + c], a->want[i * w + c], a->tol[i * w + c], what, i * w + c);
    free(scratch);
    if (!alias) free(out);
    free(q);
}

/* The reference once, and every path in calls of every size. */
static void attn_all_paths(const acase *a) {
    char what[200];
    int blocks[] = {a->L, 7, 1}; /* all at once: in passes of ATTN_BF16_ROWS rows when more */
    snprintf(what, sizeof what, "%s reference", a->name);
    attn_run(a, 1, a->L, 0, what);
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(p, a->name)) continue;
        for (int b = 0; b < 3; b++) {
            if (b == 2 && a->L * a->R > 64) continue; /* one position a call: short cases */
            snprintf(what, sizeof what, "%s, %s, calls of %d positions", a->name, PATH_CPU[p],
                     blocks[b]);
            attn_run(a, 0, blocks[b], 0, what);
        }
        snprintf(what, sizeof what, "%s, %s, out = q", a->name, PATH_CPU[p]);
        attn_run(a, 0, a->L, 1, what);
    }
    paths_reset();
}

/* A golden case: its q, k, v (head HEAD of the pages; the other head gets
 * the same keys and values reversed), masks by position, want and tol. */
static acase golden_case(const json_t *c) {
    acase a = {.D = json_int(c, "D"), .S = json_int(c, "S"), .L = json_int(c, "L")};
    a.R = json_int(c, "R");
    a.i0 = json_int(c, "i0");
    a.causal = json_int(c, "causal");
    size_t D = (size_t)a.D, S = (size_t)a.S, L = (size_t)a.L, w = (size_t)a.R * D;
    a.name = json_string_value(json_object_get(c, "name"));
    a.scale = (float)json_number_value(json_object_get(c, "scale"));
    a.q = json_floats(c, "q", L * w);
    float *k = json_floats(c, "k", S * D), *v = json_floats(c, "v", S * D);
    a.k = xcalloc(S * G * D, sizeof(float));
    a.v = xcalloc(S * G * D, sizeof(float));
    for (size_t t = 0; t < S; t++)
        for (size_t g = 0; g < G; g++) {
            size_t from = g == HEAD ? t : S - 1 - t;
            memcpy(a.k + (t * G + g) * D, k + from * D, sizeof(float) * D);
            memcpy(a.v + (t * G + g) * D, v + from * D, sizeof(float) * D);
        }
    a.kpm = json_bools(c, "key_padding_mask", S);
    const char *kind = json_string_value(json_object_get(c, "attn_mask_kind"));
    size_t off = (size_t)a.i0 * S; /* the file's mask rows start at position i0 */
    if (kind && strcmp(kind, "bool") == 0) {
        uint8_t *m = json_bools(c, "attn_mask", L * S);
        a.mbool = xcalloc(off + L * S, 1);
        memcpy(a.mbool + off, m, L * S);
        free(m);
    } else if (kind && strcmp(kind, "float") == 0) {
        float *m = json_floats(c, "attn_mask", L * S);
        a.madd = xcalloc(off + L * S, sizeof(float));
        memcpy(a.madd + off, m, sizeof(float) * L * S);
        free(m);
    }
    float *want = json_floats(c, "out", L * w), *tol = json_floats(c, "tol", L * w);
    a.want = xcalloc(L * w, sizeof(double));
    a.tol = xcalloc(L * w, sizeof(double));
    for (size_t i = 0; i < L * w; i++) {
        a.want[i] = want[i];
        a.tol[i] = tol[i] + (tol[i] > 0 ? U * fabs(want[i]) : 0); /* the file's fp32 rounding */
    }
    free(want);
    free(tol);
    free(k);
    free(v);
    acase_pages(&a);
    return a;
}

START_TEST(test_attention_golden) {
    json_t *j = load_golden("attention.json");
    const json_t *cases = json_object_get(j, "cases"), *c;
    size_t i, hidden = 0;
    g_worst = 0;
    json_array_foreach(cases, i, c) {
        acase a = golden_case(c);
        for (int r = 0; r < a.L * a.R * a.D; r++)
            hidden += a.tol[r] == 0;
        attn_all_paths(&a);
        acase_free(&a);
    }
    ck_assert_msg(hidden > 0, "the golden blocks hold no row with every key hidden");
    printf("attention golden: %zu cases, largest difference %.3f of its bound\n", i, g_worst);
    json_decref(j);
}
END_TEST

/* ---- the float64 model of random cases ---- */

static int hidden_at(const acase *a, int pos, int j) {
    size_t m = (size_t)pos * a->S + (size_t)j;
    return (a->causal && j > pos) || (a->kpm && a->kpm[j]) || (a->mbool && a->mbool[m]) ||
           (a->madd && a->madd[m] == -INFINITY);
}

/* 1 when a relative error `slack` of p could turn bf16(p) the other way. */
static int near_tie(double p, double slack) {
    uint32_t u = f32_bits((float)p) & 0xFFFF0000u;
    double mid = ((double)bits_f32(u) + (double)bits_f32(u + 0x10000u)) / 2;
    return p > 0 && fabs(p - mid) <= slack * p;
}

/* Scores x (S) of the row at pos with rounded query qh, in log2 units, and
 * their error bounds dx; returns the largest visible score. */
static double model_scores(const acase *a, const float *kh, int pos, const double *qh, double *x,
                           double *dx) {
    int D = a->D;
    double gD = D * U / (1 - D * U), m = -INFINITY;
    for (int j = 0; j < a->S; j++) {
        x[j] = -INFINITY;
        if (hidden_at(a, pos, j)) continue;
        double s = 0, mag = 0;
        for (int d = 0; d < D; d++) {
            s += qh[d] * kh[(size_t)j * D + d];
            mag += fabs(qh[d] * kh[(size_t)j * D + d]);
        }
        x[j] = s;
        dx[j] = gD * mag;
        if (a->madd) {
            float am = a->madd[(size_t)pos * a->S + j];
            double ma = (float)((am < -1e30f ? -1e30f : am) * LOG2E);
            x[j] = s + ma;
            dx[j] += U * (fabs(s) + fabs(ma));
        }
        if (x[j] > m) m = x[j];
    }
    return m;
}

/* out and tol (D) of one row: gen_golden_bf16.py's attn_rows and bound(). */
static void model_row(const acase *a, const float *kh, const float *vh, int pos, const double *qh,
                      double *out, double *tol, double *x, double *dx) {
    int D = a->D, S = a->S;
    double m = model_scores(a, kh, pos, qh, x, dx), W[256] = {0}, F[256] = {0};
    double gS = S * U / (1 - S * U), l = 0, pd = 0, c = ceil(m);
    for (int d = 0; d < D; d++)
        out[d] = tol[d] = 0;
    if (m == -INFINITY) return; /* every key hidden: zeros, exactly */
    for (int j = 0; j < S; j++)
        l += x[j] == -INFINITY ? 0 : exp2(x[j] - c);
    for (int j = 0; j < S; j++) {
        double p = x[j] == -INFINITY ? 0 : exp2(x[j] - c);
        if (p == 0) continue;
        double e = log(2.0) * (dx[j] + U * fabs(x[j] - c)) + E_EXP, pr = rb((float)p);
        int flip = near_tie(p, 2 * e + 2 * U);
        pd += p * e;
        for (int d = 0; d < D; d++) {
            double v = vh[(size_t)j * D + d];
            out[d] += pr * v / l;
            W[d] += pr * fabs(v) / l;
            F[d] += flip ? ldexp(p, -7) * fabs(v) / l : 0;
        }
    }
    for (int d = 0; d < D; d++)
        tol[d] = 2 * ((gS + pd / l + 2 * U + gS) * W[d] + F[d]);
}

/* want and tol of a random case from its pages (the layout test holds them
 * to attn_bf16_of_ftz of the inputs). */
static void model_case(acase *a) {
    size_t D = (size_t)a->D, S = (size_t)a->S, w = (size_t)a->R * D;
    float *kh = xcalloc(S * D, sizeof(float)), *vh = xcalloc(S * D, sizeof(float));
    float *krow = xcalloc(G * D, sizeof(float)), *vrow = xcalloc(G * D, sizeof(float));
    for (size_t t = 0; t < S; t++) {
        attn_kv_bf16_get(a->kv, G, a->D, t, krow, vrow);
        memcpy(kh + t * D, krow + HEAD * D, sizeof(float) * D);
        memcpy(vh + t * D, vrow + HEAD * D, sizeof(float) * D);
    }
    double *x = xcalloc(S, sizeof(double)), *dx = xcalloc(S, sizeof(double)), qh[256];
    a->want = xcalloc((size_t)a->L * w, sizeof(double));
    a->tol = xcalloc((size_t)a->L * w, sizeof(double));
    float qs = a->scale * LOG2E;
    for (int i = 0; i < a->L; i++)
        for (int h = 0; h < a->R; h++) {
            for (size_t d = 0; d < D; d++)
                qh[d] = rb(a->q[i * w + h * D + d] * qs);
            model_row(a, kh, vh, a->i0 + i, qh, a->want + i * w + h * D, a->tol + i * w + h * D, x,
                      dx);
        }
    free(kh);
    free(vh);
    free(krow);
    free(vrow);
    free(x);
    free(dx);
}

/* ---- random cases ---- */

/* Shapes, masks and hidden rows: widths 32..256, keys around the pages (32)
 * and key blocks (128), grouped heads (R), a decoding step and a chunk at
 * i0 > 0, more rows than one call takes. Masks keep key 0 an ordinary
 * visible key for every row but the `full` ones, which hide every key. */
static const struct {
    int D, S, L, R, i0, causal, kpm, mbool, madd, full;
} ATTN_SHAPES[] = {
    {32, 1, 1, 1, 0, 0, 0, 0, 0, 0},     {64, 17, 9, 1, 0, 0, 1, 0, 0, 0},
    {64, 128, 128, 1, 0, 1, 0, 0, 0, 0}, {64, 129, 40, 1, 0, 0, 0, 1, 0, 1},
    {96, 300, 70, 2, 0, 0, 0, 0, 1, 2},  {128, 33, 33, 4, 0, 1, 1, 0, 0, 0},
    {160, 64, 20, 1, 0, 0, 1, 1, 1, 1},  {192, 100, 1, 8, 99, 1, 0, 0, 0, 0},
    {224, 45, 12, 1, 0, 0, 0, 0, 0, 0},  {256, 260, 30, 1, 0, 1, 0, 0, 0, 0},
    {64, 700, 300, 2, 0, 1, 0, 0, 1, 0}, {64, 160, 60, 1, 100, 1, 0, 0, 0, 0},
    {32, 513, 17, 16, 0, 0, 1, 0, 0, 0}, {128, 31, 31, 1, 0, 1, 0, 1, 1, 1},
};
#define NATTN ((int)(sizeof(ATTN_SHAPES) / sizeof(ATTN_SHAPES[0])))

static void random_masks(acase *a, int kpm, int mbool, int madd, int full) {
    size_t S = (size_t)a->S, rows = (size_t)(a->i0 + a->L);
    if (kpm) {
        a->kpm = xcalloc(S, 1);
        for (size_t j = 1; j < S; j++)
            a->kpm[j] = rnd() % 5 == 0;
    }
    if (mbool) {
        a->mbool = xcalloc(rows * S, 1);
        for (size_t i = 0; i < rows * S; i++)
            a->mbool[i] = i % S != 0 && rnd() % 5 == 0;
    }
    if (madd) {
        a->madd = xcalloc(rows * S, sizeof(float));
        for (size_t i = 0; i < rows * S; i++) {
            uint32_t r = rnd() % 20;
            a->madd[i] = i % S == 0 ? frand() : r == 0 ? -INFINITY : r == 1 ? -1e9f : frand() * 4;
        }
    }
    for (int f = 0; f < full; f++) { /* positions i0 + 2f + 1: every key hidden */
        size_t at = (size_t)(a->i0 + 2 * f + 1) * S;
        for (size_t j = 0; j < S; j++) {
            if (a->mbool) a->mbool[at + j] = 1;
            if (!a->mbool) a->madd[at + j] = -INFINITY;
        }
    }
}

static acase random_case(int i) {
    acase a = {.D = ATTN_SHAPES[i].D, .S = ATTN_SHAPES[i].S, .L = ATTN_SHAPES[i].L};
    a.R = ATTN_SHAPES[i].R;
    a.i0 = ATTN_SHAPES[i].i0;
    a.causal = ATTN_SHAPES[i].causal;
    size_t w = (size_t)a.R * a.D, S = (size_t)a.S;
    a.name = "random";
    a.scale = 1.0f / sqrtf((float)a.D);
    a.q = xcalloc((size_t)a.L * w, sizeof(float));
    a.k = xcalloc(S * G * a.D, sizeof(float));
    a.v = xcalloc(S * G * a.D, sizeof(float));
    for (size_t j = 0; j < (size_t)a.L * w; j++)
        a.q[j] = frand() * 3.0f;
    for (size_t j = 0; j < S * G * a.D; j++) {
        a.k[j] = frand() * 3.0f;
        a.v[j] = frand();
    }
    random_masks(&a, ATTN_SHAPES[i].kpm, ATTN_SHAPES[i].mbool, ATTN_SHAPES[i].madd,
                 ATTN_SHAPES[i].full);
    acase_pages(&a);
    model_case(&a);
    return a;
}

START_TEST(test_attention_random) {
    g_worst = 0;
    acase a = random_case(_i);
    attn_all_paths(&a);
    printf("attention D=%d S=%d L=%d R=%d i0=%d%s: largest difference %.3f of its bound\n", a.D,
           a.S, a.L, a.R, a.i0, a.causal ? " causal" : "", g_worst);
    acase_free(&a);
}
END_TEST

/* A row whose keys all carry torch's finfo.min as additive mask: uniform
 * weights over them, as in torch (the value counts as -1e30); the other
 * rows as the model says. */
START_TEST(test_attention_finfo_row) {
    acase a = random_case(1); /* D=64, S=17, L=9 */
    size_t S = (size_t)a.S, D = (size_t)a.D;
    a.madd = xcalloc((size_t)(a.i0 + a.L) * S, sizeof(float));
    for (size_t j = 0; j < S; j++)
        a.madd[3 * S + j] = -3.4028235e38f;
    free(a.kpm); /* every key visible in row 3 */
    a.kpm = NULL;
    free(a.want);
    free(a.tol);
    model_case(&a);
    float *krow = xcalloc(G * D, sizeof(float)), *vrow = xcalloc(G * D, sizeof(float));
    for (size_t d = 0; d < D; d++) {
        double mean = 0, mag = 0;
        for (size_t t = 0; t < S; t++) {
            attn_kv_bf16_get(a.kv, G, a.D, t, krow, vrow);
            mean += vrow[HEAD * D + d] / (double)S;
            mag += fabs(vrow[HEAD * D + d]) / (double)S;
        }
        a.want[3 * D + d] = mean;
        a.tol[3 * D + d] = 2 * (S + 2) * U * mag;
    }
    a.name = "finfo.min row";
    attn_all_paths(&a);
    free(krow);
    free(vrow);
    acase_free(&a);
}
END_TEST

/* ------------------------------------------------------------ layout */

/* A cache of S tokens (GL heads of width D, packed from k and v) as rows
 * (attn_kv16_to_rows: token t's keys then values, the bits pack rounded)
 * and back (attn_kv16_from_rows: the very pages, zeros past S included,
 * whatever the buffer held). */
static void kv_rows(const attn_bf16 *packed, const float *k, const float *v, int D, int S) {
    enum { GL = 3 };
    size_t n = attn_kv_bf16_elems((size_t)S, GL, D), gd = (size_t)GL * D;
    uint16_t *rows = xcalloc((size_t)S * 2 * gd, sizeof(uint16_t));
    attn_bf16 *back = xaligned(n * 2);
    attn_kv16_to_rows(packed, GL, D, (size_t)S, rows);
    for (size_t t = 0; t < (size_t)S; t++)
        for (size_t i = 0; i < gd; i++)
            REQUIRE(rows[t * 2 * gd + i] == attn_bf16_of_ftz(k[t * gd + i]) &&
                        rows[t * 2 * gd + gd + i] == attn_bf16_of_ftz(v[t * gd + i]),
                    "to_rows: D=%d token %zu value %zu", D, t, i);
    memset(back, 0xCD, n * 2);
    attn_kv16_from_rows(back, GL, D, (size_t)S, rows);
    ck_assert_msg(memcmp(back, packed, n * 2) == 0, "from_rows: D=%d: not the packed pages", D);
    free(rows);
    free(back);
}

/* The page layout as bf16.h writes it, index by index; get returns what put
 * wrote; pack (on path p: the vector code, or the portable loop for NONE
 * and for widths that are not a multiple of 32) equals put token by token,
 * with zeros past the last token. */
static void kv_layout(int D, int p) {
    enum { GL = 3, S = 70 };
    size_t n = attn_kv_bf16_elems(S, GL, D), page = (size_t)GL * 64 * D;
    float *k = xcalloc(S * GL * D, sizeof(float)), *v = xcalloc(S * GL * D, sizeof(float));
    float *kb = xcalloc(GL * D, sizeof(float)), *vb = xcalloc(GL * D, sizeof(float));
    for (size_t i = 0; i < (size_t)S * GL * D; i++) {
        k[i] = frand() * 5;
        v[i] = frand() * 5;
    }
    attn_bf16 *packed = xaligned(n * 2), *put = xaligned(n * 2);
    memset(packed, 0xAB, n * 2);
    memset(put, 0, n * 2);
    attn_kv_bf16_pack(packed, GL, D, S, k, GL * D, v, GL * D);
    for (size_t t = 0; t < S; t++)
        attn_kv_bf16_put(put, GL, D, t, k + t * GL * D, v + t * GL * D);
    ck_assert_msg(memcmp(packed, put, n * 2) == 0, "%s, D=%d: pack differs from put", PATH_CPU[p],
                  D);
    for (size_t t = 0; t < 3 * ATTN_KV_PAGE; t++)
        for (int g = 0; g < GL; g++)
            for (int d = 0; d < D; d++) {
                const attn_bf16 *h = packed + t / 32 * page + (size_t)g * 64 * D;
                size_t s = t % 32, kat = ((s / 16 * (D / 2) + d / 2) * 16 + s % 16) * 2 + d % 2;
                size_t vat = 32 * D + ((s / 2) * D + d) * 2 + s % 2, x = (t * GL + g) * D + d;
                attn_bf16 wk = t < S ? attn_bf16_of_ftz(k[x]) : 0,
                          wv = t < S ? attn_bf16_of_ftz(v[x]) : 0;
                REQUIRE(h[kat] == wk && h[vat] == wv, "D=%d token %zu head %d width %d", D, t, g,
                        d);
            }
    for (size_t t = 0; t < S; t++) {
        attn_kv_bf16_get(packed, GL, D, t, kb, vb);
        for (int i = 0; i < GL * D; i++)
            REQUIRE(kb[i] == (float)rb(k[t * GL * D + i]) && vb[i] == (float)rb(v[t * GL * D + i]),
                    "get: D=%d token %zu value %d", D, t, i);
    }
    kv_rows(packed, k, v, D, S);
    free(k);
    free(v);
    free(kb);
    free(vb);
    free(packed);
    free(put);
}

START_TEST(test_kv_layout) {
    size_t page = (size_t)3 * 64 * 64;
    ck_assert_uint_eq(attn_kv_bf16_elems(70, 3, 64), 3 * page);
    ck_assert_uint_eq(attn_kv_bf16_elems(0, 3, 64), 0);
    ck_assert_uint_eq(attn_kv_bf16_elems(32, 3, 64), page);
    ck_assert_uint_eq(attn_kv_bf16_elems(33, 3, 64), 2 * page);
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(p, "layout")) continue;
        kv_layout(64, p);
        kv_layout(96, p);
        kv_layout(48, p);
    }
    paths_reset();
}
END_TEST

/* What this CPU runs, said once; a forced level never exceeds it. */
START_TEST(test_paths) {
    int cpu = attn_bf16_level();
    printf("bf16 path of this CPU: %s\n", attn_bf16_name(cpu));
    for (int p = 0; p < NPATHS; p++)
        if (PATHS[p] > cpu) printf("%s not on this CPU: its kernels were not run\n", PATH_CPU[p]);
    int was = attn_bf16_force(ATTN_BF16_AMX);
    ck_assert_int_eq(attn_bf16_path(), cpu);
    attn_bf16_force(ATTN_BF16_NONE);
    ck_assert_int_eq(attn_bf16_path(), ATTN_BF16_NONE);
    ck_assert(!attn_bf16_supported(64));
    attn_bf16_force(was);
    ck_assert_int_eq(attn_bf16_supported(64), cpu != ATTN_BF16_NONE);
    ck_assert(!attn_bf16_supported(48) && !attn_bf16_supported(288));
}
END_TEST

/* The block's outputs for every row of a, in one call, on the current path. */
static float *attn_out(const acase *a) {
    size_t w = (size_t)a->R * a->D;
    float *out = xcalloc((size_t)a->L * w, sizeof(float));
    void *scratch = xaligned(attn_bf16_scratch_bytes(a->D));
    memset(scratch, 0xFF, attn_bf16_scratch_bytes(a->D));
    attn_kv_bf16 kv = attn_kv_bf16_head(a->kv, G, a->D, HEAD, a->S);
    attn_seq s = acase_seq(a);
    attn_bf16_block(out, w, a->q, w, &kv, &s, a->i0, a->L, a->R, a->D, a->scale, scratch);
    free(scratch);
    return out;
}

/* AVX512-BF16's products on FMAs give VDPBF16PS's bits, memcmp, on every
 * random shape at unit scale and again with keys and values scaled to
 * 2^-125 (products and sums below fp32's normal range: the flushes
 * VDPBF16PS makes must be made), and on the goldens' random queries with
 * tiny values. */
START_TEST(test_attention_fma_bits) {
    if (attn_bf16_level() < ATTN_BF16_AVX512) {
        printf("fma bits: AVX512-BF16 not on this CPU: not run\n");
        return;
    }
    printf("fma bits: VDPBF16PS measured %.2fx the FMAs' time here (FMAs chosen: %s)\n",
           attn_bf16_fma_gain(), attn_bf16_fma() ? "yes" : "no");
    int differ_unflushed = 0;
    for (int tiny = 0; tiny < 2; tiny++)
        for (int i = 0; i < NATTN; i++) {
            acase a = random_case(i);
            if (tiny) {
                size_t n = (size_t)a.S * G * a.D;
                for (size_t j = 0; j < n; j++) {
                    a.k[j] = ldexpf(a.k[j], -125);
                    a.v[j] = ldexpf(a.v[j], -125);
                }
                free(a.kv_mem);
                acase_pages(&a);
            }
            size_t n = (size_t)a.L * a.R * a.D;
            attn_bf16_force(ATTN_BF16_AVX512);
            attn_bf16_fma_force(0);
            float *vdp = attn_out(&a);
            attn_bf16_fma_force(1);
            float *fma = attn_out(&a);
            for (size_t j = 0; j < n; j++)
                REQUIRE(memcmp(&vdp[j], &fma[j], sizeof(float)) == 0,
                        "D=%d S=%d L=%d R=%d%s: output %zu: %a on VDPBF16PS, %a on FMAs", a.D, a.S,
                        a.L, a.R, tiny ? " (tiny keys and values)" : "", j, vdp[j], fma[j]);
            for (size_t j = 0; j < n && tiny; j++)
                differ_unflushed |= vdp[j] != 0.0f;
            free(vdp);
            free(fma);
            acase_free(&a);
        }
    /* the tiny cases reach the flushes: their outputs are not all zeros */
    ck_assert_msg(differ_unflushed, "the tiny cases gave only zeros: they test nothing");
    paths_reset();
}
END_TEST

static Suite *bf16_suite(void) {
    Suite *s = suite_create("bf16");
    TCase *t = tcase_create("rounding");
    tcase_add_test(t, test_paths);
    tcase_add_test(t, test_rounding_golden);
    tcase_add_test(t, test_rounding_random);
    suite_add_tcase(s, t);
    t = tcase_create("gemm");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_gemm_golden);
    tcase_add_loop_test(t, test_gemm_random, 0, NGEMM);
    tcase_add_test(t, test_gemm_cuts);
    tcase_add_test(t, test_gemm_fma_bits);
    suite_add_tcase(s, t);
    t = tcase_create("attention");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_attention_golden);
    tcase_add_loop_test(t, test_attention_random, 0, NATTN);
    tcase_add_test(t, test_attention_finfo_row);
    tcase_add_test(t, test_attention_fma_bits);
    suite_add_tcase(s, t);
    t = tcase_create("layout");
    tcase_add_test(t, test_kv_layout);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(bf16_suite());
}
