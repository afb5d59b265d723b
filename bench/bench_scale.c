/* bench_scale.c - how a forward's tasks are cut at 1 to 64 threads and what
 * that costs, simulated from the task graph: a machine with 2 CPUs cannot
 * measure 64 threads, but it can ask the core how it would cut the work
 * (attn_plan_describe: the forward's own planner) and time each kind of
 * task on one thread.
 *
 *   cost model  measured here, one thread: each projection tile shape that
 *               the plans of 1..64 threads produce (gemm_tile swept across
 *               the weights, so they stream as in a forward), each
 *               attention task shape (attn_attend_task on the forward's
 *               layout), each the median of ROUNDS rounds in thread CPU
 *               time; and the pool on 2 threads: loops of n tasks of 2 us,
 *               fitted as a cost per loop plus one per task (--pool-us
 *               gives them instead, for a busy machine);
 *   simulation  each loop's tasks cut into one contiguous share per
 *               thread, as core/platform/pool.c does: the thread that is free first
 *               takes the next task of its own share, or when that is done
 *               the next of the first share after its own with one left;
 *               the loop ends at a barrier;
 *               per-thread rates as at 1 thread: no shared bandwidth, no
 *               lower all-core clock, no cost of claiming a task that grows
 *               with the threads contending for it;
 *   bound       the bytes each loop must move at least (weights once,
 *               activations in and out once) against a DRAM bandwidth, a
 *               64-core server's by default (--dram-gbs): "DRAM ms" is the
 *               least time those bytes take, and a loop whose simulated
 *               time is below its own share is named as DRAM-bound.
 *
 * The check against reality: 1 and 2 threads predicted next to bench_core's
 * measured medians (--measured FILE: the lines bench_core --json wrote, as
 * make bench does), and every other thread count bench_core measured.
 *
 *   build/bench/bench_scale [--measured FILE] [--dram-gbs G] [--fused on|off]
 *                           [--pool-us LOOP,TASK]
 *
 * Never part of the tests: timings depend on the machine and its load.
 * Legend: see core/attn.h.
 */
#include "../core/attn.h"
#include "../core/kernels/block.h"
#include "../core/kernels/gemm.h"
#include "../core/ops/seq.h"
#include "../core/platform/mem.h"
#include "../core/tasks/attend.h"
#include "bench_shapes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const int g_threads[] = {1, 2, 4, 8, 16, 32, 64};
#define NT ((int)(sizeof(g_threads) / sizeof(g_threads[0])))
enum { MAX_T = 64, MAX_COSTS = 512, MAX_MEASURED = 64, ROUNDS = 5 };

/* AMD EPYC 9004 (Genoa, up to 96 cores; the 9554 has 64): 12 channels of
 * DDR5-4800, 460.8 GB/s per socket in theory (tomshardware.com, "AMD
 * Confirms Twelve DDR5 Memory Channels For Zen 4 EPYC CPUs", 2021-12-09);
 * what a program sustains is lower. */
static double g_dram_gbs = 460.8;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The calling thread's CPU time: what other work on a shared machine does
 * not inflate, for the one-thread costs. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint32_t g_seed = 12345;

static void fill(float *p, size_t n, float scale) { /* uniform in [-scale, scale) */
    for (size_t i = 0; i < n; i++) {
        g_seed = g_seed * 1664525u + 1013904223u;
        p[i] = ((float)(g_seed >> 8) / 8388608.0f - 1.0f) * scale;
    }
}

/* Median seconds of fn(arg) on clock `clk` over at least 3 runs and about
 * 5 ms, after one warm-up. */
static double median_of(void (*fn)(void *), void *arg, double (*clk)(void)) {
    double t[64];
    int n = 0;
    fn(arg);
    for (double start = now_s(); n < 64 && (n < 3 || now_s() - start < 0.005); n++) {
        double t0 = clk();
        fn(arg);
        t[n] = clk() - t0;
    }
    qsort(t, n, sizeof(double), cmp_double);
    return t[n / 2];
}

/* ---- the cost model ------------------------------------------------------ */

/* A task shape and its measured seconds on one thread: the median of
 * ROUNDS medians taken in turns with the shape's other tasks, so that a
 * burst of other work on a shared machine does not set one shape's cost. */
typedef struct {
    attn_plan_task k; /* loop, rows, cols, depth, heads; part ignored */
    double sec;
    double round[ROUNDS];
} cost;

/* One bench shape: its plans at every thread count and their tasks' costs,
 * and while they are measured, a model and one forward's buffers. */
typedef struct {
    shape s;
    attn_hparams hp;     /* the model's, filled in */
    attn_plan plans[NT]; /* (NT) one per g_threads */
    attn_model m;
    int W;        /* H*D + 2*G*D: the row width of the projections */
    float *A, *C; /* (T,E) inputs, (T,W) outputs of a projection */
    float *qkv;   /* (L,W) an attention task's queries, keys and values */
    cost costs[MAX_COSTS];
    int ncosts;
} bench_shape;

static int same_shape(const attn_plan_task *a, const attn_plan_task *b) {
    int proj = a->loop == ATTN_LOOP_PROJ || a->loop == ATTN_LOOP_OUT;
    return (proj ? b->loop == ATTN_LOOP_PROJ || b->loop == ATTN_LOOP_OUT : a->loop == b->loop) &&
           a->rows == b->rows && a->cols == b->cols && a->depth == b->depth && a->heads == b->heads;
}

/* A projection tile shape swept across the weights of part q. */
typedef struct {
    bench_shape *bs;
    const attn_plan_task *k;
} tile_run;

static void run_tiles(void *arg) {
    tile_run *r = arg;
    const attn_packed *pw = &r->bs->m.packed[0]; /* (H*D, E): every part's N and K here */
    int panels = r->k->cols / ATTN_PANEL, nb = pw->panels / panels;
    for (int b = 0; b < (nb ? nb : 1); b++)
        gemm_tile(r->bs->C, (size_t)r->bs->W, r->bs->A, (size_t)pw->K, pw, 0, (size_t)r->k->rows,
                  b * panels, (b + 1) * panels);
}

/* Seconds of one tile of shape k: a sweep over the column blocks of the
 * weights (each block's weights read once, as a forward's tiles do). */
static double time_tile(bench_shape *bs, const attn_plan_task *k) {
    tile_run r = {bs, k};
    int nb = bs->m.packed[0].panels / (k->cols / ATTN_PANEL);
    return median_of(run_tiles, &r, cpu_s) / (nb ? nb : 1);
}

/* One attention task of shape k on the forward's layout (queries, keys and
 * values side by side in rows of W). */
typedef struct {
    attn_attend at;
    attn_seq_at seq;
    attn_task task;
} attend_run;

static void run_attend(void *arg) {
    attend_run *r = arg;
    attn_attend_task(&r->at, 0, 0);
}

static double time_attend(bench_shape *bs, const attn_plan_task *k) {
    const attn_hparams *hp = &bs->m.hp;
    int H = hp->num_heads, G = hp->num_kv_heads, D = hp->head_dim;
    attend_run r = {
        .at = {.ops = bs->m.attend_ops, .H = H, .G = G, .D = D, .scale = 1.0f / sqrtf((float)D)}};
    r.at.rows_alone = !attn_is_mha(hp);
    r.at.ops->prepare(&r.at);
    r.at.cut_rows = k->rows;
    r.at.q = bs->qkv;
    r.at.ldq = (size_t)bs->W;
    r.seq = (attn_seq_at){.k = bs->qkv + H * D,
                          .v = bs->qkv + (H + G) * D,
                          .ldkv = (size_t)bs->W,
                          .view = (attn_seq){.L = k->rows, .S = k->cols}};
    r.task = (attn_task){0, 0, 0, k->rows}; /* key/value head 0: no matrix asked for */
    r.at.seqs = &r.seq;
    r.at.tasks = &r.task;
    float *scratch = malloc(sizeof(float) * attn_attend_floats(&r.at, &r.seq.view));
    if (!scratch) return NAN;
    r.at.tile = &scratch;
    double sec = median_of(run_attend, &r, cpu_s);
    free(scratch);
    return sec;
}

/* Adds the task shapes of plan p that bs has no cost for yet. */
static void collect(bench_shape *bs, const attn_plan *p) {
    for (size_t t = 0; t < p->ntasks; t++) {
        int i = 0;
        while (i < bs->ncosts && !same_shape(&bs->costs[i].k, &p->tasks[t]))
            i++;
        if (i == bs->ncosts && i < MAX_COSTS) bs->costs[bs->ncosts++] = (cost){.k = p->tasks[t]};
    }
}

/* Measures every collected shape, ROUNDS times in turns (step 2 is not
 * timed: no bench shape has it). */
static void measure_costs(bench_shape *bs) {
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < bs->ncosts; i++) {
            const attn_plan_task *k = &bs->costs[i].k;
            int tile = k->loop == ATTN_LOOP_PROJ || k->loop == ATTN_LOOP_OUT;
            int attend = k->loop == ATTN_LOOP_ATTEND || k->loop == ATTN_LOOP_SELECT;
            bs->costs[i].round[r] = attend ? time_attend(bs, k) : tile ? time_tile(bs, k) : 0;
        }
    for (int i = 0; i < bs->ncosts; i++) {
        qsort(bs->costs[i].round, ROUNDS, sizeof(double), cmp_double);
        bs->costs[i].sec = bs->costs[i].round[ROUNDS / 2];
    }
}

/* Seconds of a task of shape k (collected and measured before). */
static double task_cost(const bench_shape *bs, const attn_plan_task *k) {
    for (int i = 0; i < bs->ncosts; i++)
        if (same_shape(&bs->costs[i].k, k)) return bs->costs[i].sec;
    return NAN;
}

/* The pool's own costs on 2 threads: loops of n tasks of TASK_NS each take
 * per_loop + n * per_task seconds beyond their ideal ceil(n / 2) * TASK_NS
 * (least squares over a few n): the hand-off, the claims and the barrier,
 * with both threads busy as in a forward. Each n's overhead is the least of
 * the medians of rounds taken between the shapes' measurements, seconds
 * apart: other work on a shared machine only adds to it. */
typedef struct {
    double per_loop, per_task;
} pool_cost;

enum { TASK_NS = 2000 };

static void busy_task(void *arg, int task, int thread) {
    (void)arg, (void)task, (void)thread;
    for (double t0 = now_s(); now_s() - t0 < TASK_NS * 1e-9;)
        ;
}

typedef struct {
    attn_ctx *ctx;
    int n;
} busy_run;

static void run_busy(void *arg) {
    busy_run *r = arg;
    for (int i = 0; i < 20; i++)
        attn_ctx_parallel(r->ctx, r->n, busy_task, NULL);
}

static const int POOL_NS[] = {2, 4, 8, 16, 32, 64};
#define POOL_NN ((int)(sizeof(POOL_NS) / sizeof(POOL_NS[0])))
static double g_pool_over[POOL_NN]; /* seconds beyond the ideal per n, the least seen */
static int g_pool_rounds;

/* One round of empty-ish loops of every n; keeps each n's least overhead. */
static void pool_round(void) {
    busy_run r = {attn_ctx_new(2), 0};
    if (!r.ctx) return;
    for (int i = 0; i < POOL_NN; i++) {
        r.n = POOL_NS[i];
        double over = median_of(run_busy, &r, now_s) / 20 - (r.n + 1) / 2 * TASK_NS * 1e-9;
        if (g_pool_rounds == 0 || over < g_pool_over[i]) g_pool_over[i] = over;
    }
    attn_ctx_rest(r.ctx);
    attn_ctx_free(r.ctx);
    g_pool_rounds++;
}

/* The line through the rounds' least overheads. */
static pool_cost pool_fit(void) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0, n = POOL_NN;
    for (int i = 0; i < POOL_NN; i++) {
        double x = POOL_NS[i], y = g_pool_over[i];
        sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    pool_cost pc = {0, (n * sxy - sx * sy) / (n * sxx - sx * sx)};
    pc.per_loop = (sy - pc.per_task * sx) / n;
    if (pc.per_task < 0) pc.per_task = 0;
    if (pc.per_loop < 0) pc.per_loop = 0;
    return pc;
}

/* ---- the simulation -------------------------------------------------------- */

static pool_cost g_pool;

/* One loop of n tasks (costs sec[]) on T threads, in shares as core/platform/pool.c
 * cuts them: thread t's are [t n / T, (t+1) n / T). The thread that is free
 * first (the lowest on a tie) takes its own share's next task, else the
 * next of the first share after its own with one left; then the barrier.
 * One thread or one task runs inline (core/platform/pool.c), with no hand-off.
 * Returns the loop's seconds; *busy is the threads' summed working time. */
static double simulate_loop(const double *sec, size_t n, int T, double *busy) {
    double free_at[MAX_T] = {0}, end = 0;
    size_t next[MAX_T], stop[MAX_T];
    *busy = 0;
    if (T == 1 || n == 1) {
        for (size_t i = 0; i < n; i++)
            end += sec[i];
        *busy = end;
        return end;
    }
    for (int u = 0; u < T; u++) {
        next[u] = (size_t)u * n / (size_t)T;
        stop[u] = (size_t)(u + 1) * n / (size_t)T;
    }
    for (size_t done = 0; done < n; done++) {
        int t = 0;
        for (int u = 1; u < T; u++)
            if (free_at[u] < free_at[t]) t = u;
        int s = t;
        for (int i = 0; i < T && next[s] == stop[s]; i++)
            s = (t + i + 1) % T;
        size_t k = next[s]++;
        free_at[t] += g_pool.per_task + sec[k];
        *busy += g_pool.per_task + sec[k];
        if (free_at[t] > end) end = free_at[t];
    }
    return g_pool.per_loop + end;
}

/* Bytes a loop must move at least, weights once and activations in and out
 * once (self-attention, as the bench shapes are). */
static double loop_bytes(const attn_hparams *hp, size_t T, attn_loop_kind kind) {
    double E = hp->embed_dim, HD = (double)hp->num_heads * hp->head_dim;
    double W = HD + 2.0 * hp->num_kv_heads * hp->head_dim;
    switch (kind) {
    case ATTN_LOOP_PROJ:
        return 4 * (W * E + T * E + T * W);
    case ATTN_LOOP_PREP:
        return 4 * (T * W);
    case ATTN_LOOP_ATTEND:
        return 4 * (T * W + T * HD);
    case ATTN_LOOP_OUT:
        return 4 * (E * HD + T * HD + T * E);
    default: /* rounding and packing: no bench shape is bf16 */
        return 0;
    }
}

static const char *const LOOP_NAME[ATTN_LOOPS] = {"round",  "proj", "prep",      "pack",
                                                  "select", "attn", "out-round", "out"};

/* One (shape, thread count): the plan's loops simulated. */
typedef struct {
    double sec;                /* simulated seconds of the forward */
    double dram_sec;           /* the least time its loops' bytes take at the DRAM bandwidth */
    double worst_idle;         /* the largest share of thread time a loop idles */
    int worst;                 /* that loop's kind */
    int dram;                  /* bit per loop kind: DRAM time above its simulated time */
    size_t ntasks[ATTN_LOOPS]; /* tasks per loop kind */
    attn_plan_task tile;       /* the plan's first projection tile */
    double tile_gflops;        /* its rate as measured */
    attn_plan_task task;       /* the plan's first attention task */
    double task_gflops;        /* its rate */
} sim_row;

static double task_flops(const attn_plan_task *k) {
    if (k->loop == ATTN_LOOP_ATTEND) return 4.0 * k->rows * k->heads * k->cols * k->depth;
    return 2.0 * k->rows * k->cols * k->depth;
}

/* Simulates loop l of plan p on `threads` threads into row; sec holds
 * room for the loop's task costs. */
static void simulate_one(const bench_shape *bs, const attn_plan *p, int l, size_t T, int threads,
                         double *sec, sim_row *row) {
    size_t first = p->loops[l].first, n = p->loops[l].ntasks;
    attn_loop_kind kind = p->loops[l].kind;
    double busy;
    for (size_t i = 0; i < n; i++)
        sec[i] = task_cost(bs, &p->tasks[first + i]);
    double loop = simulate_loop(sec, n, threads, &busy);
    double dram = loop_bytes(&bs->hp, T, kind) / (g_dram_gbs * 1e9);
    double idle = loop > 0 ? 1 - busy / (threads * loop) : 0;
    row->sec += loop;
    row->dram_sec += dram;
    if (dram > loop) row->dram |= 1 << kind;
    if (idle > row->worst_idle) row->worst_idle = idle, row->worst = kind;
    row->ntasks[kind] = n;
    attn_plan_task *k = kind == ATTN_LOOP_ATTEND ? &row->task : &row->tile;
    double *rate = kind == ATTN_LOOP_ATTEND ? &row->task_gflops : &row->tile_gflops;
    if (kind == ATTN_LOOP_ATTEND || kind == ATTN_LOOP_PROJ) {
        *k = p->tasks[first];
        *rate = task_flops(k) / sec[0] / 1e9;
    }
}

/* Simulates plan p on `threads` threads into row. Returns 0, or -1 when
 * out of memory. */
static int simulate(const bench_shape *bs, const attn_plan *p, size_t T, int threads,
                    sim_row *row) {
    double *sec = malloc(sizeof(double) * (p->ntasks ? p->ntasks : 1)); /* task costs */
    memset(row, 0, sizeof *row);
    if (!sec) return -1;
    for (int l = 0; l < p->nloops; l++)
        simulate_one(bs, p, l, T, threads, sec, row);
    free(sec);
    return 0;
}

/* ---- bench_core's measured medians ---------------------------------------- */

typedef struct {
    shape s;
    int threads;
    double ms;
} measured;

static measured g_measured[MAX_MEASURED];
static int g_nmeasured;

/* Reads the attnd lines of a bench_core --json file. */
static void read_measured(const char *path) {
    FILE *f = fopen(path, "r");
    char line[512];
    if (!f) {
        perror(path);
        return;
    }
    while (fgets(line, sizeof line, f) && g_nmeasured < MAX_MEASURED) {
        measured *m = &g_measured[g_nmeasured];
        if (sscanf(line,
                   "{\"impl\": \"attnd\", \"shape\": [%d, %d, %d, %d], \"threads\": %d, "
                   "\"ms\": %lf}",
                   &m->s.B, &m->s.L, &m->s.E, &m->s.H, &m->threads, &m->ms) == 6)
            g_nmeasured++;
    }
    fclose(f);
}

/* bench_core's median ms for s at threads, or 0. */
static double measured_ms(const shape *s, int threads) {
    for (int i = 0; i < g_nmeasured; i++) {
        const measured *m = &g_measured[i];
        if (!memcmp(&m->s, s, sizeof *s) && m->threads == threads) return m->ms;
    }
    return 0;
}

/* ---- the table -------------------------------------------------------------- */

static int shape_new(bench_shape *bs, const shape *s) {
    char err[256] = "";
    attn_hparams hp = {.embed_dim = s->E, .num_heads = s->H, .kdim = s->E, .vdim = s->E, .bias = 1};
    memset(bs, 0, sizeof *bs);
    bs->s = *s;
    size_t T = (size_t)s->B * s->L;
    if (attn_model_init(&bs->m, &hp, err, sizeof err) < 0) goto fail;
    bs->hp = bs->m.hp;
    fill(bs->m.mem, bs->m.n_floats, 1.0f / sqrtf((float)s->E));
    if (attn_model_pack(&bs->m, err, sizeof err) < 0) goto fail;
    bs->W = 3 * s->E;
    bs->A = attn_alloc_big(sizeof(float) * T * s->E); /* as a forward's scratch: huge pages */
    bs->C = attn_alloc_big(sizeof(float) * T * bs->W);
    bs->qkv = attn_alloc_big(sizeof(float) * (size_t)s->L * bs->W);
    if (!bs->A || !bs->C || !bs->qkv) goto fail;
    fill(bs->A, T * s->E, 1.0f);
    fill(bs->C, T * bs->W, 1.0f);
    fill(bs->qkv, (size_t)s->L * bs->W, 1.0f);
    return 0;
fail:
    fprintf(stderr, "bench_scale: setup failed: %s\n", err[0] ? err : "out of memory");
    return -1;
}

/* Frees the model and buffers; the plans, costs and hp stay. */
static void shape_free(bench_shape *bs) {
    attn_model_free(&bs->m);
    free(bs->A);
    free(bs->C);
    free(bs->qkv);
    bs->A = bs->C = bs->qkv = NULL;
}

static void print_row(const shape *s, int threads, const sim_row *r, double t1) {
    char dram[32] = "";
    for (int k = 0; k < ATTN_LOOPS; k++)
        if (r->dram & 1 << k)
            snprintf(dram + strlen(dram), sizeof dram - strlen(dram), "%s%s", dram[0] ? "," : "",
                     LOOP_NAME[k]);
    double ms = measured_ms(s, threads);
    char meas[32] = "-";
    if (ms > 0) snprintf(meas, sizeof meas, "%.2f (%+.0f%%)", ms, 100 * (r->sec * 1e3 / ms - 1));
    printf(
        "%3d %5zu %4zu %5zu %4dx%-4d %5.0f %5dx%-5d %5.0f %9.3f %9.3f %6.1f %5.0f %4s %3.0f%% %-9s "
        "%s\n",
        threads, r->ntasks[ATTN_LOOP_PROJ], r->ntasks[ATTN_LOOP_ATTEND], r->ntasks[ATTN_LOOP_OUT],
        r->tile.rows, r->tile.cols, r->tile_gflops, r->task.rows, r->task.cols, r->task_gflops,
        r->sec * 1e3, r->dram_sec * 1e3, t1 / r->sec, 100 * t1 / r->sec / threads,
        LOOP_NAME[r->worst], 100 * r->worst_idle, dram[0] ? dram : "-", meas);
}

/* The plans of s at every thread count into bs, and their task shapes
 * measured. Returns 0, or -1 with a message printed. */
static int measure_shape(bench_shape *bs, const shape *s) {
    char err[256] = "";
    attn_seq *seqs = calloc((size_t)s->B, sizeof *seqs);
    int rc = -1;
    if (!seqs || shape_new(bs, s) < 0) goto cleanup;
    for (int i = 0; i < s->B; i++)
        seqs[i] = (attn_seq){.L = s->L, .S = s->L};
    attn_batch b = {.B = s->B, .seqs = seqs}; /* tensors not read by the plan */
    for (int i = 0; i < NT; i++) {
        if (attn_plan_describe(&bs->plans[i], &bs->m, &b, g_threads[i], err, sizeof err) < 0) {
            fprintf(stderr, "bench_scale: %s\n", err);
            goto cleanup;
        }
        collect(bs, &bs->plans[i]);
    }
    measure_costs(bs);
    rc = 0;
cleanup:
    shape_free(bs);
    free(seqs);
    return rc;
}

static void print_table(const bench_shape *bs) {
    const shape *s = &bs->s;
    printf("(B,L,E,H) = (%d,%d,%d,%d)\n", s->B, s->L, s->E, s->H);
    printf("  T  proj attn   out  proj tile GF/s  attn rowsxkeys GF/s    sim ms   DRAM ms "
           "speedup  eff%% worst loop idle DRAM-bound measured ms (sim vs it)\n");
    double t1 = 0;
    for (int i = 0; i < NT; i++) {
        sim_row r;
        if (simulate(bs, &bs->plans[i], (size_t)s->B * s->L, g_threads[i], &r) < 0) {
            fprintf(stderr, "bench_scale: out of memory\n");
            return;
        }
        if (i == 0) t1 = r.sec;
        print_row(s, g_threads[i], &r, t1);
    }
}

static bench_shape g_runs[NSHAPES];

int main(int argc, char **argv) {
    double pool_us[2] = {-1, -1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--measured") && i + 1 < argc) {
            read_measured(argv[++i]);
        } else if (!strcmp(argv[i], "--dram-gbs") && i + 1 < argc) {
            g_dram_gbs = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--fused") && i + 1 < argc) {
            attn_set_fused(strcmp(argv[++i], "off") != 0);
        } else if (!strcmp(argv[i], "--pool-us") && i + 1 < argc) {
            if (sscanf(argv[++i], "%lf,%lf", &pool_us[0], &pool_us[1]) != 2) pool_us[0] = -1;
        } else {
            fprintf(stderr, "usage: bench_scale [--measured FILE] [--dram-gbs G] "
                            "[--fused on|off] [--pool-us LOOP,TASK]\n"
                            "  --pool-us  the pool's cost per loop and per task in us, "
                            "instead of the ones\n"
                            "             measured on 2 threads (which a busy machine "
                            "inflates; claims\n"
                            "             contend for one counter at 64 threads)\n");
            return 2;
        }
    }
    if (!(g_dram_gbs > 0)) g_dram_gbs = 460.8;
    double t0 = now_s();
    for (int i = 0; i < NSHAPES; i++) { /* pool rounds between the shapes, seconds apart */
        pool_round();
        if (measure_shape(&g_runs[i], &g_shapes[i]) < 0) return 1;
    }
    pool_round();
    g_pool = pool_fit();
    pool_cost measured_pool = g_pool;
    if (pool_us[0] >= 0) g_pool = (pool_cost){pool_us[0] * 1e-6, pool_us[1] * 1e-6};
    printf("attnd core at 1 to %d threads, simulated from the task graph (attn_plan_describe), "
           "fused kernel %s.\nCosts measured here on one thread; the pool's on 2: %.2f us per "
           "loop + %.3f us per task",
           MAX_T, attn_fused_supported(64) ? "on" : "off", measured_pool.per_loop * 1e6,
           measured_pool.per_task * 1e6);
    if (pool_us[0] >= 0)
        printf(" (used instead, --pool-us: %.2f + %.3f)", g_pool.per_loop * 1e6,
               g_pool.per_task * 1e6);
    printf(".\nAssumed: every thread at its 1-thread rate; DRAM at %.1f GB/s (bench/bench_scale.c "
           "says why).\n",
           g_dram_gbs);
    printf("Columns: tasks per loop; the first projection tile (rows x columns) and attention "
           "task (rows x keys)\nwith their measured rates; simulated ms; the least ms the "
           "loops' bytes need from DRAM; speed-up\nand efficiency over 1 thread; the loop "
           "that idles most and its idle share; loops slower in DRAM\nthan simulated; "
           "bench_core's measured median where it ran (--measured).\n");
    for (int i = 0; i < NSHAPES; i++) {
        print_table(&g_runs[i]);
        for (int t = 0; t < NT; t++)
            attn_plan_free(&g_runs[i].plans[t]);
    }
    printf("(%.1f s)\n", now_s() - t0);
    return 0;
}
