/* block_bf16.c - the online-softmax attention block with bf16 operands
 * (block_bf16.h), on AMX tiles or AVX512-BF16, and its plain reference: what
 * the fp32 block computes, with q (scaled) and P rounded to bf16 and K and
 * V read in bf16 from their pages.
 *
 * A call rounds its rows' scaled queries once (qb) and takes the rows in
 * groups of 32, each walking the keys in blocks of NK: scores (fp32 sums),
 * masks, a running integer maximum c and sum l, pb = bf16(2^(sc - c)), and
 * acc += pb V; out = acc / l at the end. Scores are in log2 units, row by
 * row, so pb is already what an AMX A tile or a broadcast reads. The next
 * block's scores are computed before this block's softmax (two buffers), so
 * tile work is in flight while the vector unit runs the softmax. When c
 * grows, acc and l scale by 2^(c_old - c_new), exactly: P is the same
 * whatever the block sizes. docs/performance.md ("bf16 kernels") gives the
 * tile layouts and what was measured.
 * On the AVX512-BF16 path the products run on VDPBF16PS or, where this CPU
 * runs them faster, on two FMAs each with VDPBF16PS's rounding (bf16_fma.h):
 * the same bits. The FMA form takes the steps key block after key block,
 * every group of rows in turn, so that a block's keys and values are
 * widened to fp32 once for all the rows; each row still meets the blocks
 * in order, with the same sums.
 * Legend: see attn.h.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../platform/amx.h"
#include "../platform/cpu.h"
#include "../prim/exp.h"
#include "../prim/mask.h"
#include "bf16_fma.h"
#include "block_bf16.h"

#ifndef ATTN_BF16_NK     /* -DATTN_BF16_NK=... for tuning builds */
#define ATTN_BF16_NK 128 /* a multiple of 64 */
#endif
enum {
    NK = ATTN_BF16_NK, /* keys per block, a multiple of 64 */
    RG = 32,           /* rows per group */
    ROWS = ATTN_BF16_ROWS,
    WIDEN_ROWS = 4, /* on FMAs, a key block is widened once for more rows than this */
};
/* A hidden key's score: below any visible one (scores and additive masks in
 * log2 units are above -2e30), and finite. */
#define HIDDEN (-FLT_MAX)
#define SEEN (-1e37f) /* a block whose largest score is below this shows nothing */

#define BF16K __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define AMX                                                                                        \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

static const float LOG2E = ATTN_LOG2E;

int attn_bf16_supported(int D) {
    return attn_bf16_path() != ATTN_BF16_NONE && D % 32 == 0 && D > 0 && D <= 256;
}

/* One call's scratch, carved out of the caller's buffer. */
typedef struct {
    attn_bf16 *qb; /* (ROWS, D) bf16(q * scale), zeros past the rows */
    float *acc;    /* (ROWS, D) unnormalised outputs */
    float *sc[2];  /* (RG, NK) scores of a group, two: the next step's are made early */
    attn_bf16 *pb; /* (RG, NK) their rounded probabilities */
    float *c;      /* (ROWS) running maximum: an integer, -inf before any visible key */
    float *l;      /* (ROWS, 16) running sum, in 16 parts (summed at the end) */
    float *qf;     /* (RG, D) a group's qb widened, for the FMA form */
    float *pf;     /* (RG, NK) pb widened, for the FMA form */
    float *kf;     /* (NK, D) a key block widened, for the FMA form */
    float *vf;     /* (NK, D) its values widened */
} bf16_scratch;

static size_t up64(size_t bytes) {
    return (bytes + 63) / 64 * 64;
}

size_t attn_bf16_scratch_bytes(int D) {
    return up64((size_t)ROWS * D * sizeof(attn_bf16)) + up64((size_t)ROWS * D * sizeof(float)) +
           2 * up64((size_t)RG * NK * sizeof(float)) + up64((size_t)RG * NK * sizeof(attn_bf16)) +
           up64((size_t)ROWS * sizeof(float)) + up64((size_t)ROWS * 16 * sizeof(float)) +
           up64((size_t)RG * D * sizeof(float)) + up64((size_t)RG * NK * sizeof(float)) +
           2 * up64((size_t)NK * D * sizeof(float));
}

static bf16_scratch carve(void *scratch, int D) {
    char *p = scratch;
    bf16_scratch w;
    w.qb = (attn_bf16 *)p;
    p += up64((size_t)ROWS * D * sizeof(attn_bf16));
    w.acc = (float *)p;
    p += up64((size_t)ROWS * D * sizeof(float));
    for (int b = 0; b < 2; b++) {
        w.sc[b] = (float *)p;
        p += up64((size_t)RG * NK * sizeof(float));
    }
    w.pb = (attn_bf16 *)p;
    p += up64((size_t)RG * NK * sizeof(attn_bf16));
    w.c = (float *)p;
    p += up64((size_t)ROWS * sizeof(float));
    w.l = (float *)p;
    p += up64((size_t)ROWS * 16 * sizeof(float));
    w.qf = (float *)p;
    p += up64((size_t)RG * D * sizeof(float));
    w.pf = (float *)p;
    p += up64((size_t)RG * NK * sizeof(float));
    w.kf = (float *)p;
    p += up64((size_t)NK * D * sizeof(float));
    w.vf = (float *)p;
    return w;
}

/* The 16-key block of key `j` (a multiple of 16) in its page. */
static inline const attn_bf16 *keys_at(const attn_kv_bf16 *kv, int D, int j) {
    return kv->head + (size_t)(j / ATTN_KV_PAGE) * kv->page +
           attn_kv_key_at(D, j % ATTN_KV_PAGE, 0);
}
/* Values of the token pair at key `j` (even), widths from d0. */
static inline const attn_bf16 *values_at(const attn_kv_bf16 *kv, int D, int j, int d0) {
    return kv->head + (size_t)(j / ATTN_KV_PAGE) * kv->page +
           attn_kv_value_at(D, j % ATTN_KV_PAGE, d0);
}

/* ---- AMX ------------------------------------------------------------------------- */

/* sc (16 or 32 rows, nkp) = qg (rows, D) @ K^T for keys [j0, j0 + nkp). Tiles
 * 0-3 scores (rows 0-15 | 16-31) x (keys 0-15 | 16-31), 4-5 queries, 6-7 keys. */
AMX static void amx_scores(float *sc, const attn_bf16 *qg, int D, const attn_kv_bf16 *kv, int j0,
                           int nkp, int two) {
    size_t lq = (size_t)D * sizeof(attn_bf16), ls = NK * sizeof(float);
    for (int kc = 0; kc < nkp; kc += 32) {
        const attn_bf16 *k0 = keys_at(kv, D, j0 + kc), *k1 = keys_at(kv, D, j0 + kc + 16);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int dc = 0; dc < D / 32; dc++) {
            _tile_loadd(4, qg + dc * 32, lq);
            _tile_loadd(6, k0 + dc * 512, 64);
            _tile_loadd(7, k1 + dc * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (two) {
                _tile_loadd(5, qg + 16 * D + dc * 32, lq);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, sc + kc, ls);
        _tile_stored(1, sc + kc + 16, ls);
        if (two) {
            _tile_stored(2, sc + 16 * NK + kc, ls);
            _tile_stored(3, sc + 16 * NK + kc + 16, ls);
        }
    }
}

/* acc (16 or 32 rows, D) += pb (rows, nkp) @ V for keys [j0, j0 + nkp).
 * Tiles 0-3 acc (rows 0-15 | 16-31) x (widths 0-15 | 16-31 of a chunk of
 * 32), 4-5 probabilities, 6-7 values. */
AMX static void amx_values(float *acc, const attn_bf16 *pb, int D, const attn_kv_bf16 *kv, int j0,
                           int nkp, int two) {
    size_t la = (size_t)D * sizeof(float), lp = NK * sizeof(attn_bf16), lv = 4 * (size_t)D;
    for (int dc = 0; dc < D; dc += 32) {
        float *a0 = acc + dc, *a1 = acc + 16 * (size_t)D + dc;
        _tile_loadd(0, a0, la);
        _tile_loadd(1, a0 + 16, la);
        if (two) {
            _tile_loadd(2, a1, la);
            _tile_loadd(3, a1 + 16, la);
        }
        for (int kc = 0; kc < nkp; kc += 32) {
            const attn_bf16 *v = values_at(kv, D, j0 + kc, dc);
            _tile_loadd(4, pb + kc, lp);
            _tile_loadd(6, v, lv);
            _tile_loadd(7, v + 32, lv);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (two) {
                _tile_loadd(5, pb + 16 * NK + kc, lp);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, a0, la);
        _tile_stored(1, a0 + 16, la);
        if (two) {
            _tile_stored(2, a1, la);
            _tile_stored(3, a1 + 16, la);
        }
    }
}

/* ---- AVX512-BF16 ------------------------------------------------------------------- */

BF16K VINLINE __m512bh pair_of(const attn_bf16 *p) {
    int32_t x;
    memcpy(&x, p, sizeof x);
    return (__m512bh)_mm512_set1_epi32(x);
}

/* sc rows [0, rows) x keys [kc, kc + 16 NV) of keys j0.. = qg @ K^T, 4 rows at
 * a time (rows a multiple of 4). */
BF16K VINLINE void dot_scores(float *sc, const attn_bf16 *qg, int D, const attn_kv_bf16 *kv, int j0,
                              int kc, int rows, const int NV) {
    const attn_bf16 *kb[4];
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) kb[v] = keys_at(kv, D, j0 + kc + 16 * v);
    for (int r = 0; r < rows; r += 4) {
        __m512 a[4][4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] = _mm512_setzero_ps();
        for (int dp = 0; dp < D / 2; dp++) {
            __m512bh k[4];
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) k[v] =
                (__m512bh)_mm512_loadu_si512(kb[v] + dp * 32);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                __m512bh x = pair_of(qg + (size_t)(r + i) * D + 2 * dp);
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] =
                    _mm512_dpbf16_ps(a[i][v], x, k[v]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(sc + (size_t)(r + i) * NK + kc + 16 * v, a[i][v]);
    }
}

/* acc rows [0, rows) x widths [d0, d0 + 16 NV) += pb @ V over keys j0.. +nkp. */
BF16K VINLINE void dot_values(float *acc, const attn_bf16 *pb, int D, const attn_kv_bf16 *kv,
                              int j0, int nkp, int rows, int d0, const int NV) {
    for (int r = 0; r < rows; r += 4) {
        __m512 a[4][4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] =
                _mm512_loadu_ps(acc + (size_t)(r + i) * D + d0 + 16 * v);
        for (int kk = 0; kk < nkp; kk += 2) {
            const attn_bf16 *vr = values_at(kv, D, j0 + kk, d0);
            __m512bh w[4];
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) w[v] =
                (__m512bh)_mm512_loadu_si512(vr + 32 * v);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                __m512bh x = pair_of(pb + (size_t)(r + i) * NK + kk);
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] =
                    _mm512_dpbf16_ps(a[i][v], x, w[v]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(acc + (size_t)(r + i) * D + d0 + 16 * v, a[i][v]);
    }
}

BF16K static void avx_scores(float *sc, const attn_bf16 *qg, int D, const attn_kv_bf16 *kv, int j0,
                             int nkp, int rows) {
    int kc = 0;
    for (; kc + 64 <= nkp; kc += 64)
        dot_scores(sc, qg, D, kv, j0, kc, rows, 4);
    if (kc < nkp) dot_scores(sc, qg, D, kv, j0, kc, rows, 2); /* nkp is a multiple of 32 */
}

BF16K static void avx_values(float *acc, const attn_bf16 *pb, int D, const attn_kv_bf16 *kv, int j0,
                             int nkp, int rows) {
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64)
        dot_values(acc, pb, D, kv, j0, nkp, rows, d0, 4);
    if (d0 < D) dot_values(acc, pb, D, kv, j0, nkp, rows, d0, 2); /* D is a multiple of 32 */
}

/* ---- AVX512-BF16's products on FMAs (bf16_fma.h): the same bits --------------------- */

/* a[i][v] += row i's pair (the two floats at x + i ldx) times the 16 pairs
 * at w[v], for 4 rows x NV vectors: from bf16 pairs, widened here, or (WIDE)
 * from pairs widened before (widen_block), each as its 16 even then its
 * 16 odd floats. Widening a key block once for all the rows keeps the
 * shifts off the ports the FMAs issue on. */
ATTN_FMA_TARGET VINLINE void fma_pairs(__m512 a[4][4], const void *const w[4], const float *x,
                                       size_t ldx, const int NV, const int WIDE) {
    __m512 w0[4], w1[4];
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
        if (WIDE) {
            w0[v] = _mm512_loadu_ps(w[v]);
            w1[v] = _mm512_loadu_ps((const float *)w[v] + 16);
        } else {
            __m512i p = _mm512_loadu_si512(w[v]);
            w0[v] = attn_bf16_even(p);
            w1[v] = attn_bf16_odd(p);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        __m512 x0 = _mm512_set1_ps(x[i * ldx]), x1 = _mm512_set1_ps(x[i * ldx + 1]);
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] =
            attn_bf16_pair_fma(a[i][v], x0, x1, w0[v], w1[v]);
    }
}

/* The n chunks of 16 pairs at src widened into dst, each as its 16 even
 * then its 16 odd floats, in their order. */
ATTN_FMA_TARGET static void widen_pairs(float *dst, const attn_bf16 *src, int n) {
    for (int c = 0; c < n; c++) {
        __m512i p = _mm512_loadu_si512(src + 32 * (size_t)c);
        _mm512_storeu_ps(dst + 32 * (size_t)c, attn_bf16_even(p));
        _mm512_storeu_ps(dst + 32 * (size_t)c + 16, attn_bf16_odd(p));
    }
}

/* The keys (or values) [j0, j0 + nkp) widened into dst, page after page:
 * key block b's pair dp at dst + (b D/2 + dp) 32, the value pair of key kk
 * (even, from j0) at widths d.. at dst + kk D + 2 d, as in their pages. */
static void widen_block(float *dst, const attn_kv_bf16 *kv, int D, int j0, int nkp, int values) {
    size_t at = values ? attn_kv_value_at(D, 0, 0) : attn_kv_key_at(D, 0, 0);
    for (int p = 0; p < nkp / ATTN_KV_PAGE; p++)
        widen_pairs(dst + (size_t)p * ATTN_KV_PAGE * D,
                    kv->head + (size_t)(j0 / ATTN_KV_PAGE + p) * kv->page + at, D);
}

/* dot_scores with qf, the group's rows of qg widened (stride D); on the
 * keys widened into kf (WIDE) or their pages. */
ATTN_FMA_TARGET VINLINE void fma_dot_scores(float *sc, const float *qf, int D,
                                            const attn_kv_bf16 *kv, const float *kf, int j0, int kc,
                                            int rows, const int NV, const int WIDE) {
    const attn_bf16 *kb[4];
    const float *kw[4];
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
        kb[v] = keys_at(kv, D, j0 + kc + 16 * v);
        kw[v] = kf + (size_t)((kc / 16 + v) * (D / 2)) * 32;
    }
    for (int r = 0; r < rows; r += 4) {
        __m512 a[4][4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] = _mm512_setzero_ps();
        for (int dp = 0; dp < D / 2; dp++) {
            const void *w[4];
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) w[v] =
                WIDE ? (const void *)(kw[v] + dp * 32) : (const void *)(kb[v] + dp * 32);
            fma_pairs(a, w, qf + (size_t)r * D + 2 * dp, (size_t)D, NV, WIDE);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(sc + (size_t)(r + i) * NK + kc + 16 * v, a[i][v]);
    }
}

/* dot_values with pf, pb widened (stride NK); on the values widened into
 * vf (WIDE) or their pages. */
ATTN_FMA_TARGET VINLINE void fma_dot_values(float *acc, const float *pf, int D,
                                            const attn_kv_bf16 *kv, const float *vf, int j0,
                                            int nkp, int rows, int d0, const int NV,
                                            const int WIDE) {
    for (int r = 0; r < rows; r += 4) {
        __m512 a[4][4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[i][v] =
                _mm512_loadu_ps(acc + (size_t)(r + i) * D + d0 + 16 * v);
        for (int kk = 0; kk < nkp; kk += 2) {
            const void *w[4];
            if (WIDE) {
                const float *vr = vf + (size_t)kk * D + 2 * d0;
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) w[v] = vr + 32 * v;
            } else {
                const attn_bf16 *vr = values_at(kv, D, j0 + kk, d0);
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) w[v] = vr + 32 * v;
            }
            fma_pairs(a, w, pf + (size_t)r * NK + kk, NK, NV, WIDE);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(acc + (size_t)(r + i) * D + d0 + 16 * v, a[i][v]);
    }
}

/* avx_scores on FMAs, from qf: the group's rows of qg widened; on the key
 * block widened into kf, or (kf NULL) on its pages. */
ATTN_FMA_TARGET static void fma_scores(float *sc, const float *qf, int D, const attn_kv_bf16 *kv,
                                       const float *kf, int j0, int nkp, int rows) {
    unsigned m = attn_flush_begin();
    int kc = 0;
    if (kf) {
        for (; kc + 64 <= nkp; kc += 64)
            fma_dot_scores(sc, qf, D, kv, kf, j0, kc, rows, 4, 1);
        if (kc < nkp) fma_dot_scores(sc, qf, D, kv, kf, j0, kc, rows, 2, 1);
    } else {
        for (; kc + 64 <= nkp; kc += 64)
            fma_dot_scores(sc, qf, D, kv, kf, j0, kc, rows, 4, 0);
        if (kc < nkp) fma_dot_scores(sc, qf, D, kv, kf, j0, kc, rows, 2, 0);
    }
    attn_flush_end(m);
}

/* avx_values on FMAs, from pf: the probabilities widened (softmax_row);
 * on the values widened into vf, or (vf NULL) on their pages. */
ATTN_FMA_TARGET static void fma_values(float *acc, const float *pf, int D, const attn_kv_bf16 *kv,
                                       const float *vf, int j0, int nkp, int rows) {
    unsigned m = attn_flush_begin();
    int d0 = 0;
    if (vf) {
        for (; d0 + 64 <= D; d0 += 64)
            fma_dot_values(acc, pf, D, kv, vf, j0, nkp, rows, d0, 4, 1);
        if (d0 < D) fma_dot_values(acc, pf, D, kv, vf, j0, nkp, rows, d0, 2, 1);
    } else {
        for (; d0 + 64 <= D; d0 += 64)
            fma_dot_values(acc, pf, D, kv, vf, j0, nkp, rows, d0, 4, 0);
        if (d0 < D) fma_dot_values(acc, pf, D, kv, vf, j0, nkp, rows, d0, 2, 0);
    }
    attn_flush_end(m);
}

/* ---- softmax ---------------------------------------------------------------------- */

/* Hides what the row at position pos may not see among the keys [j0, j0+nkp)
 * of its scores x, of which the first nk are keys of the sequence: HIDDEN,
 * finite, so that 2^(HIDDEN - c) is 0 without a NaN on the way. */
static void mask_row(float *x, const attn_seq *s, int pos, int j0, int nk, int nkp) {
    static const attn_mask_units units = {.log2 = 1, .hidden = HIDDEN};
    attn_mask_scores(x, 1, s, pos, j0, nk, &units);
    for (int c = nk; c < nkp; c++)
        x[c] = HIDDEN;
}

VEXP2_NEG_FUNCTION(exp2_neg, BF16K)

/* p (nkp) = bf16(2^(x - c)) for the scores x of one row, and pf = p
 * widened where pf is not NULL (the FMA form); returns the sum of the
 * unrounded values added to sum, and the largest score in *mx. */
BF16K VINLINE __m512 exp_pass(const float *x, attn_bf16 *p, float *pf, int nkp, float c, __m512 sum,
                              __m512 *mx) {
    __m512 neg = _mm512_set1_ps(-c), top = _mm512_set1_ps(HIDDEN);
    for (int v = 0; v < nkp; v += 32) {
        __m512 x0 = _mm512_loadu_ps(x + v), x1 = _mm512_loadu_ps(x + v + 16);
        top = _mm512_max_ps(top, _mm512_max_ps(x0, x1));
        __m512 p0 = exp2_neg(_mm512_add_ps(x0, neg)), p1 = exp2_neg(_mm512_add_ps(x1, neg));
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        __m512i b = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
        _mm512_storeu_si512(p + v, b);
        if (pf) {
            __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(b));
            __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(b, 1));
            _mm512_storeu_ps(pf + v, _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)));
            _mm512_storeu_ps(pf + v + 16, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
        }
    }
    *mx = top;
    return sum;
}

/* One row of a group: its scores x (nkp, log2 units, masked) become p
 * (bf16; and pf, p widened, unless NULL), and its maximum c, sum l (16
 * parts) and outputs acc (D) are brought up to date. One pass with the
 * row's c so far, which holds unless a score of the block passes it (then
 * again, with the block's c). */
BF16K static void softmax_row(const float *x, attn_bf16 *p, float *pf, float *acc, float *c,
                              float *l, int D, int nkp) {
    __m512 l0 = _mm512_loadu_ps(l), mx = _mm512_set1_ps(HIDDEN), sum;
    if (*c != -INFINITY) {
        sum = exp_pass(x, p, pf, nkp, *c, l0, &mx);
        if (!_mm512_cmp_ps_mask(mx, _mm512_set1_ps(*c), _CMP_GT_OQ)) {
            _mm512_storeu_ps(l, sum);
            return;
        }
    } else {
        for (int v = 0; v < nkp; v += 16)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + v));
    }
    float m = _mm512_reduce_max_ps(mx);
    if (m < SEEN) { /* nothing visible so far */
        memset(p, 0, sizeof(attn_bf16) * (size_t)nkp);
        if (pf) memset(pf, 0, sizeof(float) * (size_t)nkp);
        return;
    }
    float cn = ceilf(m); /* > c: 2^(c - cn) is exact, and 0 when c was -inf (acc, l are 0) */
    __m512 f = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_set1_ps(*c - cn));
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_mul_ps(f, _mm512_loadu_ps(acc + d)));
    *c = cn;
    _mm512_storeu_ps(l, exp_pass(x, p, pf, nkp, cn, _mm512_mul_ps(f, l0), &mx));
}

/* ---- the block ------------------------------------------------------------------- */

/* One call: the sequence and its rows. */
typedef struct {
    const attn_seq *s;
    const attn_kv_bf16 *kv;
    int i0, R, D, n; /* first position, heads per position, width, rows */
    int jend;        /* keys [jend, S) are hidden from every row (causal) */
    int masked;      /* any mask but causal */
    int path;
    int fma;  /* the AVX512-BF16 path's products on FMAs (bf16_fma.h) */
    int wide; /* on FMAs, each key block widened once for every row (more than 4) */
} bf16_call;

/* One step of a call: a key block against a group of rows. */
typedef struct {
    int j0, nk, nkp; /* first key, keys of the sequence in the block, keys computed (32s) */
    int g0, gn;      /* first row, rows (gn = 0: before the first step) */
} bf16_step;

/* The step after *st: the group's next key block, or the next group from
 * key 0 (each group of rows walks every key while its rows of qb and acc
 * stay in L1; keys and values come from L2); key blocks a causal group may
 * not see are skipped. Returns 0 when there is none. */
static int next_step(const bf16_call *k, bf16_step *st) {
    int j0 = st->gn ? st->j0 + NK : 0, g0 = st->gn ? st->g0 : 0;
    int gn = k->n - g0 < RG ? k->n - g0 : RG;
    if (j0 >= k->jend || (k->s->causal && j0 > k->i0 + (g0 + gn - 1) / k->R)) {
        j0 = 0; /* the group is done: later blocks are all in its future */
        g0 += RG;
        gn = k->n - g0 < RG ? k->n - g0 : RG;
    }
    if (g0 >= k->n) return 0;
    int nk = k->jend - j0 < NK ? k->jend - j0 : NK;
    *st = (bf16_step){j0, nk, (nk + 31) / 32 * 32, g0, gn};
    return 1;
}

/* The step's scores (not on FMAs: fma_step). */
static void step_scores(const bf16_call *k, const bf16_scratch *w, const bf16_step *st, float *sc) {
    const attn_bf16 *qg = w->qb + (size_t)st->g0 * k->D;
    if (k->path == ATTN_BF16_AMX)
        amx_scores(sc, qg, k->D, k->kv, st->j0, st->nkp, st->gn > 16);
    else
        avx_scores(sc, qg, k->D, k->kv, st->j0, st->nkp, (st->gn + 3) / 4 * 4);
}

/* The step's softmax and values, from its scores sc. */
static void step_rest(const bf16_call *k, bf16_scratch *w, const bf16_step *st, float *sc) {
    int D = k->D, g0 = st->g0, gn = st->gn, rows = gn > 16 ? 32 : 16;
    float *acc = w->acc + (size_t)g0 * D;
    int pos_lo = k->i0 + g0 / k->R; /* the group's first position */
    int causal = k->s->causal && st->j0 + st->nk - 1 > pos_lo;
    for (int r = 0; r < gn; r++) {
        float *x = sc + (size_t)r * NK;
        if (k->masked || causal || st->nk < st->nkp)
            mask_row(x, k->s, k->i0 + (g0 + r) / k->R, st->j0, st->nk, st->nkp);
        softmax_row(x, w->pb + (size_t)r * NK, k->fma ? w->pf + (size_t)r * NK : NULL,
                    acc + (size_t)r * D, w->c + g0 + r, w->l + (size_t)(g0 + r) * 16, D, st->nkp);
    }
    /* rows past the group that the values read: no weight (on FMAs pf's,
     * up to the next 4; else pb's, up to the tiles' 16 or 32) */
    for (int r = gn; k->fma && r < (gn + 3) / 4 * 4; r++)
        memset(w->pf + (size_t)r * NK, 0, sizeof(float) * (size_t)st->nkp);
    for (int r = gn; !k->fma && r < rows; r++)
        memset(w->pb + (size_t)r * NK, 0, sizeof(attn_bf16) * (size_t)st->nkp);
    if (k->path == ATTN_BF16_AMX)
        amx_values(acc, w->pb, D, k->kv, st->j0, st->nkp, gn > 16);
    else if (k->fma)
        fma_values(acc, w->pf, D, k->kv, k->wide ? w->vf : NULL, st->j0, st->nkp, (gn + 3) / 4 * 4);
    else
        avx_values(acc, w->pb, D, k->kv, st->j0, st->nkp, (gn + 3) / 4 * 4);
}

/* Every step; the scores of the next step are computed before the softmax
 * of this one, into the other score buffer, so that the tile unit has work
 * while the vector unit runs the softmax. */
static void run_steps(const bf16_call *k, bf16_scratch *w) {
    bf16_step cur = {0}, nxt;
    int have = next_step(k, &cur);
    if (have) step_scores(k, w, &cur, w->sc[0]);
    for (int b = 0; have; b ^= 1) {
        nxt = cur;
        int more = next_step(k, &nxt);
        if (more) step_scores(k, w, &nxt, w->sc[b ^ 1]);
        step_rest(k, w, &cur, w->sc[b]);
        cur = nxt;
        have = more;
    }
}

/* One step on FMAs. The group's queries are widened into qf at its first
 * key block, and at every block when the groups take turns. */
static void fma_step(const bf16_call *k, bf16_scratch *w, const bf16_step *st) {
    int rows4 = (st->gn + 3) / 4 * 4;
    if (st->j0 == 0 || k->n > RG)
        attn_bf16_widen(w->qf, w->qb + (size_t)st->g0 * k->D, (size_t)rows4 * k->D);
    fma_scores(w->sc[0], w->qf, k->D, k->kv, k->wide ? w->kf : NULL, st->j0, st->nkp, rows4);
    step_rest(k, w, st, w->sc[0]);
}

/* Every step on FMAs, key block after key block, each widened once (wide)
 * for every group of rows that sees it; a row's steps are the same, in the
 * same order, as group after group: the same bits. */
static void run_fma_steps(const bf16_call *k, bf16_scratch *w) {
    for (int j0 = 0; j0 < k->jend; j0 += NK) {
        int nk = k->jend - j0 < NK ? k->jend - j0 : NK, nkp = (nk + 31) / 32 * 32;
        if (k->wide) {
            widen_block(w->kf, k->kv, k->D, j0, nkp, 0);
            widen_block(w->vf, k->kv, k->D, j0, nkp, 1);
        }
        for (int g0 = 0; g0 < k->n; g0 += RG) {
            int gn = k->n - g0 < RG ? k->n - g0 : RG;
            if (k->s->causal && j0 > k->i0 + (g0 + gn - 1) / k->R) continue; /* its future */
            fma_step(k, w, &(bf16_step){j0, nk, nkp, g0, gn});
        }
    }
}

/* qb (rows rounded up to 32, D) = bf16(q * scale * log2(e)); acc, c, l start. */
static void rows_begin(bf16_scratch *w, const float *q, size_t ldq, int n, int R, int D,
                       float scale) {
    float qs = scale * LOG2E, row[256];
    int n32 = (n + RG - 1) / RG * RG;
    for (int r = 0; r < n; r++) {
        const float *src = q + (size_t)(r / R) * ldq + (size_t)(r % R) * D;
        for (int d = 0; d < D; d++)
            row[d] = src[d] * qs;
        attn_bf16_round(w->qb + (size_t)r * D, row, (size_t)D);
    }
    memset(w->qb + (size_t)n * D, 0, sizeof(attn_bf16) * (size_t)(n32 - n) * D);
    memset(w->acc, 0, sizeof(float) * (size_t)n32 * D);
    for (int r = 0; r < n; r++)
        w->c[r] = -INFINITY;
    memset(w->l, 0, sizeof(float) * 16 * (size_t)n);
}

static void rows_end(float *out, size_t ldo, const bf16_scratch *w, int n, int R, int D) {
    for (int r = 0; r < n; r++) {
        float l = 0;
        for (int i = 0; i < 16; i++)
            l += w->l[(size_t)r * 16 + i];
        float inv = l > 0 ? 1.0f / l : 0.0f; /* every key hidden: zeros */
        float *dst = out + (size_t)(r / R) * ldo + (size_t)(r % R) * D;
        for (int d = 0; d < D; d++)
            dst[d] = w->acc[(size_t)r * D + d] * inv;
    }
}

/* Positions [i0, i0+Lb) with Lb * R <= ROWS. */
static void block_rows(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                       const attn_seq *s, int i0, int Lb, int R, int D, float scale,
                       void *scratch) {
    bf16_call k = {.s = s, .kv = kv, .i0 = i0, .R = R, .D = D, .n = Lb * R, .jend = s->S};
    if (s->causal && k.jend > i0 + Lb) k.jend = i0 + Lb; /* later keys are hidden from all */
    k.masked = s->key_padding_mask || s->attn_mask_bool || s->attn_mask_add;
    k.path = attn_bf16_path();
    k.fma = k.path == ATTN_BF16_AVX512 && attn_bf16_fma();
    k.wide = k.fma && k.n > WIDEN_ROWS;
    bf16_scratch w = carve(scratch, D);
    rows_begin(&w, q, ldq, k.n, R, D, scale);
    if (k.path == ATTN_BF16_AMX) attn_amx_begin();
    if (k.fma)
        run_fma_steps(&k, &w);
    else
        run_steps(&k, &w);
    if (k.path == ATTN_BF16_AMX) attn_amx_end();
    rows_end(out, ldo, &w, k.n, R, D);
}

void attn_bf16_block(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                     const attn_seq *s, int i0, int Lb, int R, int D, float scale, void *scratch) {
    if (!attn_bf16_supported(D) || R > ROWS) {
        attn_bf16_block_ref(out, ldo, q, ldq, kv, s, i0, Lb, R, D, scale);
        return;
    }
    int per = ROWS / R; /* positions a pass over the keys takes */
    for (int p0 = 0; p0 < Lb; p0 += per)
        block_rows(out + (size_t)p0 * ldo, ldo, q + (size_t)p0 * ldq, ldq, kv, s, i0 + p0,
                   Lb - p0 < per ? Lb - p0 : per, R, D, scale, scratch);
}

/* ---- the reference ---------------------------------------------------------------- */

/* Score of key j for the row at pos with rounded query qh (D), log2 units;
 * -inf when hidden. */
static float ref_score(const float *qh, const attn_kv_bf16 *kv, const attn_seq *s, int pos, int j,
                       int D) {
    size_t m = (size_t)pos * s->S + (size_t)j;
    if ((s->causal && j > pos) || (s->key_padding_mask && s->key_padding_mask[j]) ||
        (s->attn_mask_bool && s->attn_mask_bool[m]))
        return -INFINITY;
    float x = 0.0f;
    for (int d = 0; d < D; d++) /* the product is exact: one rounding per step */
        x += qh[d] * attn_kv_key(kv, D, j, d);
    return s->attn_mask_add ? x + attn_bf16_mask_log2(s->attn_mask_add[m]) : x;
}

void attn_bf16_block_ref(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                         const attn_seq *s, int i0, int Lb, int R, int D, float scale) {
    for (int r = 0; r < Lb * R; r++) {
        int pos = i0 + r / R;
        const float *src = q + (size_t)(r / R) * ldq + (size_t)(r % R) * D;
        float *dst = out + (size_t)(r / R) * ldo + (size_t)(r % R) * D;
        float qh[256], acc[256] = {0}, m = -INFINITY, l = 0.0f;
        for (int d = 0; d < D; d++)
            qh[d] = attn_bf16_to_f32(attn_bf16_of_ftz(src[d] * (scale * LOG2E)));
        for (int j = 0; j < s->S; j++)
            m = fmaxf(m, ref_score(qh, kv, s, pos, j, D));
        float c = ceilf(m);
        for (int j = 0; m != -INFINITY && j < s->S; j++) {
            float p = exp2f(ref_score(qh, kv, s, pos, j, D) - c);
            float pb = attn_bf16_to_f32(attn_bf16_of_ftz(p));
            l += p;
            for (int d = 0; d < D; d++)
                acc[d] += pb * attn_kv_value(kv, D, j, d);
        }
        for (int d = 0; d < D; d++) /* every key hidden: zeros */
            dst[d] = l > 0 ? acc[d] / l : 0.0f;
    }
}
