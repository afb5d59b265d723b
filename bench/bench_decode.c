/* bench_decode.c - decoding with a KV cache against re-sending the prefix,
 * printed as a table.
 *
 * A Llama-shaped layer (E = 1024, 8 query heads over 2 key/value heads of
 * 128, rotary positions). For cache lengths 128 .. 8192 and 1 or 64
 * sessions decoding at once: the median time of one single-token step of
 * every session through attn_step_forward (what POST
 * /v1/sessions/{id}/attention computes), as tokens per second, and the
 * step's cost per cached token, which should stay flat if a step grows
 * linearly with the cache. Next to it, the same token without a session:
 * the whole prefix plus the token through attn_forward_decoder, causal (what
 * a client without sessions sends), for one session and cache lengths up
 * to --resend-max (it grows with the square of the length).
 *
 *   build/bench/bench_decode [--seconds 1] [--resend-max 2048]
 *
 * Core only, on the calling thread: no HTTP. Never part of the tests:
 * timings depend on the machine and its load (the test machine's 2 cores
 * are shared with other builds; medians of repeated runs, bench/RESULTS.md
 * says when and how quiet).
 */
#include "../core/attn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { E = 1024, H = 8, G = 2, D = 128, MAXS = 64 };

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
    const attn_model *m;
    attn_step *steps;
    int n;
} step_job;

static void run_steps(void *arg) {
    step_job *j = arg;
    char err[256];
    if (attn_step_forward(NULL, j->m, j->steps, j->n, err, sizeof err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err);
        exit(1);
    }
}

typedef struct {
    const attn_model *m;
    attn_batch *b;
} whole_job;

static void run_whole(void *arg) {
    whole_job *j = arg;
    char err[256];
    if (attn_forward_decoder(NULL, j->m, j->b, err, sizeof err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err);
        exit(1);
    }
}

/* Median seconds of one single-token step of each of n sessions whose
 * caches hold len tokens (filled with random rows: the time does not depend
 * on the values). */
static double time_steps(const attn_model *m, int n, int len, float *kv, float *q, float *out,
                         double seconds) {
    size_t row = 2 * (size_t)G * D, per = (size_t)(len + 1) * row;
    attn_step st[MAXS];
    for (int i = 0; i < n; i++)
        st[i] = (attn_step){.n = 1, .len = len, .kv = kv + i * per, .query = q + (size_t)i * E,
                            .out = out + (size_t)i * E, .weights = ATTN_WEIGHTS_NONE};
    step_job j = {m, st, n};
    return median(run_steps, &j, seconds);
}

static double time_whole(const attn_model *m, int len, float *x, float *out, double seconds) {
    attn_seq s = {.L = len + 1, .S = len + 1, .causal = 1};
    attn_batch b = {.B = 1, .seqs = &s, .query = x, .out = out};
    whole_job j = {m, &b};
    return median(run_whole, &j, seconds);
}

int main(int argc, char **argv) {
    double seconds = 1.0;
    int resend_max = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
        if (strcmp(argv[i], "--resend-max") == 0) resend_max = atoi(argv[i + 1]);
    }
    char err[256];
    attn_model m;
    attn_hparams hp = {.embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 0,
                       .causal = 1, .num_kv_heads = G, .head_dim = D,
                       .rope = {.dim = D, .theta = 500000, .style = ATTN_ROPE_HALF}};
    if (attn_model_init(&m, &hp, err, sizeof err) < 0 || attn_blas_init(err, sizeof err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < m.n_floats; i++) m.mem[i] = frand() * 0.06f;
    const int lens[] = {128, 512, 2048, 8192};
    size_t row = 2 * (size_t)G * D, maxlen = 8192 + 1;
    float *kv = malloc(sizeof(float) * MAXS * maxlen * row);
    float *q = malloc(sizeof(float) * MAXS * E), *out = malloc(sizeof(float) * maxlen * E);
    float *x = malloc(sizeof(float) * maxlen * E);
    if (!kv || !q || !out || !x) {
        fprintf(stderr, "bench_decode: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < MAXS * maxlen * row; i++) kv[i] = frand();
    for (size_t i = 0; i < MAXS * (size_t)E; i++) q[i] = frand();
    for (size_t i = 0; i < maxlen * E; i++) x[i] = frand();

    printf("decode, E=%d H=%d G=%d D=%d, rope; blas %s; one thread; medians\n", E, H, G, D,
           attn_blas_corename());
    printf("| cache | sessions | step ms | tokens/s | us per step per 1k cached tokens | "
           "re-send prefix ms | re-send tokens/s | session speed-up |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int li = 0; li < 4; li++) {
        int len = lens[li];
        double whole = len <= resend_max ? time_whole(&m, len, x, out, seconds) : NAN;
        for (int n = 1; n <= MAXS; n *= MAXS) {
            double t = time_steps(&m, n, len, kv, q, out, seconds);
            double per_k = t / n * 1e6 / (len / 1000.0);
            printf("| %d | %d | %.3f | %.0f | %.2f |", len, n, t * 1e3, n / t, per_k);
            if (isnan(whole))
                printf(" not run | | |\n");
            else
                printf(" %.1f | %.2f | %.0fx |\n", whole * n * 1e3, 1 / whole, whole * n / t);
        }
    }
    printf("re-send: one session's whole prefix per token (for 64 sessions, 64 times one).\n");
    free(kv);
    free(q);
    free(out);
    free(x);
    attn_model_free(&m);
    return 0;
}
