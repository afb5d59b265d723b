/* internal.h - helpers shared inside core/ only; not part of the API. */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include <stddef.h>

#include <cblas.h>

#include "attn.h"

/* cpu.c: this CPU's features, probed once. */
const attn_cpu *attn_cpu_this(void); /* attn_cpu_detect's answer, kept */
/* ATTN_ISA_* of the core's own kernels: AVX512 (AVX-512F), AVX2 (AVX2 and
 * FMA), else BASE. The OpenBLAS kernel set has its own rule (blas.c). */
int attn_isa(void);

/* blas.c: OpenBLAS's cblas_sgemm, loaded by attn_blas_init (never linked). */
extern __typeof__(cblas_sgemm) *blas_sgemm;

/* Checks shapes and options of a batch; fills T (query tokens) and U (key
 * tokens). Returns 0, or -1 with a sentence in err. */
int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen);
/* 0 when m's weights are packed (attn_model_pack), which the fast forwards
 * need; else -1 with a sentence in err. */
int attn_check_packed(const attn_model *m, char *err, size_t errlen);
/* 1 when hp (filled by attn_model_init) is plain nn.MultiheadAttention: no
 * grouped heads, head_dim, scale or rope. attn_forward hands the others to
 * attn_forward_decoder (decode.c). */
int attn_is_mha(const attn_hparams *hp);

/* A fixed set of threads that run one parallel loop at a time. The caller's
 * thread takes part as tid 0; with one thread nothing is spawned. */
typedef struct attn_pool attn_pool;
typedef void (*attn_task_fn)(void *arg, int task, int tid);

attn_pool *attn_pool_new(int nthreads);
void attn_pool_free(attn_pool *p);
/* Runs fn(arg, i, tid) for every i in [0, ntasks), tasks taken in order,
 * and returns when all are done. */
void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg);
/* No loop is coming soon: helpers stop spinning and sleep until the next
 * attn_pool_run (which ends the rest). */
void attn_pool_rest(attn_pool *p);

/* softmax.c: the softmax of rows of scores. */
/* One tile of an online softmax: sc (M,n) at row stride ld holds scaled,
 * masked scores; mx and sum (M) are each row's running max and sum, acc
 * (M,D) its unnormalised output. On return sc holds e^(s - max) (zeros where
 * a row sees nothing yet) and acc is rescaled to the new max. */
void attn_softmax_online(float *sc, int ld, int M, int n, float *mx, float *sum, float *acc, int D);
/* Softmax of each of M rows of P (stride ld) over its first n entries, zeros
 * in [n, width); a row that sees nothing is all zeros. */
void attn_softmax_rows(float *P, size_t ld, int M, int n, int width);

/* ctx.c: a context's threads and the scratch of its forwards. */
/* One attention task: a block of query rows of one sequence, for one head
 * or for every head. */
typedef struct {
    int seq;  /* index into the batch */
    int head; /* head, or -1: every head (the weights path) */
    int i0;   /* first query row of the block */
    int i1;   /* one past the last */
} attn_task;
/* Scratch sizes of one forward, and where the context holds them. */
typedef struct {
    size_t proj;  /* floats: the projections */
    size_t tile;  /* floats per thread: an attention task's scratch */
    size_t tasks; /* attention tasks */
    size_t seqs;  /* sequences */
} attn_ws_size;
typedef struct {
    float *proj;      /* (proj) */
    float **tile;     /* (threads) each (tile) */
    attn_task *tasks; /* (tasks) */
    size_t *off;      /* (2 * seqs) query then key row offsets of each sequence */
} attn_ws;
/* Grows ctx's scratch to need and says where it is. Returns 0, or -1 when
 * out of memory (ctx stays usable). */
int attn_ctx_reserve(attn_ctx *ctx, const attn_ws_size *need, attn_ws *ws);
size_t attn_ws_bytes(const attn_ws_size *need, int nthreads); /* need's bytes */
attn_pool *attn_ctx_pool(attn_ctx *ctx);                      /* NULL for a NULL context */

/* fused.c: the AVX-512 online-softmax block (see there). Supported when the
 * CPU has AVX-512F and D is a multiple of 16 up to 128. */
int attn_fused_supported(int D);
size_t attn_fused_floats(int D); /* scratch floats one block needs */
enum { ATTN_FUSED_ROWS = 512 };  /* query rows one call may take */
/* out (Lb,D) at stride ldo = softmax(q k^T * scale + masks) v for query
 * rows [i0, i0+Lb) of sequence s, Lb <= ATTN_FUSED_ROWS; out may be q. */
void attn_fused_block(float *out, size_t ldo, const float *q, size_t ldq, const float *k,
                      size_t ldk, const float *v, size_t ldv, const attn_seq *s, int i0, int Lb,
                      int D, float scale, float *scratch);

/* gemm.c: projections on weights packed once (see there). */
enum { ATTN_PANEL = 16 }; /* output columns per packed panel */
typedef struct attn_packed {
    int N, K;          /* W is (N,K): N outputs, K inputs */
    int panels;        /* ceil(N / ATTN_PANEL) */
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

/* proj.c: the projections of a forward as one parallel loop of tiles. */
enum { PROJ_PARTS = 3 }; /* at most Q, K and V at once */
typedef struct {
    const attn_packed *pw; /* packed weights and bias: N outputs, K inputs */
    const float *W;        /* (N,K) the same weights unpacked (ATTN_PROJ_OPENBLAS) */
    const float *A;        /* (M,K) inputs at row stride lda */
    size_t lda;
    float *C; /* (M,N) outputs at row stride ldc */
    size_t ldc;
    size_t M;
} proj_part;
/* Part `which` (0 q, 1 k, 2 v, 3 out) of model m: outputs C at row stride
 * ldc from M rows of A at stride lda, on m's packed weights. */
proj_part proj_part_of(const attn_model *m, int which, float *C, size_t ldc, const float *A,
                       size_t lda, size_t M);
/* Runs the parts' tiles on pool, or on the calling thread when pool is NULL. */
void proj_run(attn_pool *pool, int nthreads, const proj_part *parts, int nparts);

#endif
