/* bf16_fma.c - which of VDPBF16PS and two FMAs the AVX512-BF16 kernels
 * multiply with (bf16_fma.h), and MXCSR's flush modes for the FMAs.
 *
 * The measure times each form in the pattern of the kernels' inner step (4
 * rows of broadcasts against 4 vectors of pairs, 16 accumulators), on data
 * in L1, in alternating rounds, and keeps each one's best: about 0.5 ms once
 * per process, the first time anything asks (the daemon asks at a bf16 or
 * int8 model's load, for its log line; else the first forward's kernel).
 * The FMAs run where they took under 0.8 of VDPBF16PS's time; the choice
 * changes which instructions run, never a bit.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "../platform/cpu.h"
#include "bf16_fma.h"

#define BF16K __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

enum { STEPS = 4096, ROUNDS = 5 };

static int g_on = -1;  /* attn_bf16_fma_force */
static int g_measured; /* the measure's choice */
static double g_gain;  /* attn_bf16_fma_gain */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static volatile float g_sink; /* keeps the timed loops' sums */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

ATTN_FMA_TARGET static inline void zero(__m512 a[4][4]) {
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < 4; v++)
            a[i][v] = _mm512_setzero_ps();
}

/* The timed sums kept, so that no loop is left out. */
ATTN_FMA_TARGET static inline void keep(__m512 a[4][4]) {
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < 4; v++)
            sum = _mm512_add_ps(sum, a[i][v]);
    g_sink = _mm512_reduce_add_ps(sum);
}

/* STEPS steps of 4 rows x 4 vectors on VDPBF16PS; returns seconds. */
BF16K static double time_vdp(const attn_bf16 *k, const attn_bf16 *x) {
    __m512 a[4][4];
    zero(a);
    double t0 = now_s();
    for (int s = 0; s < STEPS; s++) {
        const attn_bf16 *kk = k + (size_t)(s & 15) * 128;
        __m512bh w[4];
        for (int v = 0; v < 4; v++)
            w[v] = (__m512bh)_mm512_loadu_si512(kk + 32 * v);
        for (int i = 0; i < 4; i++) {
            int32_t pair;
            memcpy(&pair, x + 2 * ((s + i) & 63), sizeof pair);
            __m512bh b = (__m512bh)_mm512_set1_epi32(pair);
            for (int v = 0; v < 4; v++)
                a[i][v] = _mm512_dpbf16_ps(a[i][v], b, w[v]);
        }
    }
    double t = now_s() - t0;
    keep(a);
    return t;
}

/* The same steps on FMAs (xf: x widened). */
ATTN_FMA_TARGET static double time_fma(const attn_bf16 *k, const float *xf) {
    __m512 a[4][4];
    zero(a);
    unsigned m = attn_flush_begin();
    double t0 = now_s();
    for (int s = 0; s < STEPS; s++) {
        const attn_bf16 *kk = k + (size_t)(s & 15) * 128;
        __m512 w0[4], w1[4];
        for (int v = 0; v < 4; v++) {
            __m512i w = _mm512_loadu_si512(kk + 32 * v);
            w0[v] = attn_bf16_even(w);
            w1[v] = attn_bf16_odd(w);
        }
        for (int i = 0; i < 4; i++) {
            const float *p = xf + 2 * ((s + i) & 63);
            __m512 x0 = _mm512_set1_ps(p[0]), x1 = _mm512_set1_ps(p[1]);
            for (int v = 0; v < 4; v++)
                a[i][v] = attn_bf16_pair_fma(a[i][v], x0, x1, w0[v], w1[v]);
        }
    }
    double t = now_s() - t0;
    attn_flush_end(m);
    keep(a);
    return t;
}

static void measure(void) {
    if (attn_bf16_level() < ATTN_BF16_AVX512) return;
    static attn_bf16 k[16 * 128 + 32] __attribute__((aligned(64)));
    static attn_bf16 x[130];
    static float xf[130];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        k[i] = (attn_bf16)(0x3F80 + (i * 37 % 127)); /* values near 1: no denormal slows either */
    for (int i = 0; i < 130; i++) {
        x[i] = (attn_bf16)(0x3F00 + (i * 11 % 127));
        xf[i] = attn_bf16_to_f32(x[i]);
    }
    double vdp = 1e9, fma = 1e9;
    for (int r = 0; r < ROUNDS; r++) {
        double a = time_vdp(k, x), b = time_fma(k, xf);
        vdp = a < vdp ? a : vdp;
        fma = b < fma ? b : fma;
    }
    g_gain = fma > 0 ? vdp / fma : 0;
    g_measured = g_gain > 1.25;
}

int attn_bf16_fma(void) {
    if (g_on >= 0) return g_on;
    pthread_once(&g_once, measure);
    return g_measured;
}

int attn_bf16_fma_force(int on) {
    int was = g_on;
    g_on = on;
    return was;
}

double attn_bf16_fma_gain(void) {
    pthread_once(&g_once, measure);
    return g_gain;
}

unsigned attn_flush_begin(void) {
    unsigned m = _mm_getcsr();
    _mm_setcsr(m | 0x8040); /* FTZ (bit 15) and DAZ (bit 6) */
    return m;
}

void attn_flush_end(unsigned mxcsr) {
    _mm_setcsr(mxcsr);
}

const char *attn_bf16_products(void) {
    if (attn_bf16_path() != ATTN_BF16_AVX512) return "";
    return attn_bf16_fma() ? "fma" : "vdpbf16ps";
}

double attn_bf16_products_gain(void) {
    return attn_bf16_fma_gain();
}

int attn_set_bf16_products(const char *name) {
    if (!name || strcmp(name, "auto") == 0)
        attn_bf16_fma_force(-1);
    else if (strcmp(name, "fma") == 0 || strcmp(name, "vdpbf16ps") == 0)
        attn_bf16_fma_force(strcmp(name, "fma") == 0);
    else
        return -1;
    return 0;
}
