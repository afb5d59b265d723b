/* bench_core.c - speed and memory of the attention core, printed as a table.
 *
 * For each shape (B sequences of L tokens, width E, H heads), self-attention
 * with no attention matrix asked for, for an fp32 model, (when the CPU has
 * bf16 kernels) a bf16 one and (when it has int8 kernels) an int8 one: the
 * median time of one attn_forward
 * over N runs after a warm-up, its rate in GFLOP/s and that rate as a share
 * of OpenBLAS sgemm's own rate measured in the same run with as many threads.
 * FLOPs = 8 T E^2 (the four projections, T = B L) + 4 B L^2 E (QK^T and AV).
 * Then the peak memory of one long forward beyond its weights, inputs and
 * outputs, next to attn_workspace_bytes for the same batch. The tables are
 * headed by the CPU's FMA peak, on a CPU with AVX512-BF16 also the peak of
 * its vdpbf16ps (what the AVX512-BF16 kernels can reach at most: half the
 * FMA peak on the Intel Xeon of bench/RESULTS.md), on a CPU with VNNI the
 * peak of its vpdpbusd (int8 multiply-adds, counted as two operations each
 * like an FMA's), and OpenBLAS sgemm's rate. An int8 table's % is its rate
 * (the whole layer's FLOPs) as a share of that vpdpbusd peak. The weights'
 * bytes of each precision of the memory shape, and their ratio to fp32's.
 * With int8 kernels, last, the int8 projections alone (each input row
 * quantized, then the 3E and E columns of the in- and out-projections on
 * the int8 kernel in use: 8 T E^2 operations) and their share of the
 * vpdpbusd peak: what the int8 road's own kernel reaches, apart from the
 * attention that int8 and bf16 models share (AMX-INT8 does not run on the
 * vpdpbusd units, so its share may pass 100 %).
 *
 *   build/bench/bench_core [--threads 1,2,N] [--seconds 1.5] [--fused on|off|both]
 *                          [--owner core|blas|both] [--proj packed|openblas|both]
 *                          [--clock wall|cpu] [--precision fp32|bf16|int8|both|all]
 *                          [--bf16-kernels amx-bf16|avx512-bf16]
 *                          [--int8-kernels amx-int8|avx512-vnni|avx-vnni] [--no-memory]
 *                          [--bf16-products vdpbf16ps|fma] [--shape I | --dims B,L,E,H]
 *   build/bench/bench_core --pauses 0,10,1000 [--shape I] [--threads N] [--json FILE]
 *
 * --pauses times a lone forward after each pause instead: the pool rested,
 * the pause slept, attn_ctx_wake (what attnd does once a request is
 * queued), then one forward, on the largest thread count, pinned as attnd
 * pins a pool that owns its CPUs. bench/bench_lone.py times the daemon's
 * lone requests after the same pauses (docs/performance.md, "A lone
 * request after a pause").
 *
 * Never part of the tests: timings depend on the machine and its load.
 * bench/bench_torch.py prints the same table for torch.
 */
#include "../core/attn.h"
#include "../core/kernels/gemm_int8.h"
#include "../server/base/cpus.h"
#include "bench_shapes.h"

#include <immintrin.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 8

/* The long forward whose memory is measured. */
static const shape g_mem_shape = {1, 8192, 512, 8};

/* --clock cpu: the process's CPU time instead of the wall clock, which
 * other work on a shared machine does not inflate (1 thread only: with
 * more, helpers' spinning counts too). */
static clockid_t g_clock = CLOCK_MONOTONIC;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint32_t g_seed = 12345;

static FILE *g_json; /* --json FILE: one line per table cell, for bench/compare.py */

/* Who owns the threads: 0 the core (attn_ctx_new(n), OpenBLAS at one
 * thread: what attnd does), 1 OpenBLAS (attn_ctx_new(1), OpenBLAS at n). */
static int g_blas_owns;

/* The precision the models ask for (attn_hparams.precision). */
static attn_precision g_precision = ATTN_FP32;

static float frand(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)(g_seed >> 8) / 8388608.0f - 1.0f;
}

static void fill(float *p, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
}

static double shape_flops(const shape *s) {
    double T = (double)s->B * s->L, E = s->E;
    return 8.0 * T * E * E + 4.0 * s->B * (double)s->L * s->L * E;
}

/* A model of random weights; returns 0 or -1 with err filled. */
static int make_model(attn_model *m, int E, int H, char *err, size_t errlen) {
    attn_hparams hp = {
        .embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 1, .precision = g_precision};
    if (attn_model_init(m, &hp, err, errlen) < 0) return -1;
    fill(m->mem, m->n_floats, 1.0f / sqrtf((float)E));
    return attn_model_pack(m, err, errlen);
}

/* The weights' bytes of the memory shape's model in each precision o runs,
 * and their ratio to fp32's (attn_model_bytes: packed weights and biases). */
static void print_weights(const int *precs, int n) {
    static const char *const names[] = {"fp32", "bf16", "int8"};
    attn_precision keep = g_precision;
    double fp32 = 0;
    char err[256];
    printf("weights of that model (E=%d):", g_mem_shape.E);
    for (int i = 0; i < n; i++) {
        attn_model m;
        g_precision = (attn_precision)precs[i];
        if (make_model(&m, g_mem_shape.E, g_mem_shape.H, err, sizeof err) < 0) {
            printf("  %s: %s", names[precs[i]], err);
            continue;
        }
        double b = (double)attn_model_bytes(&m);
        if (precs[i] == ATTN_FP32) fp32 = b;
        printf("  %s %.2f MiB", names[precs[i]], b / (1 << 20));
        if (fp32 > 0 && precs[i] != ATTN_FP32) printf(" (%.2fx fp32's)", b / fp32);
        attn_model_free(&m);
    }
    printf("\n");
    g_precision = keep;
}

/* A self-attention batch of B sequences of L tokens; inputs filled, output
 * touched, so that their pages count before any forward. */
typedef struct {
    attn_batch b;
    attn_seq *seqs;
    float *query; /* (T,E) */
    float *out;   /* (T,E) */
} bench_batch;

static int batch_new(bench_batch *bb, const shape *s) {
    size_t T = (size_t)s->B * s->L;
    memset(bb, 0, sizeof(*bb));
    bb->seqs = calloc(s->B, sizeof(attn_seq));
    bb->query = malloc(sizeof(float) * T * s->E);
    bb->out = malloc(sizeof(float) * T * s->E);
    if (!bb->seqs || !bb->query || !bb->out) return -1;
    for (int i = 0; i < s->B; i++) {
        bb->seqs[i].L = bb->seqs[i].S = s->L;
        bb->seqs[i].weights = ATTN_WEIGHTS_NONE;
    }
    fill(bb->query, T * s->E, 1.0f);
    fill(bb->out, T * s->E, 1.0f); /* not memset: malloc + memset(0) may become calloc */
    bb->b = (attn_batch){.B = s->B, .seqs = bb->seqs, .query = bb->query, .out = bb->out};
    return 0;
}

static void batch_free(bench_batch *bb) {
    free(bb->seqs);
    free(bb->query);
    free(bb->out);
    memset(bb, 0, sizeof(*bb));
}

/* OpenBLAS sgemm of n x n x n with `threads` BLAS threads, GFLOP/s (median
 * of a few runs). Leaves OpenBLAS single-threaded, as the core wants it. */
static double sgemm_rate(int threads, int n) {
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n);
    float *c = malloc(sizeof(float) * n * n);
    double t[5], rate = 0;
    if (!a || !b || !c) goto cleanup;
    fill(a, (size_t)n * n, 1.0f);
    fill(b, (size_t)n * n, 1.0f);
    attn_blas_set_threads(threads);
    attn_blas_sgemm(c, a, b, n, n, n); /* warm-up */
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        // a (n,n) @ b (n,n) -> c (n,n)
        attn_blas_sgemm(c, a, b, n, n, n);
        t[r] = now_s() - t0;
    }
    attn_blas_set_threads(1);
    rate = 2.0 * n * n * (double)n / median(t, 5) / 1e9;
cleanup:
    free(a);
    free(b);
    free(c);
    return rate;
}

/* Median seconds of one forward of shape s with `threads` threads; runs in
 * *runs. Returns -1 on error (message printed). */
static double time_forward(const shape *s, int threads, double budget, int *runs) {
    char err[256] = "";
    attn_model m = {0};
    bench_batch bb;
    attn_ctx *ctx = NULL;
    double *t = NULL, med = -1;
    memset(&bb, 0, sizeof(bb));
    if (make_model(&m, s->E, s->H, err, sizeof(err)) < 0 || batch_new(&bb, s) < 0 ||
        !(ctx = attn_ctx_new(g_blas_owns ? 1 : threads))) {
        fprintf(stderr, "bench_core: setup failed: %s\n", err[0] ? err : "out of memory");
        goto cleanup;
    }
    if (g_blas_owns) attn_blas_set_threads(threads); /* after attn_ctx_new, which sets 1 */
    double t0 = now_s();
    if (attn_forward(ctx, &m, &bb.b, err, sizeof(err)) < 0) { /* warm-up */
        fprintf(stderr, "bench_core: %s\n", err);
        goto cleanup;
    }
    double once = now_s() - t0;
    int n = (int)(budget / (once > 1e-6 ? once : 1e-6));
    n = n < 3 ? 3 : n > 200 ? 200 : n;
    t = malloc(sizeof(double) * n);
    if (!t) goto cleanup;
    for (int r = 0; r < n; r++) {
        t0 = now_s();
        attn_forward(ctx, &m, &bb.b, err, sizeof(err));
        t[r] = now_s() - t0;
    }
    med = median(t, n);
    *runs = n;
cleanup:
    attn_blas_set_threads(1);
    free(t);
    attn_ctx_free(ctx);
    batch_free(&bb);
    attn_model_free(&m);
    return med;
}

/* ---- FMA peak: independent FMA chains on every thread ---- */

enum { PEAK_ITERS = 20000000 };

#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));

/* 12 independent accumulators, enough to cover FMA latency; returns a sum
 * so the loop is not removed. FLOPs: 2 * 12 * lanes per iteration. */
#define PEAK_KERNEL(name, type, attr)                                                              \
    attr static float name(long iters) {                                                           \
        type a[12], x = (type){} + 0.999999f, y = (type){} + 1e-7f;                                \
        for (int i = 0; i < 12; i++)                                                               \
            a[i] = (type){} + (float)i;                                                            \
        for (long k = 0; k < iters; k++)                                                           \
            for (int i = 0; i < 12; i++)                                                           \
                a[i] = a[i] * x + y;                                                               \
        type s = (type){};                                                                         \
        for (int i = 0; i < 12; i++)                                                               \
            s += a[i];                                                                             \
        return s[0];                                                                               \
    }
PEAK_KERNEL(peak512, v16, __attribute__((target("avx512f,fma"))))
PEAK_KERNEL(peak256, v8, __attribute__((target("avx2,fma"))))

/* The same for vdpbf16ps: each instruction adds the products of 32 bf16
 * pairs into 16 fp32 lanes (64 FLOPs), the AVX512-BF16 kernels' inner step. */
__attribute__((target("avx512f,avx512bf16"))) static float peak_bf16(long iters) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

/* The same for vpdpbusd: 64 byte products summed into 16 int32 lanes (128
 * operations), the AVX512-VNNI kernels' inner step (AVX-VNNI: half, on 256
 * bits). */
__attribute__((target("avx512f,avx512vnni"))) static int peak_vnni(long iters) {
    __m512i a[12];
    __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_epi32(i);
    for (long k = 0; k < iters; k++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] =
            _mm512_dpbusd_epi32(a[i], x, y);
    __m512i s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_epi32(s, a[i]);
    return _mm512_reduce_add_epi32(s);
}

__attribute__((target("avx2,avxvnni"))) static int peak_vnni256(long iters) {
    __m256i a[12];
    __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_epi32(i);
    for (long k = 0; k < iters; k++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] =
            _mm256_dpbusd_avx_epi32(a[i], x, y);
    for (int i = 1; i < 12; i++)
        a[0] = _mm256_add_epi32(a[0], a[i]);
    int out[8];
    _mm256_storeu_si256((__m256i *)out, a[0]);
    return out[0];
}

static double g_vnni_peak[8]; /* vpdpbusd GOP/s at each --threads count (print_rates) */
static int g_peak_lanes;      /* 16, 8, or 0 when the CPU has no FMA; 32: vdpbf16ps; 64 (-32):
                                 vpdpbusd on 512 (256) bits */
static volatile float g_peak_sink;

static void peak_task(void *arg, int task, int thread) {
    (void)arg, (void)task, (void)thread;
    g_peak_sink = g_peak_lanes == 64    ? (float)peak_vnni(PEAK_ITERS)
                  : g_peak_lanes == -32 ? (float)peak_vnni256(PEAK_ITERS)
                  : g_peak_lanes == 32  ? peak_bf16(PEAK_ITERS)
                  : g_peak_lanes == 16  ? peak512(PEAK_ITERS)
                                        : peak256(PEAK_ITERS);
}

/* GFLOP/s of FMAs on `threads` threads at once (0 without FMA); with kind
 * 1, of vdpbf16ps (0 without AVX512-BF16); with kind 2, GOP/s of vpdpbusd
 * (0 without VNNI). */
static double fma_peak(int threads, int kind) {
    attn_cpu c;
    attn_cpu_detect(&c);
    const char *k8 = attn_int8_cpu_kernels();
    int vnni512 = strcmp(k8, "avx512-vnni") == 0 || strcmp(k8, "amx-int8") == 0;
    g_peak_lanes = kind == 2         ? (vnni512                       ? 64
                                        : strcmp(k8, "avx-vnni") == 0 ? -32
                                                                      : 0)
                   : kind == 1       ? (c.avx512bf16 ? 32 : 0)
                   : c.avx512f       ? 16
                   : c.avx2 && c.fma ? 8
                                     : 0;
    if (!g_peak_lanes) return 0;
    attn_ctx *ctx = attn_ctx_new(threads);
    if (!ctx) return 0;
    attn_ctx_parallel(ctx, threads, peak_task, NULL); /* warm-up: clocks settle */
    double t0 = now_s();
    attn_ctx_parallel(ctx, threads, peak_task, NULL);
    double sec = now_s() - t0;
    attn_ctx_free(ctx);
    int lanes = g_peak_lanes < 0 ? -g_peak_lanes : g_peak_lanes;
    return 2.0 * 12 * lanes * (double)PEAK_ITERS * threads / sec / 1e9;
}

/* One value of /proc/self/status in kB ("VmHWM", "VmRSS"), or -1. */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    if (!f) return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Resets the peak RSS to the current RSS; 0 when the kernel allows it. */
static int reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Peak memory of one forward of g_mem_shape beyond weights, inputs and
 * outputs. They are allocated and touched first; a throwaway context runs
 * the same forward once, so that OpenBLAS's own buffers (allocated once per
 * process, touched further as matrices grow) are resident; then a fresh
 * context's first forward runs between a reset of the peak RSS and its
 * reading, so the rise is the core's scratch (malloc returns big blocks to
 * the system on free: see main). */
static void measure_memory(int threads) {
    const shape *s = &g_mem_shape;
    char err[256] = "";
    attn_model m = {0};
    bench_batch bb;
    memset(&bb, 0, sizeof(bb));
    attn_ctx *ctx = NULL;
    if (make_model(&m, s->E, s->H, err, sizeof(err)) < 0 || batch_new(&bb, s) < 0 ||
        !(ctx = attn_ctx_new(threads))) {
        fprintf(stderr, "bench_core: setup failed: %s\n", err[0] ? err : "out of memory");
        goto cleanup;
    }
    if (attn_forward(ctx, &m, &bb.b, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_core: %s\n", err);
        goto cleanup;
    }
    attn_ctx_free(ctx);
    if (!(ctx = attn_ctx_new(threads))) {
        fprintf(stderr, "bench_core: no context\n");
        goto cleanup;
    }
    int reset = reset_peak() == 0;
    long base = reset ? status_kb("VmHWM") : status_kb("VmRSS");
    double t0 = now_s();
    if (attn_forward(ctx, &m, &bb.b, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_core: %s\n", err);
        goto cleanup;
    }
    double secs = now_s() - t0;
    long peak = status_kb("VmHWM");
    size_t ws = attn_workspace_bytes(&m, &bb.b, threads);
    double rise = (peak - base) / 1024.0;
    printf("  threads %d: forward %.2f s, peak RSS +%.1f MiB over weights+inputs+outputs "
           "(%.1f MiB); attn_workspace_bytes %.1f MiB%s%s\n",
           threads, secs, rise, (m.n_floats + 2.0 * s->B * s->L * s->E) * sizeof(float) / 1048576.0,
           ws / 1048576.0, reset ? "" : " (peak not resettable: VmHWM - VmRSS)",
           rise > ws / 1048576.0 + 1.0 ? " (rise above the workspace bound)" : "");
cleanup:
    attn_ctx_free(ctx);
    batch_free(&bb);
    attn_model_free(&m);
}

static int g_only_shape = -1; /* --shape: the one shape to run; -1: all; NSHAPES: --dims */
static shape g_dims;          /* --dims: the one shape to run, given */

/* The tables' shape i (0 to NSHAPES, the last --dims's place), or NULL
 * where the command line left it out. */
static const shape *shape_run(int i) {
    if (g_only_shape == NSHAPES) return i == NSHAPES ? &g_dims : NULL;
    if (i == NSHAPES || (g_only_shape >= 0 && i != g_only_shape)) return NULL;
    return &g_shapes[i];
}

#define MAX_PAUSES 8

/* Sleeps ms milliseconds (none for 0). */
static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Pins ctx's threads as attnd does with workers.pin_threads at auto (its
 * own rule: attnd_threads_resolve). 1 when pinned. */
static int pin_like_attnd(attn_ctx *ctx, int threads) {
    attnd_cpus c;
    attnd_config cfg = {.worker_threads = threads};
    int cpus[1024];
    char note[256], err[256];
    attnd_cpus_count(&c);
    attnd_threads_resolve(&cfg, &c, note, sizeof(note));
    int n = cfg.pin ? attnd_cpus_list(cpus, 1024) : 0;
    return n > 0 && attn_ctx_bind(ctx, cpus, n, err, sizeof(err)) == 0;
}

/* Median, min and max ms of `runs` lone forwards of shape s, each after the
 * pool rested for pause_ms and was woken; -1 on error (message printed). */
static double time_after_pause(attn_ctx *ctx, const shape *s, double pause_ms, int runs, double *lo,
                               double *hi) {
    char err[256] = "";
    attn_model m = {0};
    bench_batch bb;
    double t[64], med = -1;
    memset(&bb, 0, sizeof(bb));
    if (make_model(&m, s->E, s->H, err, sizeof(err)) < 0 || batch_new(&bb, s) < 0) {
        fprintf(stderr, "bench_core: setup failed: %s\n", err[0] ? err : "out of memory");
        goto cleanup;
    }
    for (int r = -1; r < runs; r++) { /* r = -1: a warm-up */
        attn_ctx_rest(ctx);
        sleep_ms(pause_ms);
        attn_ctx_wake(ctx);
        double t0 = now_s();
        if (attn_forward(ctx, &m, &bb.b, err, sizeof(err)) < 0) {
            fprintf(stderr, "bench_core: %s\n", err);
            goto cleanup;
        }
        if (r >= 0) t[r] = (now_s() - t0) * 1e3;
    }
    med = median(t, runs); /* sorts t */
    *lo = t[0];
    *hi = t[runs - 1];
cleanup:
    batch_free(&bb);
    attn_model_free(&m);
    return med;
}

/* --pauses: one line per shape and pause; 30 forwards per pause, 10 from
 * a second up. */
static int run_pauses(const double *pauses, int np, int threads) {
    attn_ctx *ctx = attn_ctx_new(threads);
    if (!ctx) return -1;
    int pinned = pin_like_attnd(ctx, threads);
    printf("a lone forward after a pause (pool rested, pause, attn_ctx_wake, forward), "
           "%d threads%s; median ms (min, max) over N:\n",
           threads, pinned ? ", pinned" : "");
    printf("%4s %5s %5s %3s | %9s %4s %9s %9s %9s\n", "B", "L", "E", "H", "pause ms", "N", "ms",
           "min", "max");
    for (int i = 0; i <= NSHAPES; i++) {
        const shape *s = shape_run(i);
        if (!s) continue;
        for (int p = 0; p < np; p++) {
            int runs = pauses[p] >= 1000 ? 10 : 30;
            double lo, hi, med = time_after_pause(ctx, s, pauses[p], runs, &lo, &hi);
            if (med < 0) {
                attn_ctx_free(ctx);
                return -1;
            }
            printf("%4d %5d %5d %3d | %9g %4d %9.2f %9.2f %9.2f\n", s->B, s->L, s->E, s->H,
                   pauses[p], runs, med, lo, hi);
            fflush(stdout);
            if (g_json)
                fprintf(g_json,
                        "{\"impl\": \"attnd-core-paused\", \"shape\": [%d, %d, %d, %d], "
                        "\"threads\": %d, \"pause_ms\": %g, \"ms\": %.4f}\n",
                        s->B, s->L, s->E, s->H, threads, pauses[p], med);
        }
    }
    attn_ctx_free(ctx);
    return 0;
}

/* One row per shape, one group of columns per thread count. */
static void print_table(const int *threads, int nt, const double *gemm, double budget) {
    printf("%4s %5s %5s %3s", "B", "L", "E", "H");
    for (int t = 0; t < nt; t++)
        printf(" | %2dt %4s %9s %8s %5s", threads[t], "N", "ms", "GFLOP/s", "%");
    printf("\n");
    for (int i = 0; i <= NSHAPES; i++) {
        const shape *s = shape_run(i);
        if (!s) continue;
        printf("%4d %5d %5d %3d", s->B, s->L, s->E, s->H);
        fflush(stdout);
        for (int t = 0; t < nt; t++) {
            int runs = 0;
            double sec = time_forward(s, threads[t], budget, &runs);
            if (sec < 0) {
                printf(" | %2s %4s %9s %8s %5s", "", "-", "failed", "-", "-");
                continue;
            }
            double rate = shape_flops(s) / sec / 1e9;
            if (g_json)
                fprintf(g_json,
                        "{\"impl\": \"%s\", \"shape\": [%d, %d, %d, %d], \"threads\": %d, "
                        "\"ms\": %.4f}\n",
                        g_precision == ATTN_INT8   ? "attnd-int8"
                        : g_precision == ATTN_BF16 ? "attnd-bf16"
                                                   : "attnd",
                        s->B, s->L, s->E, s->H, threads[t], sec * 1e3);
            double base = g_precision == ATTN_INT8 ? g_vnni_peak[t] : gemm[t];
            if (base > 0)
                printf(" | %3s %4d %9.2f %8.1f %5.1f", "", runs, sec * 1e3, rate,
                       100.0 * rate / base);
            else
                printf(" | %3s %4d %9.2f %8.1f %5s", "", runs, sec * 1e3, rate, "-");
            fflush(stdout);
        }
        printf("\n");
    }
}

/* An option of two settings and "both": v one of them keeps set[] to that
 * one (n 1), "both" runs the two (n 2). -1 for another word. */
static int one_or_both(const char *v, const char *first, const char *second, int set[2], int *n) {
    if (strcmp(v, first) == 0 || strcmp(v, second) == 0) {
        set[0] = strcmp(v, first) == 0 ? set[0] : set[1];
        *n = 1;
        return 0;
    }
    if (strcmp(v, "both") != 0) return -1;
    *n = 2;
    return 0;
}

static int usage(void) { /* 2: the exit code of a bad command line */
    fprintf(stderr,
            "usage: bench_core [--threads 1,2,N] [--seconds S] [--fused on|off|both] "
            "[--shape I] [--no-memory] [--pauses MS,MS]\n"
            "  --threads   thread counts to compare, comma separated (default 1, 2, all CPUs)\n"
            "  --seconds   time budget per table cell (default 1.5)\n"
            "  --fused     the fused attention kernel: on (default, where the CPU has\n"
            "              it), off (OpenBLAS tiles), or both (one table each)\n"
            "  --owner     who owns the threads: core (default: the core's own threads,\n"
            "              OpenBLAS at one), blas (one core thread, OpenBLAS at n),\n"
            "              or both (one table each)\n"
            "  --proj      projections: packed (default: the core's kernel on weights\n"
            "              packed at load), openblas (OpenBLAS sgemm), or both\n"
            "  --clock     wall (default) or cpu: the process's CPU time, for one\n"
            "              thread on a machine shared with other work\n"
            "  --precision fp32, bf16 (the bf16 kernels this CPU runs), int8 (its int8\n"
            "              kernels), both (fp32 and bf16) or all (default: every one\n"
            "              this CPU has kernels for)\n"
            "  --bf16-kernels amx-bf16|avx512-bf16  cap the bf16 kernels (default: the\n"
            "              best this CPU has), to compare them\n"
            "  --int8-kernels amx-int8|avx512-vnni|avx-vnni  cap the int8 kernels\n"
            "  --bf16-products vdpbf16ps|fma  how the avx512-bf16 kernels multiply\n"
            "              (default: as measured at start; the same bits either way)\n"
            "  --print threads|blas-core|shapes  print the default thread counts, the\n"
            "              OpenBLAS kernels the core loads or the indexes of --shape,\n"
            "              and exit\n"
            "  --json FILE append one JSON line per cell (bench/compare.py reads them)\n"
            "  --shape I   run only shape I (0-%d) of bench_shapes.h, so that make bench\n"
            "              can time every implementation on one shape before the next\n"
            "  --dims B,L,E,H  run only this shape (B sequences of L tokens, width E,\n"
            "              H heads) instead of bench_shapes.h's\n"
            "  --no-rates  skip the FMA peak and sgemm rates (%% then shows -)\n"
            "  --no-memory skip the peak-memory measurement\n"
            "  --pauses MS,MS,...  instead of the tables: a lone forward after each\n"
            "              pause in ms (pool rested, pause, woken, forward) on the\n"
            "              largest --threads count, pinned as attnd pins\n",
            NSHAPES - 1);
    return 2;
}

/* What the command line asks for. */
typedef struct {
    int threads[MAX_THREADS], nt; /* thread counts to compare */
    int fused[2], nf;             /* settings of attn_set_fused to run */
    int owners[2], no;            /* settings of g_blas_owns to run */
    int projs[2], np;             /* settings of attn_set_projections to run */
    int precs[3], npr;            /* precisions: fp32, bf16 and int8 where the CPU has them */
    double budget;                /* seconds per table cell */
    int memory;                   /* 1: measure one forward's memory */
    int rates;                    /* 1: measure the FMA peak and sgemm's rate */
    const char *print_what;       /* --print: threads, blas-core or shapes, then exit */
    double pauses[MAX_PAUSES];    /* --pauses: ms before each lone forward */
    int npauses;                  /* 0: the tables */
} bench_opts;

/* --threads 1,2,N into o; -1 when it is not such a list. */
static int parse_threads(char *p, bench_opts *o) {
    o->nt = 0;
    while (*p && o->nt < MAX_THREADS) {
        o->threads[o->nt] = (int)strtol(p, &p, 10);
        if (o->threads[o->nt] < 1 || (*p && *p != ',')) return -1;
        o->nt++;
        if (*p == ',') p++;
    }
    return o->nt ? 0 : -1;
}

/* --pauses 0,10,1000 into o; -1 when it is not such a list. */
static int parse_pauses(const char *p, bench_opts *o) {
    char *end;
    o->npauses = 0;
    while (*p && o->npauses < MAX_PAUSES) {
        double v = strtod(p, &end);
        if (end == p || v < 0 || v > 60000 || (*end && *end != ',')) return -1;
        o->pauses[o->npauses++] = v;
        p = *end ? end + 1 : end;
    }
    return o->npauses && !*p ? 0 : -1;
}

/* The precisions this CPU has kernels for, into o (fp32 always). */
static void every_precision(bench_opts *o) {
    o->npr = 0;
    o->precs[o->npr++] = ATTN_FP32;
    if (strcmp(attn_bf16_kernels(), "none") != 0) o->precs[o->npr++] = ATTN_BF16;
    if (strcmp(attn_int8_kernels(), "none") != 0) o->precs[o->npr++] = ATTN_INT8;
}

/* --precision fp32|bf16|int8|both|all into o; -1 for another word. */
static int parse_precision(const char *v, bench_opts *o) {
    static const char *const names[] = {"fp32", "bf16", "int8"};
    for (int p = 0; p < 3; p++)
        if (strcmp(v, names[p]) == 0) {
            o->precs[0] = p;
            o->npr = 1;
            return 0;
        }
    if (strcmp(v, "both") == 0) {
        o->precs[0] = ATTN_FP32;
        o->precs[1] = ATTN_BF16;
        o->npr = 2;
        return 0;
    }
    if (strcmp(v, "all") != 0) return -1;
    every_precision(o);
    return 0;
}

/* argv[i] and its value into o (the clock and --json into their globals);
 * the index of the last argument it took, or -1 for a bad one. */
static int parse_arg(int argc, char **argv, int i, bench_opts *o) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (strcmp(a, "--no-memory") == 0) {
        o->memory = 0;
        return i;
    }
    if (strcmp(a, "--no-rates") == 0) {
        o->rates = 0;
        return i;
    }
    if (!v) return -1;
    if (strcmp(a, "--threads") == 0)
        bad = parse_threads(argv[i + 1], o);
    else if (strcmp(a, "--shape") == 0) {
        char *end;
        g_only_shape = (int)strtol(v, &end, 10);
        bad = *end || end == v || g_only_shape < 0 || g_only_shape >= NSHAPES ? -1 : 0;
    } else if (strcmp(a, "--dims") == 0) {
        shape *d = &g_dims;
        bad = sscanf(v, "%d,%d,%d,%d", &d->B, &d->L, &d->E, &d->H) != 4 || d->B < 1 || d->L < 1 ||
                      d->H < 1 || d->E < d->H || d->E % d->H
                  ? -1
                  : 0;
        g_only_shape = NSHAPES;
    } else if (strcmp(a, "--seconds") == 0)
        o->budget = atof(v);
    else if (strcmp(a, "--pauses") == 0)
        bad = parse_pauses(v, o);
    else if (strcmp(a, "--fused") == 0)
        bad = one_or_both(v, "on", "off", o->fused, &o->nf);
    else if (strcmp(a, "--owner") == 0)
        bad = one_or_both(v, "core", "blas", o->owners, &o->no);
    else if (strcmp(a, "--proj") == 0)
        bad = one_or_both(v, "packed", "openblas", o->projs, &o->np);
    else if (strcmp(a, "--precision") == 0)
        bad = parse_precision(v, o);
    else if (strcmp(a, "--clock") == 0 && (strcmp(v, "cpu") == 0 || strcmp(v, "wall") == 0))
        g_clock = strcmp(v, "cpu") == 0 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    else if (strcmp(a, "--bf16-kernels") == 0)
        bad = attn_set_bf16_kernels(v);
    else if (strcmp(a, "--int8-kernels") == 0)
        bad = attn_set_int8_kernels(v);
    else if (strcmp(a, "--bf16-products") == 0)
        bad = attn_set_bf16_products(v);
    else if (strcmp(a, "--print") == 0)
        o->print_what = v; /* for make bench's other benchmarks */
    else if (strcmp(a, "--json") != 0)
        bad = -1;
    else if ((g_json = fopen(v, "a")) == NULL) {
        perror(v);
        bad = -1;
    }
    return bad < 0 ? -1 : i + 1;
}

/* The command line into o: 0, or 2 (the exit code) after saying why. */
static int parse_args(int argc, char **argv, bench_opts *o) {
    attnd_cpus cpus; /* the daemon's count: affinity mask and cgroup quota */
    attnd_cpus_count(&cpus);
    *o = (bench_opts){.threads = {1, 2},
                      .nt = 2,
                      .fused = {1, 0},
                      .nf = 1,
                      .owners = {0, 1},
                      .no = 1,
                      .projs = {ATTN_PROJ_PACKED, ATTN_PROJ_OPENBLAS},
                      .np = 1,
                      .budget = 1.5,
                      .memory = 1,
                      .rates = 1};
    if (cpus.n > 2 && cpus.n < 1024) o->threads[o->nt++] = cpus.n; /* 1, 2 and every CPU */
    every_precision(o);
    for (int i = 1; i < argc; i++)
        if ((i = parse_arg(argc, argv, i, o)) < 0) return usage();
    return o->budget > 0 ? 0 : usage();
}

/* The CPU's FMA peak and OpenBLAS's sgemm rate at each thread count (gemm). */
static void print_rates(const bench_opts *o, double *gemm) {
    attn_cpu cpu;
    attn_cpu_detect(&cpu);
    printf("FMA peak (%s, independent chains):", cpu.avx512f ? "AVX-512" : "AVX2");
    for (int t = 0; t < o->nt; t++) {
        double pk = fma_peak(o->threads[t], 0);
        printf("  %d thread%s %.1f GFLOP/s", o->threads[t], o->threads[t] > 1 ? "s" : "", pk);
    }
    printf("\n");
    if (cpu.avx512bf16) { /* what the AVX512-BF16 kernels can reach at most */
        printf("vdpbf16ps peak (AVX512-BF16, independent chains):");
        for (int t = 0; t < o->nt; t++)
            printf("  %d thread%s %.1f GFLOP/s", o->threads[t], o->threads[t] > 1 ? "s" : "",
                   fma_peak(o->threads[t], 1));
        printf("\n");
    }
    const char *k8 = attn_int8_cpu_kernels();
    if (strcmp(k8, "none") != 0) { /* what the VNNI kernels can reach at most */
        printf("vpdpbusd peak (%s, independent chains, GOP/s):",
               strcmp(k8, "avx-vnni") == 0 ? "AVX-VNNI" : "AVX512-VNNI");
        for (int t = 0; t < o->nt; t++) {
            g_vnni_peak[t] = fma_peak(o->threads[t], 2);
            printf("  %d thread%s %.1f", o->threads[t], o->threads[t] > 1 ? "s" : "",
                   g_vnni_peak[t]);
        }
        printf("\n");
    }
    printf("sgemm 2048^3 (OpenBLAS):");
    for (int t = 0; t < o->nt; t++) {
        gemm[t] = sgemm_rate(o->threads[t], 2048);
        printf("  %d thread%s %.1f GFLOP/s", o->threads[t], o->threads[t] > 1 ? "s" : "", gemm[t]);
    }
    printf("\nFLOPs = 8*T*E^2 + 4*B*L^2*E; median ms over N runs; %% = share of sgemm's rate "
           "(int8 tables: of the vpdpbusd peak)\n");
}

/* ---- the int8 projections alone ---- */
typedef struct {
    const attn_packed_int8 *w[2]; /* the in- (3E, E) and out-projection (E, E) */
    const float *x;               /* (T, E) inputs */
    uint8_t *a;                   /* prepared rows, T rounded up to ATTN_INT8_ROWPAD */
    float *c[2];                  /* (T, 3E) and (T, E) */
    size_t T, lda, per;           /* rows, bytes a prepared row, rows a task */
    int E;
} proj8_job;

/* The forward's tiles (core/tasks/proj.c): 192 rows by 16 panels. */
enum { P8_ROWS = 192, P8_PANELS = 16 };

/* Task: its own rows (a multiple of ATTN_INT8_ROWPAD, so that no task
 * writes rows another's tiles read) quantized. */
static void prep8_task(void *arg, int task, int thread) {
    (void)thread;
    proj8_job *j = arg;
    size_t r0 = (size_t)task * j->per, r1 = r0 + j->per < j->T ? r0 + j->per : j->T;
    for (size_t r = r0; r < r1; r++)
        attn_int8_prepare_row(j->a + r * j->lda, j->x + r * (size_t)j->E, j->E);
}

static int tiles8(const proj8_job *j, int p) {
    int rb = (int)((j->T + P8_ROWS - 1) / P8_ROWS);
    return rb * ((j->w[p]->panels + P8_PANELS - 1) / P8_PANELS);
}

/* Task: one tile of one projection, column block by column block as the
 * forward takes them. */
static void proj8_task(void *arg, int task, int thread) {
    (void)thread;
    proj8_job *j = arg;
    int p = task < tiles8(j, 0) ? 0 : 1, t = p ? task - tiles8(j, 0) : task;
    int rb = (int)((j->T + P8_ROWS - 1) / P8_ROWS);
    size_t r0 = (size_t)(t % rb) * P8_ROWS, r1 = r0 + P8_ROWS < j->T ? r0 + P8_ROWS : j->T;
    int j0 = t / rb * P8_PANELS, j1 = j0 + P8_PANELS;
    gemm_int8_tile(j->c[p], (size_t)j->w[p]->N, j->a, j->lda, j->w[p], r0, r1, j0,
                   j1 < j->w[p]->panels ? j1 : j->w[p]->panels);
}

/* Both loops of the projections, as a forward runs them. */
static void proj8_run(attn_ctx *ctx, proj8_job *j, int nprep) {
    attn_ctx_parallel(ctx, nprep, prep8_task, j);
    attn_ctx_parallel(ctx, tiles8(j, 0) + tiles8(j, 1), proj8_task, j);
}

/* Median seconds of the projections of shape s on `threads` threads; -1 on
 * error. */
static double time_proj8(const shape *s, int threads, double budget) {
    size_t T = (size_t)s->B * s->L, E = (size_t)s->E;
    size_t Tp = (T + ATTN_INT8_ROWPAD - 1) / ATTN_INT8_ROWPAD * ATTN_INT8_ROWPAD;
    attn_packed_int8 w[2] = {{0}};
    proj8_job j = {.w = {&w[0], &w[1]}, .T = T, .E = s->E, .lda = attn_int8_row_bytes(s->E)};
    float *wf = malloc(sizeof(float) * 4 * E * E), *bias = calloc(3 * E, sizeof(float));
    float *x = malloc(sizeof(float) * T * E);
    j.a = calloc(Tp + ATTN_INT8_ROWPAD, j.lda);
    j.c[0] = malloc(sizeof(float) * T * 3 * E);
    j.c[1] = malloc(sizeof(float) * T * E);
    attn_ctx *ctx = attn_ctx_new(threads);
    double med = -1, t[200];
    unsigned u = 12345;
    if (!wf || !bias || !x || !j.a || !j.c[0] || !j.c[1] || !ctx) goto done;
    for (size_t i = 0; i < 4 * E * E; i++)
        wf[i] = (float)((u = u * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < T * E; i++)
        x[i] = (float)((u = u * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    if (attn_packed_int8_init(&w[0], wf, bias, 3 * s->E, s->E) < 0 ||
        attn_packed_int8_init(&w[1], wf + 3 * E * E, bias, s->E, s->E) < 0)
        goto done;
    j.x = x;
    int ntasks = threads;
    j.per = (T + (size_t)ntasks - 1) / (size_t)ntasks;
    j.per = (j.per + ATTN_INT8_ROWPAD - 1) / ATTN_INT8_ROWPAD * ATTN_INT8_ROWPAD;
    ntasks = (int)((T + j.per - 1) / j.per);
    double t0 = now_s();
    proj8_run(ctx, &j, ntasks); /* warm-up */
    double once = now_s() - t0;
    int n = (int)(budget / (once > 1e-6 ? once : 1e-6));
    n = n < 3 ? 3 : n > 200 ? 200 : n;
    for (int r = 0; r < n; r++) {
        t0 = now_s();
        proj8_run(ctx, &j, ntasks);
        t[r] = now_s() - t0;
    }
    med = median(t, n);
done:
    attn_ctx_free(ctx);
    attn_packed_int8_free(&w[0]);
    attn_packed_int8_free(&w[1]);
    free(wf);
    free(bias);
    free(x);
    free(j.a);
    free(j.c[0]);
    free(j.c[1]);
    return med;
}

/* One row per shape: the int8 projections' ms, GOP/s and share of the
 * vpdpbusd peak at each thread count (the peak measured here when the
 * rates were not). */
static void print_proj8(const int *threads, int nt, double budget) {
    printf("int8 projections alone (%s kernels: rows quantized, then the in- and "
           "out-projection; 8*T*E^2 operations; %% = share of the vpdpbusd peak):\n",
           attn_int8_kernels());
    printf("%4s %5s %5s %3s", "B", "L", "E", "H");
    for (int t = 0; t < nt; t++)
        printf(" | %2dt %9s %8s %5s", threads[t], "ms", "GOP/s", "%");
    printf("\n");
    for (int t = 0; t < nt; t++)
        if (g_vnni_peak[t] <= 0) g_vnni_peak[t] = fma_peak(threads[t], 2);
    for (int i = 0; i <= NSHAPES; i++) {
        const shape *s = shape_run(i);
        if (!s) continue;
        printf("%4d %5d %5d %3d", s->B, s->L, s->E, s->H);
        for (int t = 0; t < nt; t++) {
            double sec = time_proj8(s, threads[t], budget);
            double rate = 8.0 * s->B * s->L * (double)s->E * s->E / sec / 1e9;
            if (sec < 0)
                printf(" | %3s %9s %8s %5s", "", "failed", "-", "-");
            else
                printf(" | %3s %9.3f %8.1f %5.1f", "", sec * 1e3, rate,
                       g_vnni_peak[t] > 0 ? 100.0 * rate / g_vnni_peak[t] : 0.0);
            fflush(stdout);
        }
        printf("\n");
    }
}

/* One table per setting asked for; only the first (default) table of each
 * precision goes to the comparison (--json). */
static void run_tables(const bench_opts *o, const double *gemm) {
    FILE *json = g_json;
    for (int pr = 0; pr < o->npr; pr++)
        for (int pj = 0; pj < o->np; pj++)
            for (int ow = 0; ow < o->no; ow++)
                for (int f = 0; f < o->nf; f++) {
                    g_precision = (attn_precision)o->precs[pr];
                    g_blas_owns = o->owners[ow];
                    attn_set_fused(o->fused[f]);
                    attn_set_projections(o->projs[pj]);
                    g_json = pj == 0 && ow == 0 && f == 0 ? json : NULL;
                    const char *owner =
                        g_blas_owns ? "OpenBLAS (one core thread)" : "the core (OpenBLAS at one)";
                    if (g_precision == ATTN_INT8)
                        printf("int8 model (%s kernels, attention %s), threads owned by %s:\n",
                               attn_int8_kernels(),
                               strcmp(attn_bf16_kernels(), "none") ? "bf16" : "fp32", owner);
                    else if (g_precision == ATTN_BF16)
                        printf("bf16 model (%s kernels), threads owned by %s:\n",
                               attn_bf16_kernels(), owner);
                    else
                        printf("projections %s, threads owned by %s, fused kernel %s:\n",
                               o->projs[pj] == ATTN_PROJ_PACKED ? "on packed weights"
                                                                : "with OpenBLAS",
                               owner, o->fused[f] ? "on" : "off");
                    print_table(o->threads, o->nt, gemm, o->budget);
                }
    g_json = json;
}

int main(int argc, char **argv) {
    bench_opts o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    if (o.print_what && strcmp(o.print_what, "threads") == 0) {
        for (int t = 0; t < o.nt; t++)
            printf("%s%d", t ? "," : "", o.threads[t]);
        printf("\n");
        return 0;
    }
    if (o.print_what && strcmp(o.print_what, "shapes") == 0) {
        for (int i = 0; i < NSHAPES; i++)
            printf("%s%d", i ? " " : "", i);
        printf("\n");
        return 0;
    }
    if (o.print_what) { /* blas-core */
        printf("%s\n", attn_blas_corename());
        return 0;
    }
    /* a fixed mmap threshold: big blocks come from and go back to the system,
     * so the memory rise of a forward is not hidden by reused heap pages */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    const char *products = attn_bf16_products();
    printf(
        "attnd core: self-attention, no attention matrix; OpenBLAS core %s; bf16 kernels %s%s%s%s; "
        "int8 kernels %s\n",
        attn_blas_corename(), attn_bf16_kernels(), *products ? " (products on " : "", products,
        *products ? ")" : "", attn_int8_kernels());
    if (*products)
        printf("VDPBF16PS took %.2fx the time of two FMAs for the same products here (FMAs above "
               "1.25x)\n",
               attn_bf16_products_gain());
    if (o.npauses) {
        int rc = run_pauses(o.pauses, o.npauses, o.threads[o.nt - 1]);
        if (g_json) fclose(g_json);
        return rc < 0 ? 1 : 0;
    }
    if (o.memory) {
        printf("memory of one forward, B=%d L=%d E=%d H=%d:\n", g_mem_shape.B, g_mem_shape.L,
               g_mem_shape.E, g_mem_shape.H);
        for (int t = 0; t < o.nt; t++)
            measure_memory(o.threads[t]);
        print_weights(o.precs, o.npr);
    }
    double gemm[MAX_THREADS] = {0};
    if (o.rates)
        print_rates(&o, gemm);
    else
        printf("FLOPs = 8*T*E^2 + 4*B*L^2*E; median ms over N runs\n");
    run_tables(&o, gemm);
    for (int pr = 0; pr < o.npr; pr++)
        if (o.precs[pr] == ATTN_INT8 && strcmp(attn_int8_kernels(), "none") != 0)
            print_proj8(o.threads, o.nt, o.budget);
    if (g_json) fclose(g_json);
    return 0;
}
