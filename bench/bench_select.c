/* bench_select.c - what a part of the attention matrices costs (attn_select,
 * docs/api.md "Selecting a part of the attention").
 *
 * One self-attention sequence (default L 4096, E 512, 8 heads), forwards of
 * the same input asked for:
 *   none      no attention matrix (the tiled / fused path);
 *   1h x 10r  one head's weights over 10 query rows;
 *   top-10    the same rows, each row's 10 largest weights;
 *   mean      the (L,S) mean over heads;
 *   heads     every head's whole (H,L,S) matrix.
 * The cases run in turn, round after round, so that a slow moment of a
 * shared machine falls on all of them; each is the median over its rounds,
 * and its ratio to "none" is printed (the target of a small part: 1.1 or
 * less). Also attn_workspace_bytes of each.
 *
 *   build/bench/bench_select [--threads N] [--rounds R] [--L L] [--E E] [--H H]
 *
 * Never part of the tests: timings depend on the machine and its load.
 */
#include "../core/attn.h"
#include "../server/base/cpus.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NCASES = 5, MAX_ROUNDS = 64 };

typedef struct {
    const char *name;
    attn_weights_mode weights;
    int part; /* 1: one head x 10 rows; 2: those rows' top-10 */
} bench_case;

static const bench_case g_cases[NCASES] = {
    {"none", ATTN_WEIGHTS_NONE, 0},    {"1h x 10r", ATTN_WEIGHTS_HEADS, 1},
    {"top-10", ATTN_WEIGHTS_HEADS, 2}, {"mean", ATTN_WEIGHTS_MEAN, 0},
    {"heads", ATTN_WEIGHTS_HEADS, 0},
};

static const int g_head[1] = {3}; /* the head of the small parts */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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

static void fill(float *p, size_t n, float scale) { /* uniform in [-scale, scale) */
    for (size_t i = 0; i < n; i++) {
        g_seed = g_seed * 1664525u + 1013904223u;
        p[i] = ((float)(g_seed >> 8) / 8388608.0f - 1.0f) * scale;
    }
}

/* Sets seq for case c: its mode and its part (rows in the middle of L). */
static void set_case(attn_seq *seq, const bench_case *c) {
    seq->weights = c->weights;
    memset(&seq->sel, 0, sizeof seq->sel);
    if (!c->part) return;
    seq->sel = (attn_select){.heads = g_head,
                             .n_heads = 1,
                             .row0 = seq->L / 2,
                             .row1 = seq->L / 2 + 10,
                             .top_k = c->part == 2 ? 10 : 0};
}

typedef struct {
    attn_model m;
    attn_ctx *ctx;
    attn_seq seq;
    attn_batch b;
    float *query, *out, *attn; /* (L,E), (L,E), (H,L,L): the largest answer */
    int32_t *idx;              /* (10,10) */
} bench_state;

static int setup(bench_state *s, int L, int E, int H, int threads, char *err, size_t errlen) {
    attn_hparams hp = {.embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 1};
    if (attn_model_init(&s->m, &hp, err, errlen) < 0) return -1;
    fill(s->m.mem, s->m.n_floats, 1.0f / sqrtf((float)E));
    if (attn_model_pack(&s->m, err, errlen) < 0) return -1;
    s->query = malloc(sizeof(float) * (size_t)L * E);
    s->out = malloc(sizeof(float) * (size_t)L * E);
    s->attn = malloc(sizeof(float) * (size_t)H * L * L);
    s->idx = malloc(sizeof(int32_t) * 100);
    s->ctx = attn_ctx_new(threads);
    if (!s->query || !s->out || !s->attn || !s->idx || !s->ctx) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    fill(s->query, (size_t)L * E, 1.0f);
    fill(s->out, (size_t)L * E, 1.0f);
    fill(s->attn, (size_t)H * L * L, 1.0f); /* touched: its pages count before any forward */
    s->seq = (attn_seq){.L = L, .S = L, .attn = s->attn, .attn_idx = s->idx};
    s->b = (attn_batch){.B = 1, .seqs = &s->seq, .query = s->query, .out = s->out};
    return 0;
}

static void teardown(bench_state *s) {
    attn_ctx_free(s->ctx);
    attn_model_free(&s->m);
    free(s->query);
    free(s->out);
    free(s->attn);
    free(s->idx);
}

/* Seconds of one forward of case c; -1 on error (err filled). */
static double run_case(bench_state *s, const bench_case *c, char *err, size_t errlen) {
    set_case(&s->seq, c);
    double t0 = now_s();
    if (attn_forward(s->ctx, &s->m, &s->b, err, errlen) < 0) return -1;
    return now_s() - t0;
}

static void print_table(bench_state *s, double t[NCASES][MAX_ROUNDS], int rounds, int threads) {
    double none = median(t[0], rounds);
    printf("%-9s %10s %9s %7s %12s\n", "asked", "floats", "ms", "ratio", "workspace");
    for (int c = 0; c < NCASES; c++) {
        set_case(&s->seq, &g_cases[c]);
        double ms = c ? median(t[c], rounds) * 1e3 : none * 1e3;
        size_t ws = attn_workspace_bytes(&s->m, &s->b, threads);
        printf("%-9s %10zu %9.2f %7.3f %9.1f MiB\n", g_cases[c].name,
               attn_select_floats(&s->seq, s->m.hp.num_heads), ms, ms / (none * 1e3),
               ws / 1048576.0);
    }
}

static int arg_int(int argc, char **argv, int *i, int *v) {
    if (*i + 1 >= argc) return -1;
    *v = atoi(argv[++*i]);
    return *v >= 1 ? 0 : -1;
}

int main(int argc, char **argv) {
    int L = 4096, E = 512, H = 8, rounds = 9, threads = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        int *v = strcmp(argv[i], "--L") == 0         ? &L
                 : strcmp(argv[i], "--E") == 0       ? &E
                 : strcmp(argv[i], "--H") == 0       ? &H
                 : strcmp(argv[i], "--rounds") == 0  ? &rounds
                 : strcmp(argv[i], "--threads") == 0 ? &threads
                                                     : NULL;
        bad = !v || arg_int(argc, argv, &i, v) < 0;
    }
    if (bad || rounds > MAX_ROUNDS || L < 20 || H < 4) {
        fprintf(stderr,
                "usage: bench_select [--threads N] [--rounds R<=%d] [--L L>=20] [--E E] "
                "[--H H>=4]\n",
                MAX_ROUNDS);
        return 2;
    }
    if (!threads) { /* the daemon's count: affinity mask and cgroup quota */
        attnd_cpus cpus;
        attnd_cpus_count(&cpus);
        threads = cpus.n >= 1 && cpus.n < 1024 ? cpus.n : 1;
    }
    static double t[NCASES][MAX_ROUNDS];
    char err[256] = "";
    bench_state s;
    memset(&s, 0, sizeof s);
    int rc = 1;
    if (setup(&s, L, E, H, threads, err, sizeof err) < 0) goto cleanup;
    printf("attnd core: one self-attention sequence L=%d E=%d H=%d, %d thread%s, OpenBLAS core "
           "%s;\nmedian of %d rounds (cases in turn each round); ratio to no attention\n",
           L, E, H, threads, threads > 1 ? "s" : "", attn_blas_corename(), rounds);
    for (int c = 0; c < NCASES; c++) /* warm-up */
        if (run_case(&s, &g_cases[c], err, sizeof err) < 0) goto cleanup;
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < NCASES; c++)
            if ((t[c][r] = run_case(&s, &g_cases[c], err, sizeof err)) < 0) goto cleanup;
    print_table(&s, t, rounds, threads);
    rc = 0;
cleanup:
    if (rc) fprintf(stderr, "bench_select: %s\n", err);
    teardown(&s);
    return rc;
}
