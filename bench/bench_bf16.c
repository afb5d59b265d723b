/* bench_bf16.c - the bf16 kernels (core/kernels/block_bf16.h) against the fp32 ones, on one
 * thread, printed as tables of median milliseconds and GFLOP/s:
 *
 *   projections  C (M,N) = A (M,K) @ W^T + bias for M in 128..4096, K = E
 *                and N = E or 3E (the out and the QKV projections), E in 512,
 *                768, 1024, in the tiles a forward cuts (192 rows x 256
 *                columns): fp32 gemm_tile, OpenBLAS sgemm (A W^T, bias left
 *                out), bf16 on AVX512-BF16, bf16 on AMX;
 *   attention    one head, L = S in 128..4096, D = 64, no mask, in calls of
 *                512 rows: fp32 attn_fused_block, OpenBLAS sgemm on QK^T and
 *                PV alone (no softmax: a rate to compare with), bf16 blocks
 *                on each path; and packing K and V into bf16 pages, which a
 *                forward adds;
 *   forwards     the kernels of one forward of each core benchmark shape
 *                (bench_core), summed: QKV and out projections, B*H heads
 *                of attention (bf16: and the K/V pages): an estimate of what
 *                the bf16 forward can reach, not a forward.
 * and each bf16 column's ratio to fp32 (gemm_tile, the fused block). It
 * prints the CPU's model name and which paths ran; a path the CPU lacks is
 * left out with a line that says so.
 *
 *   build/bench/bench_bf16 [--clock cpu|wall] [--seconds S] [--quick]
 *                          [--only projections|attention|forwards]
 *
 * --clock cpu (default) times the thread's CPU time, which other work on a
 * shared machine does not inflate; wall for the wall clock. Each cell is the
 * median of 7 timed runs after a warm-up, each run repeating the call for
 * at least S/7 seconds (S = 0.35 by default).
 * Never part of the tests: timings depend on the machine and its load.
 */
#include "../core/kernels/block.h"
#include "../core/kernels/block_bf16.h"
#include "../core/kernels/gemm.h"
#include "../core/kernels/gemm_bf16.h"
#include "../core/kernels/kv_pages.h"
#include "../core/platform/blas.h"
#include "../core/platform/cpu.h"
#include "../core/prim/bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { RUNS = 7, TILE_ROWS = 192, TILE_PANELS = 16 };

static clockid_t g_clock = CLOCK_THREAD_CPUTIME_ID;
static double g_seconds = 0.35;
static uint32_t g_seed = 777;

static double now_s(void) {
    struct timespec t;
    clock_gettime(g_clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float frand(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)(g_seed >> 8) / 8388608.0f - 1.0f;
}

static void *alloc_filled(size_t n, float scale) {
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof(float) * (n ? n : 1)) != 0) {
        fprintf(stderr, "bench_bf16: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of one fn(arg) (RUNS runs after a warm-up). */
static double time_call(void (*fn)(void *), void *arg) {
    double t[RUNS];
    fn(arg);
    for (int r = 0; r < RUNS; r++) {
        int n = 0;
        double t0 = now_s(), dt;
        do {
            fn(arg);
            n++;
            dt = now_s() - t0;
        } while (dt < g_seconds / RUNS);
        t[r] = dt / n;
    }
    qsort(t, RUNS, sizeof(double), cmp_double);
    return t[RUNS / 2];
}

static void cpu_model(char *out, size_t n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, n, "unknown");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        snprintf(out, n, "%s", colon + 2);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    if (f) fclose(f);
}

/* ---- paths ------------------------------------------------------------------ */

static const int BF16_PATHS[] = {ATTN_BF16_AVX512, ATTN_BF16_AMX};
static const char *const BF16_NAME[] = {"AVX512-BF16", "AMX-BF16"};

static int path_ran(int i) {
    return BF16_PATHS[i] <= attn_bf16_level();
}

/* ---- projections ------------------------------------------------------------ */

typedef struct {
    int M, N, K;
    float *A, *W, *bias, *C; /* (M,K), (N,K), (N), (M,N) */
    attn_bf16 *Ab;           /* (M, K rounded up to 32): A rounded once */
    size_t ldb;
    attn_packed pf;
    attn_packed_bf16 pb;
} proj_bench;

/* The tiles of a forward on one thread (proj.c): column blocks, then rows. */
static void proj_fp32(void *arg) {
    proj_bench *b = arg;
    for (int j0 = 0; j0 < b->pf.panels; j0 += TILE_PANELS)
        for (int r0 = 0; r0 < b->M; r0 += TILE_ROWS) {
            int r1 = b->M - r0 < TILE_ROWS ? b->M : r0 + TILE_ROWS;
            gemm_tile(b->C + (size_t)r0 * b->N, b->N, b->A + (size_t)r0 * b->K, b->K, &b->pf, 0,
                      r1 - r0, j0, j0 + TILE_PANELS);
        }
}

/* Each tile rounds its rows (gemm_bf16_tile). */
static void proj_bf16_tiles(void *arg) {
    proj_bench *b = arg;
    for (int j0 = 0; j0 < b->pb.panels; j0 += TILE_PANELS)
        for (int r0 = 0; r0 < b->M; r0 += TILE_ROWS) {
            int r1 = b->M - r0 < TILE_ROWS ? b->M : r0 + TILE_ROWS;
            gemm_bf16_tile(b->C + (size_t)r0 * b->N, b->N, b->A + (size_t)r0 * b->K, b->K, &b->pb,
                           0, r1 - r0, j0, j0 + TILE_PANELS);
        }
}

/* The rows rounded once, then the tiles (gemm_bf16_tile_rounded). */
static void proj_bf16(void *arg) {
    proj_bench *b = arg;
    for (int r = 0; r < b->M; r++)
        attn_bf16_round(b->Ab + (size_t)r * b->ldb, b->A + (size_t)r * b->K, b->K);
    for (int j0 = 0; j0 < b->pb.panels; j0 += TILE_PANELS)
        for (int r0 = 0; r0 < b->M; r0 += TILE_ROWS) {
            int r1 = b->M - r0 < TILE_ROWS ? b->M : r0 + TILE_ROWS;
            gemm_bf16_tile_rounded(b->C, b->N, b->Ab, b->ldb, &b->pb, r0, r1, j0, j0 + TILE_PANELS);
        }
}

static void proj_blas(void *arg) {
    proj_bench *b = arg;
    // A (M,K) @ W^T (K,N) -> C (M,N)
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b->M, b->N, b->K, 1.0f, b->A, b->K, b->W,
               b->K, 0.0f, b->C, b->N);
}

static void proj_setup(proj_bench *b, int M, int N, int K) {
    *b = (proj_bench){.M = M, .N = N, .K = K};
    b->A = alloc_filled((size_t)M * K, 1.0f);
    b->W = alloc_filled((size_t)N * K, 1.0f / sqrtf((float)K));
    b->bias = alloc_filled((size_t)N, 1.0f);
    b->C = alloc_filled((size_t)M * N, 1.0f);
    b->ldb = (size_t)(K + 31) / 32 * 32;
    b->Ab = alloc_filled((size_t)M * b->ldb / 2, 0.0f); /* zeros: the tails stay zero */
    if (attn_packed_init(&b->pf, b->W, b->bias, N, K) < 0 ||
        attn_packed_bf16_init(&b->pb, b->W, b->bias, N, K) < 0) {
        fprintf(stderr, "bench_bf16: out of memory\n");
        exit(1);
    }
}

static void proj_free(proj_bench *b) {
    attn_packed_free(&b->pf);
    attn_packed_bf16_free(&b->pb);
    free(b->A);
    free(b->W);
    free(b->bias);
    free(b->C);
    free(b->Ab);
}

/* Median seconds of each column: fp32, OpenBLAS, the bf16 paths (0 where
 * the CPU lacks one), and AMX with each tile rounding its rows (0 without
 * AMX). */
static void proj_times(int M, int N, int K, double t[5]) {
    proj_bench b;
    proj_setup(&b, M, N, K);
    t[0] = time_call(proj_fp32, &b);
    t[1] = time_call(proj_blas, &b);
    for (int i = 0; i < 2; i++) {
        t[2 + i] = 0;
        if (!path_ran(i)) continue;
        attn_bf16_force(BF16_PATHS[i]);
        t[2 + i] = time_call(proj_bf16, &b);
    }
    t[4] = 0;
    if (path_ran(1)) {
        attn_bf16_force(ATTN_BF16_AMX);
        t[4] = time_call(proj_bf16_tiles, &b);
    }
    attn_bf16_force(-1);
    proj_free(&b);
}

static void print_cell(double sec, double flops, double base) {
    if (sec <= 0) {
        printf(" |         - |      - |     -");
        return;
    }
    printf(" | %9.3f | %6.1f", sec * 1e3, flops / sec / 1e9);
    if (base > 0)
        printf(" | %4.2fx", base / sec);
    else
        printf(" |     -");
}

static void proj_table(int quick) {
    static const int Ms[] = {128, 512, 2048, 4096}, Es[] = {512, 768, 1024};
    printf("\n## Projections: C (M,N) = A (M,K) @ W^T + bias, K = E, 1 thread\n\n"
           "bf16: A rounded once, then the tiles; the last column rounds A in every tile.\n\n");
    printf(
        "| M | N | K | fp32 ms | GF/s | x fp32 | OpenBLAS ms | GF/s | x fp32 | AVX512-BF16 ms "
        "| GF/s | x fp32 | AMX-BF16 ms | GF/s | x fp32 | AMX, A per tile ms | GF/s | x fp32 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int e = 0; e < 3; e++)
        for (int n = 1; n <= 3; n += 2)
            for (int m = 0; m < 4; m++) {
                if (quick && (m == 3 || e == 1)) continue;
                int M = Ms[m], N = n * Es[e], K = Es[e];
                double t[5], fl = 2.0 * M * N * K;
                proj_times(M, N, K, t);
                printf("| %d | %d | %d", M, N, K);
                for (int i = 0; i < 5; i++)
                    print_cell(t[i], fl, t[0]);
                printf(" |\n");
                fflush(stdout);
            }
}

/* ---- attention ---------------------------------------------------------------- */

typedef struct {
    int L, D; /* L = S */
    float scale;
    float *q, *k, *v, *out; /* (L,D) each */
    float *sc;              /* (512, L) scores of the OpenBLAS column */
    float *fused;           /* attn_fused_floats(D) */
    void *scratch;          /* attn_bf16_scratch_bytes(D) */
    attn_bf16 *kv;          /* the pages of k and v */
    attn_kv_bf16 head;
    attn_seq seq;
} attn_bench;

static void attn_run_fp32(void *arg) {
    attn_bench *b = arg;
    for (int i0 = 0; i0 < b->L; i0 += ATTN_FUSED_ROWS) {
        int n = b->L - i0 < ATTN_FUSED_ROWS ? b->L - i0 : ATTN_FUSED_ROWS;
        float *rows = b->out + (size_t)i0 * b->D; /* the block works in place: q in, out out */
        memcpy(rows, b->q + (size_t)i0 * b->D, sizeof(float) * (size_t)n * b->D);
        attn_fused_block(rows, b->D, 1, b->k, b->v, b->D, &b->seq, i0, n, b->D, b->scale, b->fused);
    }
}

static void attn_run_bf16(void *arg) {
    attn_bench *b = arg;
    for (int i0 = 0; i0 < b->L; i0 += ATTN_BF16_ROWS) {
        int n = b->L - i0 < ATTN_BF16_ROWS ? b->L - i0 : ATTN_BF16_ROWS;
        attn_bf16_block(b->out + (size_t)i0 * b->D, b->D, b->q + (size_t)i0 * b->D, b->D, &b->head,
                        &b->seq, i0, n, 1, b->D, b->scale, b->scratch);
    }
}

static void attn_run_blas(void *arg) {
    attn_bench *b = arg;
    for (int i0 = 0; i0 < b->L; i0 += 512) {
        int n = b->L - i0 < 512 ? b->L - i0 : 512;
        // q (n,D) @ k^T (D,L) -> sc (n,L); sc (n,L) @ v (L,D) -> out (n,D)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, b->L, b->D, b->scale,
                   b->q + (size_t)i0 * b->D, b->D, b->k, b->D, 0.0f, b->sc, b->L);
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, b->D, b->L, 1.0f, b->sc, b->L,
                   b->v, b->D, 0.0f, b->out + (size_t)i0 * b->D, b->D);
    }
}

static void attn_run_pack(void *arg) {
    attn_bench *b = arg;
    attn_kv_bf16_pack(b->kv, 1, b->D, (size_t)b->L, b->k, b->D, b->v, b->D);
}

static void attn_setup(attn_bench *b, int L, int D) {
    *b = (attn_bench){.L = L, .D = D, .scale = 1.0f / sqrtf((float)D)};
    size_t n = (size_t)L * D;
    b->q = alloc_filled(n, 2.0f);
    b->k = alloc_filled(n, 2.0f);
    b->v = alloc_filled(n, 1.0f);
    b->out = alloc_filled(n, 1.0f);
    b->sc = alloc_filled((size_t)512 * L, 1.0f);
    b->fused = alloc_filled(attn_fused_floats(D), 1.0f);
    b->scratch = alloc_filled(attn_bf16_scratch_bytes(D) / sizeof(float) + 16, 1.0f);
    b->kv = alloc_filled(attn_kv_bf16_elems((size_t)L, 1, D) / 2 + 16, 1.0f);
    attn_run_pack(b);
    b->head = attn_kv_bf16_head(b->kv, 1, D, 0, L);
    b->seq = (attn_seq){.L = L, .S = L};
}

static void attn_free(attn_bench *b) {
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->out);
    free(b->sc);
    free(b->fused);
    free(b->scratch);
    free(b->kv);
}

/* Median seconds: fp32 fused, OpenBLAS QK^T and PV, the bf16 paths (0 where
 * the CPU lacks one), and packing K and V into pages. */
static void attn_times(int L, int D, double t[5]) {
    attn_bench b;
    attn_setup(&b, L, D);
    t[0] = time_call(attn_run_fp32, &b);
    t[1] = time_call(attn_run_blas, &b);
    for (int i = 0; i < 2; i++) {
        t[2 + i] = 0;
        if (!path_ran(i)) continue;
        attn_bf16_force(BF16_PATHS[i]);
        t[2 + i] = time_call(attn_run_bf16, &b);
    }
    attn_bf16_force(-1);
    t[4] = time_call(attn_run_pack, &b);
    attn_free(&b);
}

static void attn_table(int quick) {
    static const int Ls[] = {128, 512, 2048, 4096};
    printf("\n## Attention block: one head, L = S, D = 64, no mask, 1 thread\n\n");
    printf("| L = S | fp32 fused ms | GF/s | x fp32 | OpenBLAS QK^T+PV ms | GF/s | x fp32 | "
           "AVX512-BF16 ms | GF/s | x fp32 | AMX-BF16 ms | GF/s | x fp32 | K,V to pages ms |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < 4; i++) {
        if (quick && i == 3) continue;
        double t[5], fl = 4.0 * Ls[i] * (double)Ls[i] * 64;
        attn_times(Ls[i], 64, t);
        printf("| %d", Ls[i]);
        for (int c = 0; c < 4; c++)
            print_cell(t[c], fl, t[0]);
        printf(" | %.3f |\n", t[4] * 1e3);
        fflush(stdout);
    }
}

/* ---- forwards: the kernels of the core benchmark's shapes, summed ---------------- */

static void forward_table(int quick) {
    static const int shapes[][4] = {{1, 128, 512, 8},  {1, 512, 1024, 16},  {8, 128, 512, 8},
                                    {32, 64, 768, 12}, {1, 2048, 1024, 16}, {1, 4096, 512, 8}};
    printf("\n## Forward estimate: QKV and out projections + B*H attention heads (+ K,V pages "
           "for bf16), kernels alone, 1 thread\n\n");
    printf("| B,L,E,H | GFLOP | fp32 ms | AVX512-BF16 ms | x fp32 | AMX-BF16 ms | x fp32 |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 6; s++) {
        if (quick && (s == 4 || s == 5)) continue;
        int B = shapes[s][0], L = shapes[s][1], E = shapes[s][2], H = shapes[s][3], T = B * L;
        double qkv[5], out[5], att[5], heads = (double)B * H;
        proj_times(T, 3 * E, E, qkv);
        proj_times(T, E, E, out);
        attn_times(L, E / H, att);
        double fp32 = qkv[0] + out[0] + heads * att[0];
        double fl = 8.0 * T * (double)E * E + 4.0 * B * (double)L * L * E;
        printf("| %d,%d,%d,%d | %.2f | %.3f", B, L, E, H, fl / 1e9, fp32 * 1e3);
        for (int i = 0; i < 2; i++) {
            double t = qkv[2 + i] + out[2 + i] + heads * (att[2 + i] + att[4]);
            if (path_ran(i))
                printf(" | %.3f | %.2fx", t * 1e3, fp32 / t);
            else
                printf(" | - | -");
        }
        printf(" |\n");
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--clock") == 0 && i + 1 < argc) {
            g_clock = strcmp(argv[++i], "wall") == 0 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            g_seconds = atof(argv[++i]);
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_bf16 [--clock cpu|wall] [--seconds S] [--quick] "
                            "[--only projections|attention|forwards]\n");
            return 2;
        }
    }
    char err[256], cpu[256];
    if (attn_blas_init(err, sizeof err) < 0) {
        fprintf(stderr, "bench_bf16: %s\n", err);
        return 1;
    }
    cpu_model(cpu, sizeof cpu);
    printf("# bf16 kernels\n\nCPU: %s; bf16 path: %s; OpenBLAS kernels: %s; clock: %s; median "
           "of %d runs\n",
           cpu, attn_bf16_name(attn_bf16_level()), attn_blas_corename(),
           g_clock == CLOCK_MONOTONIC ? "wall" : "thread CPU time", RUNS);
    for (int i = 0; i < 2; i++)
        printf("%s: %s\n", BF16_NAME[i],
               path_ran(i) ? "ran" : "not on this CPU: its kernels were not run");
    if (!only || strcmp(only, "projections") == 0) proj_table(quick);
    if (!only || strcmp(only, "attention") == 0) attn_table(quick);
    if (!only || strcmp(only, "forwards") == 0) forward_table(quick);
    return 0;
}
