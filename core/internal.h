/* internal.h - what the files of core/ share with each other; not part of
 * the API (attn.h). One section per file, in the order a forward uses them.
 * Legend: see attn.h.
 */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include <stddef.h>

#include <cblas.h>

#include "attn.h"
#include "bf16.h"

/* ---- cpu.c: this CPU's features, probed once --------------------------- */

const attn_cpu *attn_cpu_this(void); /* attn_cpu_detect's answer, kept */
/* ATTN_ISA_* of the core's own kernels: AVX512 (AVX-512F), AVX2 (AVX2 and
 * FMA), else BASE. The OpenBLAS kernel set has its own rule (blas.c). */
int attn_isa(void);

/* ---- blas.c: OpenBLAS's cblas_sgemm, loaded by attn_blas_init ----------- */

extern __typeof__(cblas_sgemm) *blas_sgemm;

/* ---- model.c: checks shared by the fast and the reference forward ------- */

/* 1 when s is a KV-cache step: its cache in floats (kv) or bf16 pages (kv16). */
static inline int attn_seq_step(const attn_seq *s) {
    return s->kv || s->kv16;
}

/* Checks shapes and options of a batch; fills T (query tokens) and U (key
 * tokens). Returns 0, or -1 with a sentence in err. */
int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen);
/* 0 when m's weights are packed (attn_model_pack), which attn_forward
 * needs; else -1 with a sentence in err. */
int attn_check_packed(const attn_model *m, char *err, size_t errlen);
/* Scores' scale in float, as the forward multiplies by it: the default
 * 1/sqrt(D) in float, as attnd has always computed it, or the model's own. */
float attn_scale(const attn_hparams *hp);
/* 1 when hp (filled by attn_model_init) is plain nn.MultiheadAttention: no
 * grouped heads, head_dim, scale or rope. */
int attn_is_mha(const attn_hparams *hp);
/* 1 when s asks for a part of its attention matrices (attn_select), not all
 * of them (heads 0..H-1 in order, every row and whole rows are all of
 * them); 0 without weights. */
int attn_seq_selects(const attn_seq *s, int H);
/* The selected rows [*row0, *row1) and heads (n) of s, its selection's
 * defaults filled in. */
void attn_select_span(const attn_seq *s, int H, int *row0, int *row1, int *nheads);

/* ---- pool.c: a fixed set of threads that run one parallel loop at a time.
 * The caller's thread takes part as tid 0; with one thread nothing is
 * spawned. */
typedef struct attn_pool attn_pool;
typedef void (*attn_task_fn)(void *arg, int task, int tid);

attn_pool *attn_pool_new(int nthreads);
void attn_pool_free(attn_pool *p);
/* Runs fn(arg, i, tid) for every i in [0, ntasks) and returns when all
 * are done. Thread t runs its own contiguous share [t n / P, (t+1) n / P)
 * first, in order, then helps with the others' (pool.c): the same share
 * of every loop of n tasks, so that tasks ordered alike in two loops run
 * on the same thread. */
void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg);
/* No loop is coming soon: helpers stop spinning and sleep until the next
 * attn_pool_run (which ends the rest). */
void attn_pool_rest(attn_pool *p);
/* A loop is coming soon (any thread may say so): resting helpers wake and
 * spin for it, up to a millisecond, then sleep again. No-op unless resting. */
void attn_pool_wake(attn_pool *p);
/* Tests: helpers asleep now, and how often one woke for attn_pool_wake. */
void attn_pool_counts(attn_pool *p, int *sleeping, unsigned *woken);
/* Pins the calling thread (the one that runs the loops) to cpus[0] and
 * helper t to cpus[t % n]. Returns 0, or an errno value. */
int attn_pool_bind(attn_pool *p, const int *cpus, int n);

/* ---- mem.c: large buffers --------------------------------------------------- */

enum { ATTN_HUGE_MIN = 256u << 10 }; /* bytes from which a buffer gets huge pages */
/* A buffer for packed weights or scratch: 64-byte aligned, and from
 * ATTN_HUGE_MIN bytes 2 MiB aligned on huge pages (mem.c says why); free()
 * releases it. NULL when out of memory. */
void *attn_alloc_big(size_t bytes);
/* The bytes attn_alloc_big(bytes) takes: bytes rounded up to its alignment
 * (whole 2 MiB pages from ATTN_HUGE_MIN), which is what the process's
 * memory grows by once the buffer is touched. */
size_t attn_alloc_bytes(size_t bytes);

/* ---- ctx.c: a context's threads and the scratch of its forwards --------- */

/* One attention task: a block of query rows of one sequence, for one
 * key/value head and the query heads that read it, or for every head, or
 * the selected weights of the block (attn_select). */
enum {
    ATTN_TASK_FULL = -1,  /* every head: outputs and whole matrices */
    ATTN_TASK_SELECT = -2 /* the selected heads' weights of the block's selected rows */
};
typedef struct {
    int seq;  /* index into the batch */
    int head; /* key/value head (no matrix asked for), or ATTN_TASK_* */
    int i0;   /* first query row of the block */
    int i1;   /* one past the last */
} attn_task;

/* Where one sequence's rows are, once projected. */
typedef struct {
    size_t q0;          /* its first row in the batch's queries and projections */
    const float *k, *v; /* (S, G*D) at row stride ldkv: its keys and values */
    size_t ldkv;        /* (the projections, or a cache step's kv) */
    int shift;          /* position of query row 0: a step's cached tokens, else 0 */
    attn_seq view;      /* the sequence as the attention sees it: a step is causal */
    /* attention on bf16 operands (attn_model.attn16): */
    attn_bf16 *kv16; /* its keys and values in bf16 pages (bf16.h): a whole sequence's in the
                        context's scratch, a step's in its cache; else NULL */
    size_t page0;    /* a whole sequence's first page among the batch's (pages packed) */
} attn_seq_at;

/* Scratch sizes of one forward, and where the context holds them. */
typedef struct {
    size_t proj;  /* floats: the projections */
    size_t tile;  /* floats per thread: an attention task's scratch */
    size_t tasks; /* attention tasks */
    size_t seqs;  /* sequences */
    size_t freqs; /* doubles: rotary frequencies */
    size_t kv16;  /* bf16 elements: whole sequences' keys and values in pages */
    size_t a16;   /* bf16 elements: projection inputs rounded once (proj_run) */
} attn_ws_size;
typedef struct {
    float *proj;       /* (proj) */
    float **tile;      /* (threads) each (tile) */
    attn_task *tasks;  /* (tasks) */
    attn_seq_at *seqs; /* (seqs) */
    double *freqs;     /* (freqs) */
    attn_bf16 *kv16;   /* (kv16) */
    attn_bf16 *a16;    /* (a16) */
} attn_ws;

/* Grows ctx's scratch to need and says where it is. Returns 0, or -1 when
 * out of memory (ctx stays usable). */
int attn_ctx_reserve(attn_ctx *ctx, const attn_ws_size *need, attn_ws *ws);
size_t attn_ws_bytes(const attn_ws_size *need, int nthreads); /* need's bytes, allocated */
/* The bytes of scratch ctx holds now, as allocated: what attn_ws_bytes must
 * bound for every forward it has run (tests/test_core.c holds it to that). */
size_t attn_ctx_scratch_bytes(const attn_ctx *ctx);
attn_pool *attn_ctx_pool(attn_ctx *ctx);

/* ---- gemm.c: projections on weights packed once (see there) ------------ */

enum { ATTN_PANEL = 16 }; /* output columns per packed panel */
typedef struct attn_packed {
    int N, K;          /* W is (N,K): N outputs, K inputs */
    int panels;        /* ceil(N / ATTN_PANEL) */
    int kc;            /* K block of the layout (gemm.c) */
    float *p;          /* (panels, K, ATTN_PANEL), 64-byte aligned, zeros past N; owned */
    const float *bias; /* (N), borrowed from the model */
} attn_packed;

/* Packs W (N,K). Returns 0 or -1 (out of memory). */
int attn_packed_init(attn_packed *pw, const float *W, const float *bias, int N, int K);
void attn_packed_free(attn_packed *pw); /* zeroed or NULL: no-op */
/* C[r0:r1, 16*j0 : 16*j1) = A[r0:r1] (.,K) @ W^T + bias, clipped to N; the
 * fastest kernel the CPU runs. Rows of C and A at strides ldc and lda. */
void gemm_tile(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw, size_t r0,
               size_t r1, int j0, int j1);
/* The same, plain C with fmaf: what every FMA kernel must equal bit for bit. */
void gemm_ref(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw, size_t r0,
              size_t r1, int c0, int c1);
int gemm_level(void);            /* ATTN_ISA_* of the kernel the CPU runs */
int gemm_force_level(int level); /* tests: -1 = the CPU's; returns the previous */
/* tests: weights packed from now on in K blocks of kc (at most 256; 0 =
 * the CPU's choice, from its L1 size); returns the previous. */
int gemm_force_kc(int kc);
/* tests: 1 = rows 4 KiB apart copied before the kernel reads them, 0 = read
 * where they are, -1 = as the CPU's L1 needs (gemm.c); returns the previous
 * setting. */
int gemm_force_copy(int copy);

/* ---- proj.c: the projections of a forward as one parallel loop of tiles - */

enum { PROJ_PARTS = 3 }; /* at most Q, K and V at once */
typedef struct {
    const attn_packed *pw;        /* packed weights and bias: N outputs, K inputs; or NULL */
    const attn_packed_bf16 *pw16; /* the same in bf16 (a BF16 model), when pw is NULL */
    const float *W;               /* (N,K) the weights unpacked (ATTN_PROJ_OPENBLAS, fp32) */
    const float *A;               /* (M,K) inputs at row stride lda */
    size_t lda;
    attn_bf16 *A16; /* bf16 parts: A rounded here by proj_run, zeros past K, stride ld16 */
    size_t ld16;
    float *C; /* (M,N) outputs at row stride ldc */
    size_t ldc;
    size_t M;
} proj_part;
/* Part `which` (0 q, 1 k, 2 v, 3 out) of model m: outputs C at row stride
 * ldc from M rows of A at stride lda, on m's packed weights (fp32 or bf16:
 * m->precision). */
proj_part proj_part_of(const attn_model *m, int which, float *C, size_t ldc, const float *A,
                       size_t lda, size_t M);
/* bf16 elements of M rows of K inputs rounded for a bf16 part. */
size_t proj_rounded_elems(size_t M, int K);
/* Runs the parts' tiles on pool, or on the calling thread when pool is NULL.
 * by_rows: each thread's share of the tiles is a band of the rows (else a
 * band of the output columns). bf16 parts first have their inputs rounded
 * into a16 (proj_rounded_elems of each distinct input, summed), which sets
 * their A16; a16 is unused (may be NULL) for fp32 parts. */
void proj_run(attn_pool *pool, int nthreads, proj_part *parts, int nparts, int by_rows,
              attn_bf16 *a16);
/* The tiles proj_run cuts the parts into on nthreads threads: their count,
 * and each one's shape in tasks (loop `loop`) when tasks is not NULL. */
size_t proj_describe(attn_plan_task *tasks, attn_loop_kind loop, int nthreads,
                     const proj_part *parts, int nparts, int by_rows);

/* ---- rope.c: rotary positions -------------------------------------------- */

void attn_rope_freqs(const attn_rope *r, double *inv); /* inv (dim/2), scaling applied */
/* Rotates the first r->dim columns of each of `heads` heads (D floats
 * apart) of one row x at position pos. */
void attn_rope_row(float *x, int heads, int D, const attn_rope *r, const double *inv, double pos);

/* ---- softmax.c: the softmax of rows of scores ---------------------------- */

/* One tile of an online softmax: sc (M,n) at row stride ld holds scaled,
 * masked scores; mx and sum (M) are each row's running max and sum, acc
 * (M,D) its unnormalised output. On return sc holds e^(s - max) (zeros where
 * a row sees nothing yet) and acc is rescaled to the new max. */
void attn_softmax_online(float *sc, int ld, int M, int n, float *mx, float *sum, float *acc, int D);
/* Softmax of each of M rows of P (stride ld) over its first n entries, zeros
 * in [n, width); a row that sees nothing is all zeros. */
void attn_softmax_rows(float *P, size_t ld, int M, int n, int width);

/* ---- fused.c: the AVX-512 online-softmax block (see there) -------------- */

/* 1 when the CPU has AVX-512F, D is a multiple of 16 up to 128, and
 * attn_set_fused has not turned it off. */
int attn_fused_supported(int D);
size_t attn_fused_floats(int D); /* scratch floats one call needs */
enum { ATTN_FUSED_ROWS = 512 };  /* lanes (query rows x heads) one call may take */
/* For `rows` query rows at positions pos0.. of sequence s, each with R query
 * heads (D floats apart, rows ldq apart) that read one key/value head k, v
 * (S,D) at stride ldkv: q = softmax(q k^T * scale + masks) v, in place.
 * rows * R <= ATTN_FUSED_ROWS. */
void attn_fused_block(float *q, size_t ldq, int R, const float *k, const float *v, size_t ldkv,
                      const attn_seq *s, int pos0, int rows, int D, float scale, float *scratch);

/* ---- attend.c: the attention tasks -------------------------------------- */

/* The attention of one forward: its shape, then (once the projections are
 * done) where its rows are. */
typedef struct {
    int H, G, D;
    float scale;
    int bf16;       /* 1: every task runs on bf16 operands (attend_bf16.c) */
    int fused;      /* 1: no-weights tasks run attn_fused_block */
    int fused_rows; /* query rows per fused task (attn_attend_cut) */
    int rows_alone; /* 1: an OpenBLAS call takes one row's R heads, not a block of rows */
    float *q;       /* (T, H*D) at row stride ldq: queries in, head outputs out */
    size_t ldq;
    const attn_seq_at *seqs; /* (B) */
    const attn_task *tasks;
    float **tile; /* (threads) scratch */
} attn_attend;

/* M query rows that one OpenBLAS call takes, and the key/value head they read. */
typedef struct {
    float *q; /* (M,D) at stride ldq: queries in, the rows' head outputs out */
    size_t ldq;
    int M;
    int pos, dpos;  /* row m at position pos + m * dpos (causal and masks) */
    const float *k; /* (S,D) at stride ldkv */
    const float *v; /* (S,D) at stride ldkv */
    size_t ldkv;
    int jend; /* keys [jend, S) are hidden from every row (causal) */
} attn_qrows;

/* Rows [i0, i1) of sequence sa that read key/value head g: a block of one
 * head's rows (i1 - i0 rows, R == 1), or the R heads of row i0 (rows_alone,
 * i1 == i0 + 1). */
attn_qrows attn_rows_of(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1);
/* P (M, jend) at stride ldP = the scaled scores q k^T of the rows r. */
void attn_qk(const attn_attend *a, const attn_qrows *r, float *P, int ldP);
/* Rows [m0, m1) of P (scores of the rows r of sequence s) become their
 * attention weights: masked, softmax, zeros from jend to S. Each row's bits
 * are its own: they do not depend on the other rows. */
void attn_weigh(const attn_qrows *r, const attn_seq *s, float *P, int ldP, int m0, int m1);
/* mean (n) = P * inv, or += it when not first: a head's share of a mean. */
void attn_mean_add(float *mean, const float *P, size_t n, float inv, int first);
/* Query rows per task of the full (whole matrices) path for S keys: the
 * grid of row blocks that selections keep too. */
int attn_full_rows(int S);
/* 1 when s's whole matrices come from its output tasks (the full path);
 * a sequence that selects a part gets its output as with no matrix. */
int attn_full_weights(const attn_attend *a, const attn_seq *s);
/* Scratch floats one thread needs for sequence s. */
size_t attn_attend_floats(const attn_attend *a, const attn_seq *s);
/* Sets a's fused_rows for batch b on nthreads threads: ATTN_FUSED_ROWS
 * lanes a task, fewer while the batch gives fewer tasks than threads; a
 * row's bits do not depend on its block (fused.c). Call before
 * attn_attend_tasks. */
void attn_attend_cut(attn_attend *a, const attn_batch *b, int nthreads);
/* Fills tasks (when not NULL) with the batch's attention tasks; returns
 * their count. The first *nselect of them (ATTN_TASK_SELECT; nselect may be
 * NULL) read the queries that the others overwrite with head outputs: they
 * run first, in a loop of their own. */
size_t attn_attend_tasks(const attn_attend *a, const attn_batch *b, attn_task *tasks,
                         size_t *nselect);
/* Runs task t of a (an attn_attend) on thread tid: for attn_pool_run. */
void attn_attend_task(void *a, int t, int tid);

/* ---- attend_bf16.c: the attention tasks of a model with attn16 ------------ */

/* Query rows per task of sequence s, and the scratch floats one thread
 * needs for it. */
int attn_attend16_rows(const attn_attend *a, const attn_seq *s);
size_t attn_attend16_floats(const attn_attend *a, const attn_seq *s);
/* Query rows a task of weights over S keys takes (the R heads of each row
 * within a bound), and the scratch floats attn_attend16_weights needs for
 * `rows` rows of S keys. */
int attn_attend16_weight_rows(const attn_attend *a, int S);
size_t attn_attend16_weight_floats(const attn_attend *a, int rows, int S);
/* The attention weights of positions [i0, i1) of sequence sa for the R
 * heads that read key/value head g, by the block's formula (attend_bf16.c):
 * returns them in scratch, (i1-i0)*R rows of S, row (i-i0)*R + m for head
 * g*R + m at position i. A row's bits depend on its own query and keys
 * alone, never on i0, i1 or the thread. */
float *attn_attend16_weights(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                             float *scratch);
/* Task tk on scratch: no matrix asked for (tk->head >= 0), or every head
 * with its attention weights (tk->head == -1). */
void attn_attend16_task(const attn_attend *a, const attn_task *tk, float *scratch);

/* ---- select.c: the weights a sequence selects (attn_select) ------------- */

/* Scratch floats one select task of s needs. */
size_t attn_select_floats_of(const attn_attend *a, const attn_seq *s);
/* Sequence i's (s) select tasks from tasks[n] (when tasks is not NULL);
 * returns the next n. */
size_t attn_select_tasks(const attn_attend *a, const attn_seq *s, int i, attn_task *tasks,
                         size_t n);
/* One select task: the selected heads' weights of the selected rows of
 * its block, into the sequence's attn (and attn_idx). */
void attn_select_task(const attn_attend *a, const attn_task *tk, float *scratch);

#endif
