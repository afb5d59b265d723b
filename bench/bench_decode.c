/* bench_decode.c - decoding with a KV cache against re-sending the prefix,
 * printed as a table, with a check of how a step's cost grows with the
 * cache.
 *
 * A Llama-shaped layer (E = 1024, 8 query heads over 2 key/value heads of
 * 128, rotary positions). For cache lengths L = 128, 256, 512, ..., 8192
 * and 1 or 64 sessions decoding at once: the median time of one
 * single-token step of every session, the sessions' steps as cache
 * sequences (attn_seq.kv) of one batch through attn_forward (what
 * POST /v1/sessions/{id}/attention computes), as tokens per second and as
 * microseconds per step per 1000 cached tokens. Next to it, the same token
 * without a session: the whole prefix plus the token through attn_forward,
 * causal (what a client without sessions sends), for
 * one session (64 sessions re-send 64 times that), up to --resend-max
 * (8192 by default: it grows with the square of the length, about a
 * second a token at 8192 on two cores).
 *
 * Then, for 1 and for 64 sessions, the least-squares line
 *     step time = a + b * L
 * through the step times with its largest relative residual |t - fit| / t
 * (a line through all lengths misses the short ones, where the fixed cost
 * of the projections dominates, and the caches that leave the CPU's caches
 * cost more per token than those that fit), and the growth exponent k of
 * t ~ L^k over the lengths from GROWTH_FROM up, where the cache's part of a
 * step dominates: a step reads every cached key and value once, so k should
 * be about 1 (a step that re-read the prefix's projections would give 2).
 * The verdict: linear when k <= LINEAR_MAX_K.
 *
 *   build/bench/bench_decode [--threads N] [--seconds S] [--max-len L] [--resend-max L]
 *                            [--shape gqa|mha]
 *
 * --threads: the compute pool's size, by default every CPU this process may
 * use (affinity mask and cgroup quota), as the daemon sizes its pool.
 * --seconds: time budget per cell (medians of repeated runs, at least 3).
 * --shape mha: the daemon's default model's shape instead (E = 512, 8 heads
 * of 64, one query head per key/value head), where a step's block has one lane.
 * --max-len: the longest cache (a power of two from 128; 8192 by default).
 * The 64 sessions' caches take 64 * (max-len + 1) * 2 KiB (1 GiB at 8192).
 *
 * Core only, no HTTP. Never part of the tests: timings depend on the
 * machine and its load; bench/RESULTS.md says when and how quiet.
 */
#include "../core/attn.h"
#include "../server/base/cpus.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAXS = 64, MIN_LEN = 128, MAX_LEN = 8192 };
/* the layer's shape: --shape gqa (this default) or mha (the daemon's default model) */
static int E = 1024, H = 8, G = 2, D = 128;
#define NLEN 7           /* 128 .. 8192, doubling */
#define GROWTH_FROM 1024 /* shortest cache of the growth exponent's fit */
#define LINEAR_MAX_K 1.3 /* growth exponent of a linear cost, with room for cache effects */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 - 0.5);
}

/* Median seconds of fn(arg) over runs taking about `seconds` in all. */
static double median(void (*fn)(void *), void *arg, double seconds) {
    double t[64];
    int n = 0;
    fn(arg); /* warm-up */
    double end = now_s() + seconds;
    while (n < 64 && (n < 3 || now_s() < end)) {
        double t0 = now_s();
        fn(arg);
        t[n++] = now_s() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp);
    return t[n / 2];
}

typedef struct {
    attn_ctx *ctx;
    const attn_model *m;
    attn_batch *b;
} forward_job;

static void run_forward(void *arg) {
    forward_job *j = arg;
    char err[256];
    if (attn_forward(j->ctx, j->m, j->b, err, sizeof err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err);
        exit(1);
    }
}

/* Median seconds of one single-token step of each of n sessions whose
 * caches hold len tokens (random rows: the time does not depend on the
 * values). Session i's cache is kv + i * per, per = (maxlen + 1) rows. */
static double time_steps(attn_ctx *ctx, const attn_model *m, int n, int len, int maxlen, float *kv,
                         float *q, float *out, double seconds) {
    size_t row = 2 * (size_t)G * D, per = (size_t)(maxlen + 1) * row;
    attn_seq st[MAXS];
    for (int i = 0; i < n; i++) /* session i's query row is q's row i */
        st[i] = (attn_seq){.L = 1, .S = len + 1, .kv = kv + i * per, .cached = len};
    attn_batch b = {.B = n, .seqs = st, .query = q, .out = out};
    forward_job j = {ctx, m, &b};
    return median(run_forward, &j, seconds);
}

/* Median seconds of the whole prefix of len tokens plus one, causal. */
static double time_whole(attn_ctx *ctx, const attn_model *m, int len, float *x, float *out,
                         double seconds) {
    attn_seq s = {.L = len + 1, .S = len + 1, .causal = 1};
    attn_batch b = {.B = 1, .seqs = &s, .query = x, .out = out};
    forward_job j = {ctx, m, &b};
    return median(run_forward, &j, seconds);
}

/* Least squares t = a + b * L over n points; *worst the largest
 * |t - fit| / t and *at its L. */
static void fit_line(const int *L, const double *t, int n, double *a, double *b, double *worst,
                     int *at) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sx += L[i];
        sy += t[i];
        sxx += (double)L[i] * L[i];
        sxy += (double)L[i] * t[i];
    }
    double den = n * sxx - sx * sx;
    *b = den != 0 ? (n * sxy - sx * sy) / den : 0;
    *a = (sy - *b * sx) / n;
    *worst = 0;
    *at = n ? L[0] : 0;
    for (int i = 0; i < n; i++) {
        double r = fabs(t[i] - (*a + *b * L[i])) / t[i];
        if (r > *worst) {
            *worst = r;
            *at = L[i];
        }
    }
}

/* Least-squares slope of log t against log L over the lengths >= from;
 * -1 when fewer than 3 qualify. */
static double growth_exponent(const int *L, const double *t, int n, int from, int *used) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (L[i] < from || t[i] <= 0) continue;
        double x = log((double)L[i]), y = log(t[i]);
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        m++;
    }
    *used = m;
    double den = m * sxx - sx * sx;
    return m >= 3 && den != 0 ? (m * sxy - sx * sy) / den : -1;
}

static void print_fit(int sessions, const int *lens, const double *t, int n) {
    double a, b, worst;
    int at;
    if (n < 3) {
        printf("fit, %d session%s: fewer than 3 cache lengths, no fit\n", sessions,
               sessions == 1 ? "" : "s");
        return;
    }
    fit_line(lens, t, n, &a, &b, &worst, &at);
    printf("fit, %d session%s: step ms = %.4f + %.5f x L/1000 (L = %d..%d); largest relative "
           "residual %.1f%% at L = %d\n",
           sessions, sessions == 1 ? "" : "s", a * 1e3, b * 1e6, lens[0], lens[n - 1], worst * 100,
           at);
    int used;
    double k = growth_exponent(lens, t, n, GROWTH_FROM, &used);
    const char *s = sessions == 1 ? "" : "s";
    if (k < 0)
        printf("verdict, %d session%s: fewer than 3 lengths from %d, no growth exponent\n",
               sessions, s, GROWTH_FROM);
    else
        printf("verdict, %d session%s: step time ~ L^%.2f over L = %d..%d (%d lengths): %s\n",
               sessions, s, k, GROWTH_FROM, lens[n - 1], used,
               k <= LINEAR_MAX_K ? "linear in the cache length"
                                 : "NOT linear: it grows faster than the cache");
}

static int arg_int(const char *s, int lo, int hi, const char *name) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "bench_decode: %s: '%s' is not a whole number from %d to %d\n", name, s, lo,
                hi);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    double seconds = 1.0;
    int resend_max = MAX_LEN, maxlen = MAX_LEN, threads = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_decode: %s needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--resend-max") == 0)
            resend_max = arg_int(argv[i + 1], 0, MAX_LEN, argv[i]);
        else if (strcmp(argv[i], "--max-len") == 0)
            maxlen = arg_int(argv[i + 1], MIN_LEN, MAX_LEN, argv[i]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = arg_int(argv[i + 1], 1, 4096, argv[i]);
        else if (strcmp(argv[i], "--shape") == 0 && strcmp(argv[i + 1], "mha") == 0) {
            E = 512; /* plain multi-head: 8 heads of 64, one query head per key/value head */
            G = 8;
            D = 64;
        } else if (strcmp(argv[i], "--shape") != 0 || strcmp(argv[i + 1], "gqa") != 0) {
            fprintf(stderr, "usage: bench_decode [--threads N] [--seconds S] [--max-len L] "
                            "[--resend-max L] [--shape gqa|mha]\n");
            return 2;
        }
    }
    const char *who = "--threads";
    if (threads == 0) {
        attnd_cpus c;
        attnd_cpus_count(&c);
        threads = c.n;
        who = "every CPU this process may use";
    }
    char err[256];
    attn_model m;
    attn_hparams hp = {.embed_dim = E,
                       .num_heads = H,
                       .kdim = E,
                       .vdim = E,
                       .bias = 0,
                       .causal = 1,
                       .num_kv_heads = G,
                       .head_dim = D,
                       .rope = {.dim = D, .theta = 500000, .style = ATTN_ROPE_HALF}};
    if (attn_model_init(&m, &hp, err, sizeof err) < 0 || attn_blas_init(err, sizeof err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < m.n_floats; i++)
        m.mem[i] = frand() * 0.06f;
    if (attn_model_pack(&m, err, sizeof err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    attn_ctx *ctx = attn_ctx_new(threads);
    int lens[NLEN], nlen = 0;
    for (int len = MIN_LEN; len <= maxlen; len *= 2)
        lens[nlen++] = len;
    size_t row = 2 * (size_t)G * D, rows = (size_t)maxlen + 1; /* a cache, or a prefix */
    float *kv = malloc(sizeof(float) * MAXS * rows * row);
    float *q = malloc(sizeof(float) * MAXS * E), *out = malloc(sizeof(float) * rows * E);
    float *x = malloc(sizeof(float) * rows * E);
    if (!ctx || !kv || !q || !out || !x) {
        fprintf(stderr, "bench_decode: out of memory (or no threads)\n");
        return 1;
    }
    for (size_t i = 0; i < MAXS * rows * row; i++)
        kv[i] = frand();
    for (size_t i = 0; i < MAXS * (size_t)E; i++)
        q[i] = frand();
    for (size_t i = 0; i < rows * E; i++)
        x[i] = frand();

    printf("decode, E=%d H=%d G=%d D=%d, rope; blas %s; %d thread%s (%s); medians of %g s "
           "a cell\n",
           E, H, G, D, attn_blas_corename(), threads, threads == 1 ? "" : "s", who, seconds);
    printf("| cache | sessions | step ms | tokens/s | us per step per 1k cached tokens | "
           "re-send prefix ms | re-send tokens/s | session speed-up |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    double steps_t[2][NLEN];
    for (int li = 0; li < nlen; li++) {
        int len = lens[li];
        double whole = len <= resend_max ? time_whole(ctx, &m, len, x, out, seconds) : NAN;
        for (int k = 0, n = 1; k < 2; k++, n = MAXS) {
            double t = time_steps(ctx, &m, n, len, maxlen, kv, q, out, seconds);
            steps_t[k][li] = t;
            double per_k = t / n * 1e6 / (len / 1000.0);
            printf("| %d | %d | %.3f | %.0f | %.1f |", len, n, t * 1e3, n / t, per_k);
            if (isnan(whole))
                printf(" not run | | |\n");
            else
                printf(" %.1f | %.2f | %.0fx |\n", whole * n * 1e3, 1 / whole, whole * n / t);
        }
        fflush(stdout);
    }
    printf("re-send: one session's whole prefix per token (for 64 sessions, 64 times one).\n");
    print_fit(1, lens, steps_t[0], nlen);
    print_fit(MAXS, lens, steps_t[1], nlen);
    free(kv);
    free(q);
    free(out);
    free(x);
    attn_ctx_free(ctx);
    attn_model_free(&m);
    return 0;
}
