/* gemm_bf16.c - projections on bf16 weights: C (M,N) = bf16(A) (M,K) @ W^T
 * (K,N) + bias (N), W packed once at load (below; layout in gemm_bf16.h).
 *
 * Each call rounds its rows of A to bf16 once per block of rows and inputs
 * (abuf: rows of the block's inputs, zeros past K, at a stride that is not a
 * multiple of 4 KiB) and reuses them across every output panel of the call.
 *
 * AVX512-BF16: 12 rows x 2 panels in 24 registers; each VDPBF16PS adds the
 * products of one pair of inputs, a 32-bit broadcast of the row's pair
 * against a panel's 64-byte pair row. A K block ends by storing C and the
 * next reloads it. Tails: masked loads and stores. Where this CPU runs two
 * FMAs faster than one VDPBF16PS (bf16_fma.h), the same steps run on FMAs
 * with VDPBF16PS's rounding, on the block's rows widened: the same bits.
 * AMX: 32 rows x 2 panels in four C tiles (16 x 16 fp32), two A tiles (16
 * rows x 32 inputs of abuf) and two B tiles (a panel's 16 pairs x 16 columns,
 * 1 KiB contiguous in the packed weights): every TDPBF16PS is 16 x 16 x 32.
 * C tiles start from the bias (a tile load of stride 0 from the padded
 * bias); whole tiles are stored into C directly, partial ones (rows past the
 * call's, columns past N) and K blocks before the last go through a staging
 * buffer. A block of 16 rows or fewer uses one row of tiles.
 * Every row is summed alone, in one order, whatever the call: a row's bits
 * do not depend on its neighbours, the tile or the thread (per path).
 * Legend: see attn.h (here M rows, N output columns, K input width).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "../platform/amx.h"
#include "../platform/cpu.h"
#include "../platform/mem.h"
#include "bf16_fma.h"
#include "gemm_bf16.h"
#include "hints.h"

int attn_packed_bf16_init(attn_packed_bf16 *pw, const float *W, const float *bias, int N, int K) {
    memset(pw, 0, sizeof *pw);
    int panels = (N + ATTN_PANEL - 1) / ATTN_PANEL;
    int kp = (K + ATTN_BF16_KSTEP - 1) / ATTN_BF16_KSTEP * ATTN_BF16_KSTEP / 2;
    size_t n = (size_t)panels * kp * 2 * ATTN_PANEL; /* bf16 elements, a multiple of 32 */
    char *mem = attn_alloc_big(n * sizeof(attn_bf16) + (size_t)panels * ATTN_PANEL * sizeof(float) +
                               64); /* never 0 bytes, whatever N and K */
    if (!mem) return -1;
    attn_bf16 *p = (attn_bf16 *)mem;
    for (int j = 0; j < panels; j++)
        for (int kk = 0; kk < kp; kk++)
            for (int c = 0; c < ATTN_PANEL; c++)
                for (int e = 0; e < 2; e++) {
                    int col = j * ATTN_PANEL + c, k = 2 * kk + e;
                    float w = col < N && k < K ? W[(size_t)col * K + k] : 0.0f;
                    p[(((size_t)j * kp + kk) * ATTN_PANEL + c) * 2 + e] = attn_bf16_of_ftz(w);
                }
    pw->bias16 = (float *)(mem + n * sizeof(attn_bf16));
    for (int c = 0; c < panels * ATTN_PANEL; c++)
        pw->bias16[c] = c < N ? bias[c] : 0.0f;
    pw->p = p;
    pw->bias = bias;
    pw->N = N;
    pw->K = K;
    pw->panels = panels;
    pw->kp = kp;
    return 0;
}

void attn_packed_bf16_free(attn_packed_bf16 *pw) {
    if (!pw) return;
    free(pw->p);
    memset(pw, 0, sizeof *pw);
}

#ifndef ATTN_GEMM_KBAMX /* -DATTN_GEMM_KBAMX=... for tuning builds */
#define ATTN_GEMM_KBAMX 1024
#endif
enum {
    NP = ATTN_PANEL, /* columns per panel */
    KS = ATTN_BF16_KSTEP,
    PAD = 32,                /* abuf rows are this many bf16 longer than their inputs */
    MB512 = 96,              /* rows per block, AVX512-BF16 */
    MBF = 48,                /* rows per block on FMAs: 48 x 288 widened inputs, 54 KiB */
    KB512 = 256,             /* inputs per block, AVX512-BF16: 96 x 288 bf16 = 54 KiB */
    MBAMX = 32,              /* rows per block, AMX: two tile rows */
    KBAMX = ATTN_GEMM_KBAMX, /* inputs per block, AMX */
    JBAMX = 16,              /* panels staged at once, AMX: 16 x 32 x 16 fp32 = 32 KiB */
    TILE_F = 256,            /* floats in a C tile */
    PANEL_K = 512,           /* bf16 in a panel's chunk of 32 inputs (a B tile) */
};

#define INLINE static inline __attribute__((always_inline))
#define BF16K __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,prfchw")))
#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

void gemm_bf16_ref(float *C, size_t ldc, const float *A, size_t lda, const attn_packed_bf16 *pw,
                   size_t r0, size_t r1, int c0, int c1) {
    for (size_t r = r0; r < r1; r++)
        for (int n = c0; n < c1; n++) {
            float c = pw->bias[n];
            for (int k = 0; k < pw->K; k++) /* the product is exact: one rounding per step */
                c += attn_bf16_to_f32(attn_bf16_of_ftz(A[r * lda + k])) *
                     attn_bf16_to_f32(attn_packed_bf16_at(pw, n, k));
            C[r * ldc + n] = c;
        }
}

/* Where a call's rows come from: fp32, rounded on the way in, or bf16
 * already (gemm_bf16_tile_rounded). */
typedef struct {
    const float *f;     /* (M,K) at stride ld, or NULL */
    const attn_bf16 *b; /* (M, K rounded up to 32) at stride ld, zeros past K, or NULL */
    size_t ld;
} gemm_rows;

/* The bf16 rows [rb, rb+nr) x inputs [k0, k1) of a block, with zeros past
 * k1 up to kn_pad and rows up to nr_pad: straight from bf16 rows when they
 * hold all of it, else in abuf (stride ldb). Returns the rows; *ld their
 * stride. */
static const attn_bf16 *block_rows(const gemm_rows *src, size_t rb, size_t nr, size_t nr_pad,
                                   int k0, int k1, int kn_pad, attn_bf16 *abuf, size_t ldb,
                                   size_t *ld) {
    size_t kn = src->f ? (size_t)(k1 - k0) : (size_t)kn_pad; /* bf16 rows hold their zeros */
    if (src->b && nr == nr_pad) {
        *ld = src->ld;
        return src->b + rb * src->ld + k0;
    }
    for (size_t r = 0; r < nr_pad; r++) {
        attn_bf16 *dst = abuf + r * ldb;
        size_t have = r < nr ? kn : 0;
        if (r < nr && src->f) attn_bf16_round(dst, src->f + (rb + r) * src->ld + k0, kn);
        if (r < nr && src->b) memcpy(dst, src->b + (rb + r) * src->ld + k0, kn * sizeof *dst);
        memset(dst + have, 0, sizeof(attn_bf16) * ((size_t)kn_pad - have));
    }
    *ld = ldb;
    return abuf;
}

/* ---- AVX512-BF16: MR rows x 2 panels -------------------------------------------------- */

typedef struct {
    float *C; /* row 0, column of panel 0 */
    size_t ldc;
    const void *A; /* the block's row 0 at its first input: bf16, or widened for the FMAs */
    size_t lda;    /* elements */
    const attn_bf16 *P0, *P1; /* the panels at the block's first pair */
    const float *b0, *b1;     /* the panels' bias */
    __mmask16 m0, m1;         /* valid columns (m1 = 0: no second panel) */
    int first;                /* first K block: start from the bias, else from C */
    int pairs;                /* input pairs in the block */
} k512_args;

BF16K INLINE void k512_body(const k512_args *a, const int MR) {
    __m512 c[12][2];
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
        c[r][0] = _mm512_maskz_loadu_ps(a->m0, a->first ? a->b0 : a->C + r * a->ldc);
        c[r][1] = _mm512_maskz_loadu_ps(a->m1, a->first ? a->b1 : a->C + r * a->ldc + NP);
    }
    for (int kk = 0; kk < a->pairs; kk++) {
        if (a->first) attn_prefetch_out(a->C, a->ldc, kk, MR, a->m1 != 0);
        __m512bh w0 = (__m512bh)_mm512_load_si512(a->P0 + (size_t)kk * 2 * NP);
        __m512bh w1 = (__m512bh)_mm512_load_si512(a->P1 + (size_t)kk * 2 * NP);
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
            int32_t pair;
            memcpy(&pair, (const attn_bf16 *)a->A + r * a->lda + 2 * kk, sizeof pair);
            __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
            c[r][0] = _mm512_dpbf16_ps(c[r][0], x, w0);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], x, w1);
        }
    }
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
        _mm512_mask_storeu_ps(a->C + r * a->ldc, a->m0, c[r][0]);
        _mm512_mask_storeu_ps(a->C + r * a->ldc + NP, a->m1, c[r][1]);
    }
}

#define K512_ROWS(R)                                                                               \
    BF16K static void k512_##R(const k512_args *a) {                                               \
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

/* ---- AVX512-BF16's products on FMAs (bf16_fma.h): the same bits ------------------------- */

/* k512_body with A widened to fp32. */
ATTN_FMA_TARGET INLINE void f512_body(const k512_args *a, const int MR) {
    __m512 c[12][2];
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
        c[r][0] = _mm512_maskz_loadu_ps(a->m0, a->first ? a->b0 : a->C + r * a->ldc);
        c[r][1] = _mm512_maskz_loadu_ps(a->m1, a->first ? a->b1 : a->C + r * a->ldc + NP);
    }
    for (int kk = 0; kk < a->pairs; kk++) {
        if (a->first) attn_prefetch_out(a->C, a->ldc, kk, MR, a->m1 != 0);
        __m512i w0 = _mm512_load_si512(a->P0 + (size_t)kk * 2 * NP);
        __m512i w1 = _mm512_load_si512(a->P1 + (size_t)kk * 2 * NP);
        __m512 w00 = attn_bf16_even(w0), w01 = attn_bf16_odd(w0);
        __m512 w10 = attn_bf16_even(w1), w11 = attn_bf16_odd(w1);
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
            const float *x = (const float *)a->A + r * a->lda + 2 * kk;
            __m512 x0 = _mm512_set1_ps(x[0]), x1 = _mm512_set1_ps(x[1]);
            c[r][0] = attn_bf16_pair_fma(c[r][0], x0, x1, w00, w01);
            c[r][1] = attn_bf16_pair_fma(c[r][1], x0, x1, w10, w11);
        }
    }
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
        _mm512_mask_storeu_ps(a->C + r * a->ldc, a->m0, c[r][0]);
        _mm512_mask_storeu_ps(a->C + r * a->ldc + NP, a->m1, c[r][1]);
    }
}

#define F512_ROWS(R)                                                                               \
    ATTN_FMA_TARGET static void f512_##R(const k512_args *a) {                                     \
        f512_body(a, R);                                                                           \
    }
F512_ROWS(1)
F512_ROWS(2)
F512_ROWS(3)
F512_ROWS(4)
F512_ROWS(5)
F512_ROWS(6)
F512_ROWS(7)
F512_ROWS(8)
F512_ROWS(9)
F512_ROWS(10)
F512_ROWS(11)
F512_ROWS(12)
static void (*const f512_rows[13])(const k512_args *) = {NULL,    f512_1,  f512_2, f512_3, f512_4,
                                                         f512_5,  f512_6,  f512_7, f512_8, f512_9,
                                                         f512_10, f512_11, f512_12};

typedef void k512_fn(const k512_args *);

/* nr rows of C (at row 0 of the block) x panels [j0,j1) over the inputs
 * [k0, k0 + 2*pairs) held in A (stride lda elements of esize bytes), by
 * rows[] (k512_rows on bf16 rows, f512_rows on widened ones). */
static void block512(float *C, size_t ldc, const void *A, size_t lda, size_t esize,
                     k512_fn *const *rows, const attn_packed_bf16 *pw, size_t nr, int j0, int j1,
                     int k0, int pairs) {
    for (int j = j0; j < j1; j += 2) {
        int n0 = j * NP, two = j + 1 < j1;
        k512_args a = {.ldc = ldc, .lda = lda, .first = k0 == 0, .pairs = pairs};
        a.m0 = cols_mask(pw->N - n0);
        a.m1 = two ? cols_mask(pw->N - n0 - NP) : 0;
        a.P0 = pw->p + ((size_t)j * pw->kp + (size_t)k0 / 2) * 2 * NP;
        a.P1 = two ? a.P0 + (size_t)pw->kp * 2 * NP : a.P0; /* unread lanes: any valid panel */
        a.b0 = pw->bias16 + n0;
        a.b1 = two ? a.b0 + NP : a.b0;
        for (size_t r = 0; r < nr; r += 12) {
            a.C = C + r * ldc + n0;
            a.A = (const char *)A + r * lda * esize;
            rows[nr - r < 12 ? nr - r : 12](&a);
        }
    }
}

/* Rows [r0, r1) x panels [j0, j1), block by block of rows and inputs: on
 * VDPBF16PS (fma 0), or on FMAs (fma 1) with each block's rounded rows
 * widened first (blocks of MBF rows, so that the widened copy stays near
 * L1's size) and MXCSR's flushes set around the products. */
static void tile512(float *C, size_t ldc, const gemm_rows *src, const attn_packed_bf16 *pw,
                    size_t r0, size_t r1, int j0, int j1, int fma) {
    attn_bf16 abuf[MB512 * (KB512 + PAD)] __attribute__((aligned(64)));
    float af[MBF * (KB512 + PAD)] __attribute__((aligned(64)));
    size_t mb = fma ? MBF : MB512;
    for (size_t rb = r0; rb < r1; rb += mb) {
        size_t nr = r1 - rb < mb ? r1 - rb : mb, ld;
        for (int k0 = 0; k0 < pw->K; k0 += KB512) {
            int k1 = pw->K - k0 < KB512 ? pw->K : k0 + KB512;
            int kn_pad = (k1 - k0 + KS - 1) / KS * KS;
            const attn_bf16 *a =
                block_rows(src, rb, nr, nr, k0, k1, kn_pad, abuf, KB512 + PAD, &ld);
            if (!fma) {
                block512(C + rb * ldc, ldc, a, ld, sizeof *a, k512_rows, pw, nr, j0, j1, k0,
                         kn_pad / 2);
                continue;
            }
            for (size_t r = 0; r < nr; r++)
                attn_bf16_widen(af + r * (KB512 + PAD), a + r * ld, (size_t)kn_pad);
            unsigned m = attn_flush_begin();
            block512(C + rb * ldc, ldc, af, KB512 + PAD, sizeof *af, f512_rows, pw, nr, j0, j1, k0,
                     kn_pad / 2);
            attn_flush_end(m);
        }
    }
}

/* ---- AMX: 32 (or 16) rows x 2 panels ---------------------------------------------------- */

/* Tiles: 0 (rows 0-15, panel 0), 1 (rows 0-15, panel 1), 2 (rows 16-31,
 * panel 0), 3 (rows 16-31, panel 1) accumulate; 4 and 5 hold the two rows of
 * A tiles, 6 and 7 the two panels' B tiles. */
typedef struct {
    const attn_bf16 *A; /* abuf at the block's first input; row stride lda bytes */
    size_t lda;
    const attn_bf16 *P0, *P1; /* the panels at the block's first pair */
    int chunks;               /* 32-input chunks in the block */
    const float *in[4];       /* where each C tile starts from (bias: stride 0) */
    size_t in_stride[4];      /* bytes */
    float *out[4];            /* where each C tile goes */
    size_t out_stride[4];     /* bytes */
} amx_args;

AMX static void amx_2x2(const amx_args *a) {
    _tile_loadd(0, a->in[0], a->in_stride[0]);
    _tile_loadd(1, a->in[1], a->in_stride[1]);
    _tile_loadd(2, a->in[2], a->in_stride[2]);
    _tile_loadd(3, a->in[3], a->in_stride[3]);
    const char *a1 = (const char *)a->A + 16 * a->lda;
    for (int c = 0; c < a->chunks; c++) {
        _tile_loadd(4, a->A + c * KS, a->lda);
        _tile_loadd(5, a1 + c * KS * sizeof(attn_bf16), a->lda);
        _tile_loadd(6, a->P0 + (size_t)c * PANEL_K, 64);
        _tile_loadd(7, a->P1 + (size_t)c * PANEL_K, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, a->out[0], a->out_stride[0]);
    _tile_stored(1, a->out[1], a->out_stride[1]);
    _tile_stored(2, a->out[2], a->out_stride[2]);
    _tile_stored(3, a->out[3], a->out_stride[3]);
}

AMX static void amx_1x2(const amx_args *a) {
    _tile_loadd(0, a->in[0], a->in_stride[0]);
    _tile_loadd(1, a->in[1], a->in_stride[1]);
    for (int c = 0; c < a->chunks; c++) {
        _tile_loadd(4, a->A + c * KS, a->lda);
        _tile_loadd(6, a->P0 + (size_t)c * PANEL_K, 64);
        _tile_loadd(7, a->P1 + (size_t)c * PANEL_K, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, a->out[0], a->out_stride[0]);
    _tile_stored(1, a->out[1], a->out_stride[1]);
}

/* One row block of the AMX path: what stays the same across its K blocks. */
typedef struct {
    float *C; /* row 0 of the block */
    size_t ldc;
    const attn_packed_bf16 *pw;
    int nr;          /* valid rows, 1..32 */
    int jb0, jb1;    /* the panels staged together */
    float *stage;    /* (JBAMX, 32, 16): tile (row tile t, panel j) at ((j-jb0)*32 + 16t)*16 */
    int first, last; /* the K block is the first, the last */
} amx_block;

/* Copies the valid part of a staged tile into C. */
static void unstage(const amx_block *b, int t, int j) {
    int n0 = j * NP, nc = b->pw->N - n0 < NP ? b->pw->N - n0 : NP;
    int rows = b->nr - 16 * t < 16 ? b->nr - 16 * t : 16;
    const float *src = b->stage + ((size_t)(j - b->jb0) * 32 + 16 * (size_t)t) * NP;
    for (int r = 0; r < rows; r++)
        memcpy(b->C + (size_t)(16 * t + r) * b->ldc + n0, src + r * NP, sizeof(float) * nc);
}

/* Where tile (row tile t, panel j) of a pair starts from and goes; 1 when it
 * goes to the staging buffer although the block is the last. A pair's
 * second panel that is not `real` (past the call's panels) is computed from
 * the first one's bias into its staging slot, and dropped. */
static int tile_ends(const amx_block *b, amx_args *a, int slot, int t, int j, int real) {
    float *st = b->stage + ((size_t)(j - b->jb0) * 32 + 16 * (size_t)t) * NP;
    a->in[slot] = b->first ? b->pw->bias16 + (size_t)(real ? j : j - 1) * NP : st;
    a->in_stride[slot] = b->first ? 0 : NP * sizeof(float);
    int whole = real && 16 * (t + 1) <= b->nr && (j + 1) * NP <= b->pw->N;
    a->out[slot] = b->last && whole ? b->C + (size_t)16 * t * b->ldc + (size_t)j * NP : st;
    a->out_stride[slot] = b->last && whole ? b->ldc * sizeof(float) : NP * sizeof(float);
    return b->last && real && !whole;
}

static void amx_panels(const amx_block *b, const attn_bf16 *abuf, size_t ldb, int k0, int pairs) {
    const attn_packed_bf16 *pw = b->pw;
    int tiles = b->nr > 16 ? 2 : 1;
    for (int j = b->jb0; j < b->jb1; j += 2) {
        int two = j + 1 < b->jb1, staged[4] = {0};
        amx_args a = {.A = abuf, .lda = ldb * sizeof(attn_bf16), .chunks = pairs * 2 / KS};
        a.P0 = pw->p + ((size_t)j * pw->kp + (size_t)k0 / 2) * 2 * NP;
        a.P1 = two ? a.P0 + (size_t)pw->kp * 2 * NP : a.P0; /* no second panel: computed, unused */
        for (int t = 0; t < tiles; t++)
            for (int p = 0; p < 2; p++)
                staged[2 * t + p] = tile_ends(b, &a, 2 * t + p, t, j + p, p == 0 || two);
        if (tiles == 2)
            amx_2x2(&a);
        else
            amx_1x2(&a);
        for (int s = 0; s < 4; s++)
            if (staged[s]) unstage(b, s / 2, j + s % 2);
    }
}

static void tile_amx(float *C, size_t ldc, const gemm_rows *src, const attn_packed_bf16 *pw,
                     size_t r0, size_t r1, int j0, int j1) {
    attn_bf16 abuf[MBAMX * (KBAMX + PAD)] __attribute__((aligned(64)));
    float stage[JBAMX * 32 * NP] __attribute__((aligned(64)));
    attn_amx_begin();
    for (int jb0 = j0; jb0 < j1; jb0 += JBAMX)
        for (size_t rb = r0; rb < r1; rb += MBAMX) {
            amx_block b = {.C = C + rb * ldc, .ldc = ldc, .pw = pw, .stage = stage, .jb0 = jb0};
            b.jb1 = j1 - jb0 < JBAMX ? j1 : jb0 + JBAMX;
            b.nr = (int)(r1 - rb < MBAMX ? r1 - rb : MBAMX);
            for (int k0 = 0; k0 < pw->K; k0 += KBAMX) {
                int k1 = pw->K - k0 < KBAMX ? pw->K : k0 + KBAMX;
                int kn_pad = (k1 - k0 + KS - 1) / KS * KS;
                size_t ld;
                b.first = k0 == 0;
                b.last = k1 == pw->K;
                const attn_bf16 *a = block_rows(src, rb, (size_t)b.nr, b.nr > 16 ? 32 : 16, k0, k1,
                                                kn_pad, abuf, KBAMX + PAD, &ld);
                amx_panels(&b, a, ld, k0, kn_pad / 2);
            }
        }
    attn_amx_end();
}

/* ---- dispatch ---------------------------------------------------------------------- */

/* The reference on rows that are bf16 already: widened, they are their own
 * rounding. */
static void ref_rounded(float *C, size_t ldc, const attn_bf16 *A, size_t lda,
                        const attn_packed_bf16 *pw, size_t r0, size_t r1, int c0, int c1) {
    float row[1024];
    for (size_t r = r0; r < r1; r++)
        for (int k0 = 0; k0 < pw->K; k0 += 1024) { /* K blocks: C carries the sums */
            int kn = pw->K - k0 < 1024 ? pw->K - k0 : 1024;
            attn_bf16_widen(row, A + r * lda + k0, (size_t)kn);
            for (int n = c0; n < c1; n++) {
                float c = k0 ? C[r * ldc + n] : pw->bias[n];
                for (int k = 0; k < kn; k++)
                    c += row[k] * attn_bf16_to_f32(attn_packed_bf16_at(pw, n, k0 + k));
                C[r * ldc + n] = c;
            }
        }
}

static void tile_on_path(float *C, size_t ldc, const gemm_rows *src, const attn_packed_bf16 *pw,
                         size_t r0, size_t r1, int j0, int j1) {
    if (j1 > pw->panels) j1 = pw->panels;
    if (j0 >= j1 || r0 >= r1) return;
    int c1 = j1 * NP < pw->N ? j1 * NP : pw->N;
    switch (attn_bf16_path()) {
    case ATTN_BF16_AMX:
        tile_amx(C, ldc, src, pw, r0, r1, j0, j1);
        break;
    case ATTN_BF16_AVX512:
        tile512(C, ldc, src, pw, r0, r1, j0, j1, attn_bf16_fma());
        break;
    default:
        if (src->f)
            gemm_bf16_ref(C, ldc, src->f, src->ld, pw, r0, r1, j0 * NP, c1);
        else
            ref_rounded(C, ldc, src->b, src->ld, pw, r0, r1, j0 * NP, c1);
        break;
    }
}

void gemm_bf16_tile(float *C, size_t ldc, const float *A, size_t lda, const attn_packed_bf16 *pw,
                    size_t r0, size_t r1, int j0, int j1) {
    gemm_rows src = {.f = A, .ld = lda};
    tile_on_path(C, ldc, &src, pw, r0, r1, j0, j1);
}

void gemm_bf16_tile_rounded(float *C, size_t ldc, const attn_bf16 *A, size_t lda,
                            const attn_packed_bf16 *pw, size_t r0, size_t r1, int j0, int j1) {
    gemm_rows src = {.b = A, .ld = lda};
    tile_on_path(C, ldc, &src, pw, r0, r1, j0, j1);
}
