/* attn.h - the attention core: one torch.nn.MultiheadAttention layer as a
 * C library. Weights in, packed tensors in, tensors out. No I/O, no HTTP,
 * no JSON, no request queues: those live in config/ and server/.
 *
 * Legend (used in every shape comment of core/):
 *   B  sequences in a batch          L  query length of one sequence
 *   S  key length of one sequence    E  embed width (query and output)
 *   H  heads                         D  head width, E / H unless head_dim says
 *   G  key/value heads (num_kv_heads), divides H; query head h reads
 *      key/value head h / (H / G). G == H is nn.MultiheadAttention.
 *   Kd key input width (kdim)        Vd value input width (vdim)
 *   T  query tokens of a batch, sum of L over its sequences
 *   U  key tokens of a batch, sum of S over its sequences
 * Every tensor is float32, row-major, packed: the rows of sequence b follow
 * those of sequence b-1 with no padding. A bf16 model (attn_precision) takes
 * and gives float32 too; only its weights, the operands of its products and
 * its KV caches are bf16.
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

/* Rotary position embeddings (decoders: Llama, Mistral, Qwen, GPT-J). q and
 * k are rotated after projection, each pair of a head's first `dim` columns
 * by the angle pos * inv_freq[i], inv_freq[i] = theta^(-2i/dim):
 *   HALF         pairs (x[i], x[i + dim/2]): Hugging Face's rotate_half
 *   INTERLEAVED  pairs (x[2i], x[2i+1]): GPT-J and Meta's original Llama
 * Scaling stretches the frequencies for contexts longer than trained:
 *   LINEAR  inv_freq / factor (positions divided by factor)
 *   LLAMA3  Llama 3.1's rule: wavelengths longer than
 *           original_max_position / low_freq_factor are divided by factor,
 *           shorter than original_max_position / high_freq_factor kept, and
 *           blended in between.
 *   YARN    YaRN (arXiv 2309.00071) as Hugging Face computes it: pairs that
 *           turn fewer than beta_slow times over original_max_position are
 *           divided by factor, more than beta_fast times kept, blended
 *           linearly in between (the bounds floored and ceiled unless
 *           exact_range); cos and sin are then multiplied by
 *           attention_factor. All of it is fixed per pair, not per sequence,
 *           so a KV cache holds the same keys a whole pass makes. */
typedef enum { ATTN_ROPE_HALF = 0, ATTN_ROPE_INTERLEAVED = 1 } attn_rope_style;
typedef enum {
    ATTN_ROPE_SCALE_NONE = 0,
    ATTN_ROPE_SCALE_LINEAR = 1,
    ATTN_ROPE_SCALE_LLAMA3 = 2,
    ATTN_ROPE_SCALE_YARN = 3
} attn_rope_scaling;

typedef struct {
    int dim;                   /* rotated columns per head: even, <= D; 0 = no rotation */
    double theta;              /* frequency base, > 0 (10000 Llama 2, 500000 Llama 3) */
    attn_rope_style style;     /* HALF (default) or INTERLEAVED */
    attn_rope_scaling scaling; /* NONE (default), LINEAR, LLAMA3 or YARN */
    double factor;             /* LINEAR, LLAMA3, YARN: > 0 (8 in Llama 3.1) */
    double low_freq_factor;    /* LLAMA3: > 0 (1 in Llama 3.1) */
    double high_freq_factor;   /* LLAMA3: > low_freq_factor (4 in Llama 3.1) */
    int original_max_position; /* LLAMA3, YARN: trained context, >= 1 (8192 in Llama 3.1) */
    double beta_fast;          /* YARN: > 0; 0 means 32 */
    double beta_slow;          /* YARN: > 0; 0 means 1 */
    double mscale;             /* YARN: >= 0; with mscale_all_dim, the attention factor's */
    double mscale_all_dim;     /*       0.1 ln(factor) terms are scaled by each (DeepSeek) */
    double attention_factor;   /* YARN: > 0, or 0: from factor (and mscale) */
    int exact_range;           /* YARN: 1 keeps the blend's bounds unrounded (truncate: false) */
} attn_rope;

/* What cos and sin are multiplied by: YaRN's attention factor, else 1
 * (core/prim/rope.c). */
double attn_rope_attention_factor(const attn_rope *r);

/* What a model computes in (SPEC section 8). FP32 is the contract of SPEC
 * section 1. BF16: weights held and packed in bf16 at load; the operands of
 * the projections and of QK^T and PV rounded to bf16, their products summed
 * in fp32; softmax (its running max and sum), biases and outputs in fp32
 * (core/bf16.h). INT8: the projections' weights quantized at load
 * (symmetric int8, one fp32 scale per output channel), each input row
 * quantized with its own scale, products summed exactly in int32; the
 * attention as a BF16 model's (core/ops/int8.c). */
typedef enum { ATTN_FP32 = 0, ATTN_BF16 = 1, ATTN_INT8 = 2 } attn_precision;

/* Hyper-parameters, named as torch and Hugging Face name them. The fields
 * after `causal` default to nn.MultiheadAttention when zero; attn_model_init
 * fills num_kv_heads, head_dim and scale in the model's copy. */
typedef struct {
    int embed_dim;    /* E, >= 1 */
    int num_heads;    /* H, >= 1; divides E unless head_dim is given */
    int kdim;         /* Kd, key input width; E when the config leaves it out */
    int vdim;         /* Vd, value input width; E when the config leaves it out */
    int bias;         /* 1: q, k, v and out projections carry biases; 0: none */
    int causal;       /* default for requests that do not say; not a weight */
    int num_kv_heads; /* G, divides H; 0 = H */
    int head_dim;     /* D; 0 = E / H */
    double scale;     /* multiplies q k^T; 0 = 1 / sqrt(D); else > 0 */
    attn_rope rope;   /* rope.dim == 0: none */

    /* What the model asks to compute in: FP32 (default) or BF16. */
    attn_precision precision;
} attn_hparams;

/* The zero defaults resolved: G, D (0 when E % H != 0 and no head_dim is
 * given, which attn_model_init refuses). The one place they are written;
 * the config's checks read them here too. */
static inline int attn_hparams_kv_heads(const attn_hparams *hp) {
    return hp->num_kv_heads ? hp->num_kv_heads : hp->num_heads;
}
static inline int attn_hparams_head_dim(const attn_hparams *hp) {
    if (hp->head_dim) return hp->head_dim;
    return hp->embed_dim % hp->num_heads ? 0 : hp->embed_dim / hp->num_heads;
}

/* A model owns its weights in one allocation (`mem`). The pointers below
 * point into it in this order, which is torch's state_dict layout:
 *   q_w (H*D,E) | k_w (G*D,Kd) | v_w (G*D,Vd) | q_b (H*D) | k_b (G*D) |
 *   v_b (G*D) | out_w (E,H*D) | out_b (E)
 * so when G == H, H*D == E and Kd == Vd == E, q_w..v_w is in_proj_weight
 * (3E,E) and q_b..v_b is in_proj_bias (3E). Biases are zeros when
 * hp.bias == 0 (or when a layout's tensor is absent, docs/config.md).
 * A model packed to compute in bf16 (precision BF16, attn_model_pack)
 * holds its weight matrices in bf16 alone: mem then holds the biases,
 * q_b | k_b | v_b | out_b, and q_w, k_w, v_w and out_w are NULL. */
typedef struct {
    attn_hparams hp;            /* num_kv_heads, head_dim and scale filled in */
    float *q_w;                 /* (H*D, E)  */
    float *k_w;                 /* (G*D, Kd) */
    float *v_w;                 /* (G*D, Vd) */
    float *q_b;                 /* (H*D) */
    float *k_b;                 /* (G*D) */
    float *v_b;                 /* (G*D) */
    float *out_w;               /* (E, H*D) */
    float *out_b;               /* (E) */
    float *mem;                 /* the one allocation; owned, freed by attn_model_free */
    size_t n_floats;            /* floats in mem */
    struct attn_packed *packed; /* (4) q_w, k_w, v_w, out_w in the fp32 projection kernel's
                                   layout (core/kernels/gemm.h): made by attn_model_pack for an
                                   FP32 model, owned; NULL before, and for a BF16 one */

    /* Set by attn_model_pack. What the forward computes in: BF16 when
     * hp.precision asks for it and the CPU has AVX512-BF16 or AMX-BF16
     * (attn_bf16_kernels), else FP32. */
    attn_precision precision;
    /* BF16: q_w, k_w, v_w, out_w packed in bf16 (core/bf16.h), owned; else NULL. */
    struct attn_packed_bf16 *packed16;
    /* INT8: q_w, k_w, v_w, out_w quantized and packed in int8
     * (core/kernels/gemm_int8.h), owned; else NULL. */
    struct attn_packed_int8 *packed8;
    /* 1: QK^T and PV take bf16 operands too, and a session's cache is bf16
     * pages (attn_seq.kv16): a BF16 model whose head width D is a multiple
     * of 32 up to 256, with H/G <= 512. 0: the attention and the caches are
     * fp32 (a BF16 model's projections are bf16 either way). */
    int attn16;
    /* Set by attn_model_pack: the model's rows of the core's precision
     * tables (core/ops/ops.h), which every step of a forward calls. */
    const struct attn_proj_ops *proj_ops;
    const struct attn_attend_ops *attend_ops;
} attn_model;

/* Checks hp and allocates zeroed weights. Returns 0, or -1 with a sentence
 * in err. On failure m holds nothing to free (attn_model_free is still safe). */
int attn_model_init(attn_model *m, const attn_hparams *hp, char *err, size_t errlen);
/* Packs the weights for the projection kernel, once, after they are filled
 * (again if they change); attn_forward needs it. It settles what the model
 * computes in (m->precision, m->attn16) from hp.precision and the bf16
 * kernels of this CPU. FP32: the weights are packed in fp32 beside mem
 * (about doubling the model's memory). BF16: they are rounded and packed
 * in bf16, and the fp32 matrices are freed (mem keeps the biases, which
 * stay fp32): a quarter of an FP32 model's bytes; such a model is packed
 * once (a second call changes nothing). Returns 0, or -1 with a sentence
 * in err (out of memory). */
int attn_model_pack(attn_model *m, char *err, size_t errlen);
/* Bytes the model holds: mem and the packed weights. */
size_t attn_model_bytes(const attn_model *m);
/* The bytes that hold the weights the model computes with, for a
 * fingerprint: mem, then for a BF16 model its four bf16 matrices as packed.
 * Fills p and n (up to 5 blocks); returns how many. */
int attn_model_weight_blocks(const attn_model *m, const void *p[5], size_t n[5]);
/* 1 when a query row's outputs are the same bits whatever rows share its
 * forward (the projections' always are): a KV-cache step of n rows then
 * gives the bits of n steps of one row. True of a bf16 attention, of the
 * fused AVX-512 block (attn_set_fused), of decoder models; not of plain
 * multi-head attention on OpenBLAS tiles. After attn_model_pack. */
int attn_model_rows_free(const attn_model *m);
/* Frees the weights; safe on a zeroed or already freed model. */
void attn_model_free(attn_model *m);

typedef enum {
    ATTN_WEIGHTS_NONE = 0, /* no attention matrix: tiled online-softmax path */
    ATTN_WEIGHTS_MEAN = 1, /* (L,S): mean over heads */
    ATTN_WEIGHTS_HEADS = 2 /* (H,L,S): one matrix per head */
} attn_weights_mode;

/* A part of a sequence's attention matrices (attn_seq.sel): some heads,
 * a range of query rows, and per row only its k largest weights. Zeroed, it
 * is the whole matrix. A part is computed on its own (attend.c): the
 * output by the no-weights path, the weights by tasks over the selected
 * heads and the blocks of rows that hold the selected rows, never a whole
 * (L,S) matrix per head; the weights are the bits the whole matrix would
 * hold at the same (head, row). */
typedef struct {
    const int *heads; /* (n_heads) distinct query heads in [0,H), returned in this order;
                         "mean" averages over them. NULL: every head, 0..H-1 */
    int n_heads;      /* 1..H with heads; 0 without */
    int row0, row1;   /* query rows [row0, row1), 0 <= row0 < row1 <= L; both 0: every row */
    int top_k;        /* 1..S: each returned row's k largest weights in descending order (equal
                         weights: the lower key index first), their key indices in
                         attn_seq.attn_idx; 0: whole rows */
} attn_select;

/* One sequence of a batch: its lengths, masks and what it wants back.
 * Masks are the sequence's own (not packed); NULL means none. */
typedef struct {
    int L;                           /* query length, >= 1 */
    int S;                           /* key length, >= 1; must equal L in a self-attention batch */
    int causal;                      /* 1: hide key j > query i */
    const uint8_t *key_padding_mask; /* (S), nonzero = hidden, or NULL */
    const uint8_t *attn_mask_bool;   /* (L,S), nonzero = hidden, or NULL */
    const float *attn_mask_add; /* (L,S), added to the scaled scores (may hold -inf), or NULL */
    const int32_t *positions;   /* (L) rotary position of each row (self-attention: of
                                   query and key row alike), >= 0, or NULL: 0..L-1 */
    attn_weights_mode weights;  /* which attention matrix to return */
    /* out: (H,L,S) for HEADS, (L,S) for MEAN, else unused; caller-owned. With
     * a selection: (Hs,Ls,W) or (Ls,W), Hs = sel.n_heads (or H), Ls = sel.row1 -
     * sel.row0 (or L), W = sel.top_k (or S): attn_select_floats of them. */
    float *attn;
    attn_select sel;   /* which part of the matrix; zeroed: all of it */
    int32_t *attn_idx; /* out with sel.top_k: the key index of each weight in attn (the
                          shape of attn), caller-owned; else unused */
    /* A KV-cache session step (self-attention batches only): the sequence's
     * L rows are the tokens at positions cached .. cached+L-1 of a session
     * whose earlier tokens' rotated keys and values are in kv. They attend
     * causally over those and themselves (S == cached + L; `causal`,
     * `positions` and the masks must be 0/NULL), and the forward writes
     * their own key and value rows into kv[cached, cached+L). kv holds one
     * row per token: its rotated key (G,D), then its value (G,D), so
     * 2*G*D floats a row. NULL: a whole sequence, not a step. */
    float *kv;  /* (cached+L, 2*G*D), caller-owned */
    int cached; /* tokens already in kv, >= 0 */
    /* The same cache for a model with attn16: instead of kv, the tokens'
     * rotated keys and values in bf16, in pages of ATTN_KV16_PAGE tokens
     * (the layout of core/bf16.h),
     * attn_kv_bytes(m, cached + L) bytes; a page's slots past its last
     * token hold zeros (a cache zeroes each page before its first token). */
    uint16_t *kv16; /* caller-owned, or NULL */
} attn_seq;

enum { ATTN_KV16_PAGE = 32 }; /* tokens per page of a bf16 cache (attn_seq.kv16) */

/* Bytes of a cache of `tokens` tokens of model m (attn_seq.kv or .kv16):
 * tokens * 2*G*D floats, or for a model with attn16 whole pages of 32
 * tokens of 2*G*D bf16 (half). A cache grown from a smaller one keeps its
 * bytes where they are (pages never move). */
size_t attn_kv_bytes(const attn_model *m, size_t tokens);

/* A bf16 cache (attn_seq.kv16) of G key/value heads of width D as rows and
 * back, for a session's state file: rows (tokens, 2*G*D) bf16 bits, row t
 * holding token t's key (G,D) then its value (G,D), as attn_seq.kv's rows
 * hold floats. Bits are copied, never rounded, so rows taken out and put
 * back give the very cache. attn_kv16_from_rows writes tokens [0, tokens)
 * of a cache of attn_kv_bytes for them and zeroes the last page's slots
 * past them. */
void attn_kv16_to_rows(const uint16_t *kv16, int G, int D, size_t tokens, uint16_t *rows);
void attn_kv16_from_rows(uint16_t *kv16, int G, int D, size_t tokens, const uint16_t *rows);

/* Floats of s's attention answer for a model of H heads: the shape attn
 * has (above), 0 for ATTN_WEIGHTS_NONE. Overflow is the caller's to rule
 * out (a server bounds what it admits). */
size_t attn_select_floats(const attn_seq *s, int H);

/* A batch: packed tensors plus per-sequence lengths and options.
 * key == NULL makes every sequence self-attention (key = value = query,
 * which needs Kd == Vd == E). value == NULL makes value = key. */
typedef struct {
    int B;              /* sequences, >= 1 */
    attn_seq *seqs;     /* (B) */
    const float *query; /* (T, E)  */
    const float *key;   /* (U, Kd) or NULL */
    const float *value; /* (U, Vd) or NULL */
    float *out;         /* out: (T, E), caller-owned */
} attn_batch;

/* A compute context: the threads one forward may use and the scratch it
 * reuses across calls. Not shared: one context per calling thread.
 * The core owns parallelism: it splits work over its own nthreads threads
 * (the caller's thread is one of them) and keeps OpenBLAS single-threaded. */
typedef struct attn_ctx attn_ctx;

/* nthreads >= 1. Returns NULL when out of memory or threads. */
attn_ctx *attn_ctx_new(int nthreads);
void attn_ctx_free(attn_ctx *ctx); /* NULL is a no-op */
int attn_ctx_threads(const attn_ctx *ctx);
/* Runs fn(arg, task, thread) for every task in [0, ntasks) on the context's
 * threads (thread in [0, attn_ctx_threads)), tasks taken in order, and
 * returns when all are done: for a caller's own parallel work between
 * forwards (a server packing inputs and writing answers). fn must not call
 * back into the same context. */
void attn_ctx_parallel(attn_ctx *ctx, int ntasks, void (*fn)(void *arg, int task, int thread),
                       void *arg);
/* Between parallel loops the context's threads spin for a short while, so
 * that the next loop of a batch starts at once. A caller with nothing more
 * to run soon (a server whose queues are empty) says so, and they sleep at
 * once instead of taking CPU from other threads. The next loop wakes them. */
void attn_ctx_rest(attn_ctx *ctx);
/* A forward is coming soon, say a server that has just queued a request:
 * resting threads wake now, while the caller's own thread is woken, and
 * wait for the forward's first loop spinning (up to a millisecond, or
 * until attn_ctx_rest). Any thread may call it, at any time; it does
 * nothing unless the context rests. */
void attn_ctx_wake(attn_ctx *ctx);
/* Pins the context's threads, one CPU each: the calling thread, which must
 * be the one that runs this context's forwards, to cpus[0] and thread t to
 * cpus[t % n]. Unpinned, the OS may queue a woken thread on the CPU of the
 * thread that woke it while another CPU idles, and a lone forward after a
 * pause then runs at about one thread's speed (docs/performance.md). A
 * server that owns its CPUs (its pool as large as its affinity mask)
 * pins; one that shares them with a quota does not. Returns 0, or -1 with
 * a sentence in err. */
int attn_ctx_bind(attn_ctx *ctx, const int *cpus, int n, char *err, size_t errlen);

/* Scratch bytes a forward of this batch needs beyond its inputs and outputs
 * (upper bound), as the core allocates them: buffers of 256 KiB and more in
 * whole 2 MiB pages. A caller can bound memory with it before a batch runs. */
size_t attn_workspace_bytes(const attn_model *m, const attn_batch *b, int nthreads);

/* The forward, the one road of every batch: the projections of all tokens
 * at once, rotary positions where the model has them, per (sequence,
 * key/value head, block of rows) QK^T, softmax and AV, then the output
 * projection; every mask and weights mode, grouped heads, self- and
 * cross-attention, and cache steps (attn_seq.kv) mixed with whole
 * sequences. Tiled with an online softmax when no attention matrix is
 * asked for. ctx is required. Returns 0, or -1 with a sentence in err (bad
 * shapes, out of memory). */
int attn_forward(attn_ctx *ctx, const attn_model *m, attn_batch *b, char *err, size_t errlen);

/* ---- a forward's plan, as data: what its parallel loops would be -------- */

/* The loops of a forward, in the order it runs them; a loop with no task
 * is left out. */
typedef enum {
    ATTN_LOOP_ROUND = 0,     /* the projections' inputs prepared once (a bf16 model: rounded) */
    ATTN_LOOP_PROJ = 1,      /* the Q, K and V projections: tiles */
    ATTN_LOOP_PREP = 2,      /* rotary positions and cache rows: blocks of rows */
    ATTN_LOOP_PACK = 3,      /* whole sequences' keys and values into bf16 pages: pages */
    ATTN_LOOP_SELECT = 4,    /* selected attention weights: (sequence, row block) */
    ATTN_LOOP_ATTEND = 5,    /* the attention: (sequence, key/value head, row block) */
    ATTN_LOOP_OUT_ROUND = 6, /* the output projection's inputs prepared once */
    ATTN_LOOP_OUT = 7,       /* the output projection: tiles */
    ATTN_LOOPS = 8
} attn_loop_kind;

/* One task of a loop and its work. A projection tile computes rows x cols
 * outputs over depth inputs (2 * rows * cols * depth FLOPs); an attention
 * or selection task scores rows x heads queries against keys keys of width
 * depth, then sums as many values (4 * rows * heads * keys * depth FLOPs,
 * the masked keys of a causal block's last tile counted). A preparing task
 * rounds rows x depth inputs; a packing task a page of rows tokens of depth
 * keys and values; a PREP task rotates or caches rows rows. */
typedef struct {
    attn_loop_kind loop;
    int part;  /* PROJ: 0 q, 1 k, 2 v; OUT: 3; SELECT, ATTEND: the sequence; else 0 */
    int rows;  /* tile rows, a task's query rows, PREP's or ROUND's rows, PACK's tokens */
    int cols;  /* tile output columns; SELECT, ATTEND: keys the block reads; else 0 */
    int depth; /* tile inputs (K); SELECT, ATTEND: head width D; ROUND: inputs; PACK: 2*G*D */
    int heads; /* SELECT, ATTEND: query heads per row (H/G, or H with a matrix asked for); else 1 */
} attn_plan_task;

typedef struct {
    int nloops;
    struct {
        attn_loop_kind kind;
        size_t first, ntasks; /* its tasks: tasks[first .. first + ntasks) */
    } loops[ATTN_LOOPS];
    attn_plan_task *tasks; /* (ntasks) in the order the pool hands them out; owned */
    size_t ntasks;
} attn_plan;

/* The loops attn_forward would run for batch b on model m (packed) with
 * nthreads threads on this CPU: the list the forward builds and runs
 * (core/forward/fwd.h), so the two cannot drift; b's tensors are not read
 * (b->key != NULL: cross-attention), nor checked. For simulations of thread counts a machine does
 * not have, and for tests. Returns 0, or -1 with a sentence in err (model not packed, out of
 * memory). Fills out (nothing to free on failure); attn_plan_free releases it. */
int attn_plan_describe(attn_plan *out, const attn_model *m, const attn_batch *b, int nthreads,
                       char *err, size_t errlen);
void attn_plan_free(attn_plan *plan); /* zeroed or freed: no-op */

/* The naive reference: plain loops, plainly right, slow. Same contract,
 * cache steps included. */
int attn_forward_ref(const attn_model *m, attn_batch *b, char *err, size_t errlen);

/* The no-weights path runs a fused AVX-512 kernel when the CPU has AVX-512F
 * and D is a multiple of 16 up to 128 (and H/G <= 512), and OpenBLAS tiles
 * otherwise. on = 0 forces the OpenBLAS tiles everywhere (tests and
 * benchmarks compare both); call it before forwards start, not during.
 * Returns the previous setting. */
int attn_set_fused(int on);

/* The projections run on the packed weights (default: the same bits for a
 * sequence whatever shares its batch), or through OpenBLAS on the unpacked
 * ones, which benchmarks compare. Call before forwards start. Returns the
 * previous mode. */
enum { ATTN_PROJ_PACKED = 0, ATTN_PROJ_OPENBLAS = 1 };
int attn_set_projections(int mode);

/* The bf16 kernels a BF16 model runs on: "amx-bf16" (AMX tiles),
 * "avx512-bf16" (AVX512-BF16), or "none": this CPU has neither, and BF16
 * models compute in fp32 (core/bf16.h). */
const char *attn_bf16_kernels(void);
/* The best bf16 kernels this CPU has, whatever attn_set_bf16_kernels caps:
 * the same names. */
const char *attn_bf16_cpu_kernels(void);
/* Caps the bf16 kernels at one of those names ("auto" or NULL: the best
 * this CPU has), to compare them or to run as on a CPU without them; a name
 * above what the CPU has runs as the CPU's best. Call before models are
 * packed. Returns 0, or -1 for an unknown name. */
int attn_set_bf16_kernels(const char *name);

/* How the "avx512-bf16" kernels multiply: "vdpbf16ps", or "fma" (two fp32
 * FMAs a pair of products with VDPBF16PS's own rounding: the same bits,
 * faster where this CPU issues VDPBF16PS at under 0.8 of two FMAs' rate,
 * measured once per process); "" on the other kernels. */
const char *attn_bf16_products(void);
/* VDPBF16PS's time over the FMAs' for the same products, as measured (0
 * without AVX512-BF16). */
double attn_bf16_products_gain(void);
/* "vdpbf16ps" or "fma" forces one, "auto" (or NULL) goes back to the
 * measure: to compare them. Returns 0, or -1 for an unknown name. */
int attn_set_bf16_products(const char *name);

/* The int8 kernels an INT8 model's projections run on: "amx-int8",
 * "avx512-vnni", "avx-vnni", or "none": this CPU has none of them, and INT8
 * models compute in bf16 (or fp32 without bf16 kernels). The best the CPU
 * has, and a cap at one of those names ("auto" or NULL: the best), as for
 * bf16. Call the cap before models are packed. */
const char *attn_int8_kernels(void);
const char *attn_int8_cpu_kernels(void);
int attn_set_int8_kernels(const char *name);

/* ---- kernels: what the CPU allows (cpu.c), and OpenBLAS (blas.c) -------- */

/* Instruction-set levels, weakest first. */
enum { ATTN_ISA_BASE = 0, ATTN_ISA_AVX = 1, ATTN_ISA_AVX2 = 2, ATTN_ISA_AVX512 = 3 };

/* CPU features that decide the kernels; 1 = present and enabled by the OS. */
typedef struct {
    int avx512f, avx512cd, avx512bw, avx512dq, avx512vl, avx512bf16;
    int avx2, fma, avx, sse4_2;
} attn_cpu;

void attn_cpu_detect(attn_cpu *c); /* this CPU, from CPUID */
/* The present features, comma-separated ("avx512f,...,avx2,fma,avx,sse4_2"). */
void attn_cpu_features(const attn_cpu *c, char *out, size_t n);
/* The OpenBLAS kernel set these features call for (e.g. "SkylakeX"), or
 * NULL when only OpenBLAS's own generic choice fits. Never a model number. */
const char *attn_blas_core_for(const attn_cpu *c);
int attn_blas_core_level(const char *core); /* ATTN_ISA_* an OpenBLAS core needs */
int attn_cpu_level(const attn_cpu *c);      /* ATTN_ISA_* of attn_blas_core_for(c) */

/* What attn_blas_init settled; strings live as long as the process. */
typedef struct {
    const char *core;     /* OpenBLAS kernel set in use, e.g. "SkylakeX" */
    const char *chosen;   /* the set the CPU's features call for; NULL: OpenBLAS's own */
    const char *features; /* attn_cpu_features of this CPU */
    int by_user;          /* 1: the user's OPENBLAS_CORETYPE was set, and won */
    const char *warning;  /* a sentence when the kernels do not fit the CPU, else NULL */
} attn_blas_info;

/* Loads OpenBLAS with the kernels this CPU's features allow (the user's
 * OPENBLAS_CORETYPE wins) and keeps it single-threaded. Call it first in
 * main(), before any thread starts: it sets environment variables for the
 * load (and restores them). Later calls return the first call's result;
 * attn_ctx_new calls it too. Returns 0, or -1 with a sentence in err. */
int attn_blas_init(char *err, size_t errlen);
const attn_blas_info *attn_blas_get_info(void); /* NULL when OpenBLAS could not load */
const char *attn_blas_corename(void);           /* info->core, or "none" */
/* OpenBLAS's own threads (benchmarks that let OpenBLAS own them; the core
 * always keeps it at 1). Not thread-safe; call between forwards. */
void attn_blas_set_threads(int n);
/* C (M,N) = A (M,K) @ B (K,N), row-major, through the loaded OpenBLAS: the
 * sgemm rate benchmarks compare the core with. attn_blas_init first. */
void attn_blas_sgemm(float *C, const float *A, const float *B, int M, int N, int K);

#endif
