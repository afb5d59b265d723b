/* gemm.c - the projections: C (M,N) = A (M,K) @ W^T (K,N) + bias (N) on
 * weights packed once, at load, into the layout this kernel reads.
 *
 * Layout: W (N,K) row-major (torch's (out, in)) is cut into panels of 16
 * output columns; panel j holds, for k = 0..K-1, the 16 weights
 * W[16j .. 16j+15][k] next to each other (zeros past N). A kernel walks one
 * or two panels from front to back while it broadcasts one input value per
 * row: no weight is ever re-packed per call, which is what a batch of a few
 * tokens would otherwise pay for (a whole 3E x E copy per call and thread).
 *
 * Every output is computed the same way whatever M, the row's place in the
 * batch, the tile or the thread. The inputs go in runs of ATTN_GEMM_RUN
 * (64): k = 64g .. 64g+63, the last run shorter. A run's products are
 * summed apart, s = a_k0 w_k0; s = fma(a_k, w_k, s) for the rest in order,
 * and each run's s then joins the output in order: c = bias; c = c + s_g
 * for g = 0, 1, ... So a sequence's projections do not depend on what else
 * shares its batch, nor on the thread count, nor on the K block, a
 * multiple of the run (docs/performance.md, batch invariance). The runs
 * make the sums about 2.5 times as accurate as one running sum over all K
 * (docs/performance.md, "Sums in runs"), at the cost of C's tile through L1
 * once a run. gemm_ref() is that formula in plain C with fmaf; the AVX-512
 * and AVX2 kernels give the same bits, and the tests hold them to it. The
 * baseline kernel (no FMA in the CPU) rounds each product first.
 *
 * Kernels: AVX-512, 12 rows x 2 panels (24 accumulators); AVX2 + FMA, 6 rows
 * x 1 panel (12); baseline, plain loops. Chosen at run time from the CPU's
 * features (cpu.c).
 * Legend: see attn.h (here M rows, N output columns, K input width).
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../platform/cpu.h"
#include "../platform/mem.h"
#include "gemm.h"
#include "hints.h"

#ifndef ATTN_GEMM_MB /* -DATTN_GEMM_MB=... and -DATTN_GEMM_KC=... for tuning builds */
#define ATTN_GEMM_MB 96
#endif
#ifdef ATTN_GEMM_KC
_Static_assert(ATTN_GEMM_KC % ATTN_GEMM_RUN == 0, "a K block holds whole runs");
#endif
enum {
    NP = ATTN_PANEL,         /* columns per panel */
    RUN = ATTN_GEMM_RUN,     /* inputs summed apart */
    KC_SMALL = 128,          /* K block (gemm_kc): two panels of it take 16 KiB */
    KC_LARGE = 256,          /* and 32 KiB, on CPUs whose L1 data cache holds 48 KiB or more */
    MB = ATTN_GEMM_MB,       /* row block: its K block of inputs stays in L2 across the panels */
    LDA_MAX = KC_LARGE + 16, /* row stride of the copied inputs: the K block + 16 */
};

/* The K block of weights packed from now on. A K block ends by storing the
 * tile's outputs and the next reloads them, so a larger block moves less;
 * but two panels of it should stay in L1 across the rows of a tile. With
 * 48 KiB of L1 (Intel since Ice Lake, AMD Zen 5), 256 inputs, measured
 * faster (docs/performance.md, "Weights are constants"); with less, or
 * where the size is not reported, 128. */
static int g_kc; /* gemm_force_kc(); 0: the CPU's */

static int gemm_kc(void) {
    if (g_kc) return g_kc;
#ifdef ATTN_GEMM_KC
    return ATTN_GEMM_KC < KC_LARGE ? ATTN_GEMM_KC : KC_LARGE;
#else
    return sysconf(_SC_LEVEL1_DCACHE_SIZE) >= 48 * 1024 ? KC_LARGE : KC_SMALL;
#endif
}

int gemm_force_kc(int kc) {
    int was = g_kc;
    g_kc = kc > 0 && kc <= KC_LARGE && kc % RUN == 0 ? kc : 0;
    return was;
}

/* Whether the L1 data cache keeps the 12 input rows a kernel call reads
 * even when they all fall in one set: rows 4 KiB apart (K = 1024) do. With
 * fewer than 12 ways (or none reported), gemm_tile copies such rows into a
 * buffer at a stride that is not a multiple of 4 KiB; every other tile
 * reads its inputs where they are, since the copy cost more than it saved
 * (docs/performance.md, "Weights are constants", has the measurements). */
static atomic_int g_holds = -1; /* gemm_force_copy(); -1: not asked yet */

static int gemm_l1_holds_rows(void) {
    int holds = atomic_load_explicit(&g_holds, memory_order_relaxed);
    if (holds < 0) {
        holds = sysconf(_SC_LEVEL1_DCACHE_ASSOC) >= 12;
        atomic_store_explicit(&g_holds, holds, memory_order_relaxed);
    }
    return holds;
}

int gemm_force_copy(int copy) {
    int holds = atomic_load(&g_holds), was = holds < 0 ? -1 : !holds;
    atomic_store(&g_holds, copy < 0 ? -1 : !copy);
    return was;
}

/* Offset of W[16j][k] in the packed layout of K block kc (kb = k / kc). */
static inline size_t panel_at(int K, int panels, int kc, int j, int k) {
    size_t kb = (size_t)(k / kc), kw = (size_t)(K - (int)kb * kc < kc ? K - (int)kb * kc : kc);
    return (kb * (size_t)kc * panels + (size_t)j * kw + (size_t)(k % kc)) * NP;
}

int attn_packed_init(attn_packed *pw, const float *W, const float *bias, int N, int K) {
    memset(pw, 0, sizeof *pw);
    int panels = (N + NP - 1) / NP, kc = gemm_kc();
    size_t n = (size_t)panels * K * NP, bytes = (n ? n : 1) * sizeof(float);
    float *dst = attn_alloc_big(bytes); /* read on every call: huge pages (mem.c) */
    if (!dst) return -1;
    for (int j = 0; j < panels; j++)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < NP; c++) {
                int col = j * NP + c;
                dst[panel_at(K, panels, kc, j, k) + c] = col < N ? W[(size_t)col * K + k] : 0.0f;
            }
    pw->p = dst;
    pw->kc = kc;
    pw->bias = bias;
    pw->N = N;
    pw->K = K;
    pw->panels = panels;
    return 0;
}

void attn_packed_free(attn_packed *pw) {
    if (!pw) return;
    free(pw->p);
    memset(pw, 0, sizeof *pw);
}

/* The formula, plainly: rows [r0,r1) x columns [c0,c1) of C. */
void gemm_ref(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw, size_t r0,
              size_t r1, int c0, int c1) {
    int K = pw->K;
    for (size_t r = r0; r < r1; r++)
        for (int n = c0; n < c1; n++) {
            float c = pw->bias[n];
            for (int g = 0; g < K; g += RUN) {
                float s = 0;
                for (int k = g; k < K && k < g + RUN; k++) {
                    float w = pw->p[panel_at(K, pw->panels, pw->kc, n / NP, k) + n % NP];
                    s = k == g ? A[r * lda + k] * w : fmaf(A[r * lda + k], w, s);
                }
                c += s;
            }
            C[r * ldc + n] = c;
        }
}

/* ---- AVX-512: MR rows x 2 panels ------------------------------------------- */

#define AVX512 __attribute__((target("avx512f,prfchw")))
#define AVX2 __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

/* C[0:MR, 0:32) (masks m0, m1 for the two panels' valid columns) over the
 * kn inputs of one K block (A and the panels P0, P1 start at the block),
 * run by run: each run's sums join C, or the bias for the first run when
 * first. */
AVX512 INLINE void k512(float *C, size_t ldc, const float *A, size_t lda, const float *P0,
                        const float *P1, const float *b0, const float *b1, __mmask16 m0,
                        __mmask16 m1, int first, int kn, const int MR) {
    for (int g = 0; g < kn; g += RUN) {
        int ge = kn - g < RUN ? kn : g + RUN, start = first && g == 0; /* C's first run */
        __m512 s[12][2];
        if (start) attn_prefetch_out(C, ldc, 0, MR, m1 != 0);
        __m512 w0 = _mm512_load_ps(P0 + (size_t)g * NP), w1 = _mm512_load_ps(P1 + (size_t)g * NP);
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
            __m512 a = _mm512_set1_ps(A[r * lda + g]);
            s[r][0] = _mm512_mul_ps(a, w0);
            s[r][1] = _mm512_mul_ps(a, w1);
        }
        for (int k = g + 1; k < ge; k++) {
            if (start) attn_prefetch_out(C, ldc, k, MR, m1 != 0);
            w0 = _mm512_load_ps(P0 + (size_t)k * NP);
            w1 = _mm512_load_ps(P1 + (size_t)k * NP);
            _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
                __m512 a = _mm512_set1_ps(A[r * lda + k]);
                s[r][0] = _mm512_fmadd_ps(a, w0, s[r][0]);
                s[r][1] = _mm512_fmadd_ps(a, w1, s[r][1]);
            }
        }
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
            __m512 c0 = _mm512_maskz_loadu_ps(m0, start ? b0 : C + r * ldc);
            __m512 c1 = _mm512_maskz_loadu_ps(m1, start ? b1 : C + r * ldc + NP);
            _mm512_mask_storeu_ps(C + r * ldc, m0, _mm512_add_ps(c0, s[r][0]));
            _mm512_mask_storeu_ps(C + r * ldc + NP, m1, _mm512_add_ps(c1, s[r][1]));
        }
    }
}

/* k512 for each row count of a tile's tail, 1 to 11, chosen at run time. */
typedef void k512_fn(float *C, size_t ldc, const float *A, size_t lda, const float *P0,
                     const float *P1, const float *b0, const float *b1, __mmask16 m0, __mmask16 m1,
                     int first, int kn);
#define K512_ROWS(mr)                                                                              \
    AVX512 static void k512_##mr(float *C, size_t ldc, const float *A, size_t lda,                 \
                                 const float *P0, const float *P1, const float *b0,                \
                                 const float *b1, __mmask16 m0, __mmask16 m1, int first, int kn) { \
        k512(C, ldc, A, lda, P0, P1, b0, b1, m0, m1, first, kn, mr);                               \
    }
// clang-format off
K512_ROWS(1) K512_ROWS(2) K512_ROWS(3) K512_ROWS(4) K512_ROWS(5) K512_ROWS(6)
K512_ROWS(7) K512_ROWS(8) K512_ROWS(9) K512_ROWS(10) K512_ROWS(11)
static k512_fn *const K512_TAIL[12] = {NULL, k512_1, k512_2, k512_3, k512_4, k512_5, k512_6,
                                       k512_7, k512_8, k512_9, k512_10, k512_11};
// clang-format on

/* nr rows x panels [j0,j1) of C over the K block [k0,k1); A holds the
 * block's inputs of those rows (column k0 first). */
AVX512 static void tile512(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw,
                           size_t nr, int j0, int j1, int k0, int k1) {
    int N = pw->N, kn = k1 - k0, first = k0 == 0;
    for (int j = j0; j < j1; j += 2) {
        int n0 = j * NP;
        int left0 = N - n0, left1 = N - n0 - NP;
        __mmask16 m0 = left0 >= NP ? 0xFFFF : (__mmask16)((1u << left0) - 1);
        __mmask16 m1 = j + 1 >= j1 || left1 <= 0 ? 0
                       : left1 >= NP             ? 0xFFFF
                                                 : (__mmask16)((1u << left1) - 1);
        const float *P0 = pw->p + panel_at(pw->K, pw->panels, pw->kc, j, k0);
        const float *P1 = m1 ? P0 + (size_t)kn * NP : P0; /* unread lanes: any valid panel */
        const float *b0 = pw->bias + n0, *b1 = m1 ? b0 + NP : b0;
        size_t r = 0;
        for (; r + 12 <= nr; r += 12)
            k512(C + r * ldc + n0, ldc, A + r * lda, lda, P0, P1, b0, b1, m0, m1, first, kn, 12);
        if (nr > r) /* the last nr % 12 rows */
            K512_TAIL[nr - r](C + r * ldc + n0, ldc, A + r * lda, lda, P0, P1, b0, b1, m0, m1,
                              first, kn);
    }
}

/* ---- AVX2 + FMA: MR rows x 1 panel ------------------------------------------ */

/* The valid lanes of a partial panel, as AVX2 masks of its two halves. */
AVX2 INLINE void masks256(int left, __m256i *lo, __m256i *hi) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    *lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx);
    *hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(left - 8), idx);
}

AVX2 INLINE void k256(float *C, size_t ldc, const float *A, size_t lda, const float *P,
                      const float *b, __m256i mlo, __m256i mhi, int first, int kn, const int MR) {
    for (int g = 0; g < kn; g += RUN) {
        int ge = kn - g < RUN ? kn : g + RUN, start = first && g == 0; /* C's first run */
        __m256 s[6][2];
        __m256 w0 = _mm256_load_ps(P + (size_t)g * NP), w1 = _mm256_load_ps(P + (size_t)g * NP + 8);
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * lda + g);
            s[r][0] = _mm256_mul_ps(a, w0);
            s[r][1] = _mm256_mul_ps(a, w1);
        }
        for (int k = g + 1; k < ge; k++) {
            w0 = _mm256_load_ps(P + (size_t)k * NP);
            w1 = _mm256_load_ps(P + (size_t)k * NP + 8);
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {
                __m256 a = _mm256_broadcast_ss(A + r * lda + k);
                s[r][0] = _mm256_fmadd_ps(a, w0, s[r][0]);
                s[r][1] = _mm256_fmadd_ps(a, w1, s[r][1]);
            }
        }
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {
            const float *src = start ? b : C + r * ldc;
            __m256 c0 = _mm256_add_ps(_mm256_maskload_ps(src, mlo), s[r][0]);
            __m256 c1 = _mm256_add_ps(_mm256_maskload_ps(src + 8, mhi), s[r][1]);
            _mm256_maskstore_ps(C + r * ldc, mlo, c0);
            _mm256_maskstore_ps(C + r * ldc + 8, mhi, c1);
        }
    }
}

/* k256 for each row count of a tile's tail, 1 to 5, chosen at run time. */
typedef void k256_fn(float *C, size_t ldc, const float *A, size_t lda, const float *P,
                     const float *b, __m256i mlo, __m256i mhi, int first, int kn);
#define K256_ROWS(mr)                                                                              \
    AVX2 static void k256_##mr(float *C, size_t ldc, const float *A, size_t lda, const float *P,   \
                               const float *b, __m256i mlo, __m256i mhi, int first, int kn) {      \
        k256(C, ldc, A, lda, P, b, mlo, mhi, first, kn, mr);                                       \
    }
// clang-format off
K256_ROWS(1) K256_ROWS(2) K256_ROWS(3) K256_ROWS(4) K256_ROWS(5)
static k256_fn *const K256_TAIL[6] = {NULL, k256_1, k256_2, k256_3, k256_4, k256_5};
// clang-format on

AVX2 static void tile256(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw,
                         size_t nr, int j0, int j1, int k0, int k1) {
    int N = pw->N, kn = k1 - k0, first = k0 == 0;
    for (int j = j0; j < j1; j++) {
        int n0 = j * NP;
        __m256i mlo, mhi;
        masks256(N - n0, &mlo, &mhi);
        const float *P = pw->p + panel_at(pw->K, pw->panels, pw->kc, j, k0), *b = pw->bias + n0;
        size_t r = 0;
        for (; r + 6 <= nr; r += 6)
            k256(C + r * ldc + n0, ldc, A + r * lda, lda, P, b, mlo, mhi, first, kn, 6);
        if (nr > r) /* the last nr % 6 rows */
            K256_TAIL[nr - r](C + r * ldc + n0, ldc, A + r * lda, lda, P, b, mlo, mhi, first, kn);
    }
}

/* ---- baseline: plain loops, product rounded before the sum ------------------ */

static void tile_base(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw,
                      size_t nr, int j0, int j1, int k0, int k1) {
    for (size_t r = 0; r < nr; r++)
        for (int j = j0; j < j1; j++) {
            int n0 = j * NP, nc = pw->N - n0 < NP ? pw->N - n0 : NP;
            float c[NP], s[NP];
            for (int i = 0; i < nc; i++)
                c[i] = k0 ? C[r * ldc + n0 + i] : pw->bias[n0 + i];
            const float *P = pw->p + panel_at(pw->K, pw->panels, pw->kc, j, k0);
            for (int g = k0; g < k1; g += RUN) {
                for (int i = 0; i < nc; i++)
                    s[i] = 0;
                for (int k = g; k < k1 && k < g + RUN; k++) {
                    float a = A[r * lda + k - k0];
                    /* compiled for the baseline ISA: no fma to contract into */
                    for (int i = 0; i < nc; i++)
                        s[i] += a * P[(size_t)(k - k0) * NP + i];
                }
                for (int i = 0; i < nc; i++)
                    c[i] += s[i];
            }
            for (int i = 0; i < nc; i++)
                C[r * ldc + n0 + i] = c[i];
        }
}

/* ---- dispatch ---------------------------------------------------------------- */

int gemm_level(void) {
    return attn_isa(); /* cpu.c */
}

static int g_level = -1; /* gemm_force_level(); -1: the CPU's */

int gemm_force_level(int level) {
    int was = g_level;
    g_level = level;
    return was;
}

void gemm_tile(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw, size_t r0,
               size_t r1, int j0, int j1) {
    int level = g_level >= 0 ? g_level : gemm_level();
    if (j1 > pw->panels) j1 = pw->panels;
    int copy = lda % (4096 / sizeof(float)) == 0 && !gemm_l1_holds_rows();
    int kc = pw->kc, LDA = kc + 16;
    float abuf[MB * LDA_MAX] __attribute__((aligned(64)));
    for (size_t rb = r0; rb < r1; rb += MB) {
        size_t re = r1 - rb < MB ? r1 : rb + MB;
        for (int k0 = 0; k0 < pw->K; k0 += kc) {
            int k1 = pw->K - k0 < kc ? pw->K : k0 + kc;
            const float *a = A + rb * lda + k0;
            size_t ld = lda;
            if (copy) {
                for (size_t r = rb; r < re; r++)
                    memcpy(abuf + (r - rb) * LDA, A + r * lda + k0,
                           sizeof(float) * (size_t)(k1 - k0));
                a = abuf;
                ld = LDA;
            }
            float *c = C + rb * ldc;
            if (level >= ATTN_ISA_AVX512)
                tile512(c, ldc, a, ld, pw, re - rb, j0, j1, k0, k1);
            else if (level == ATTN_ISA_AVX2)
                tile256(c, ldc, a, ld, pw, re - rb, j0, j1, k0, k1);
            else
                tile_base(c, ldc, a, ld, pw, re - rb, j0, j1, k0, k1);
        }
    }
}
