/* test_fp32_bits.c - Check suite that holds the fp32 forward to its own
 * earlier bits: a fixed set of fp32 models and batches (nn.MultiheadAttention
 * on the fused and the OpenBLAS-tile paths, self- and cross-attention, every
 * mask, both attention matrices, grouped heads with rotary positions, cache
 * steps, 1 and 3 threads) is run through attn_forward, and a 64-bit FNV-1a
 * hash of each case's outputs (and attention matrices and cache rows) is
 * compared with tests/data/fp32_bits.txt, written from the forward as it was
 * before bf16 models existed and rewritten once since, on purpose, when the
 * projections came to sum their inputs in runs of 64 (core/kernels/gemm.c).
 * So a change made for other precisions that moves a single bit of an fp32
 * answer fails here.
 *
 * The bits depend on the kernels the CPU runs (the core's instruction-set
 * level and the OpenBLAS kernel set) and on the build (the sanitizer builds
 * of make asan, at -O1, compile the plain C parts otherwise), which each
 * section of the file names in its "# kernels:" line; where no section
 * matches, the hashes cannot be compared, and the test says so in one line
 * and compares the cases' bits between 1 and 3 threads only.
 * ATTND_FP32_BITS_WRITE=path writes this build's section to path (from the
 * forward to hold to; sections of other builds are appended by hand).
 */
#include "../core/attn.h"
#include "../core/platform/cpu.h"

#include "check_run.h"
#include "test_rand.h"
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BITS_FILE "tests/data/fp32_bits.txt"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- the cases ------------------------------------------------------------------ */

/* One model and what its batch holds. */
typedef struct {
    const char *name;
    attn_hparams hp;
    int cross;                 /* 1: key and value given (kdim, vdim) */
    int n, L[4], S[4];         /* sequences and their lengths */
    int causal, masks;         /* masks: 1 key padding + boolean, 2 additive */
    attn_weights_mode weights; /* for every sequence */
    int steps;                 /* 1: a cache step of L rows after S - L cached tokens */
} bcase;

#define MHA(e, h) .embed_dim = e, .num_heads = h, .kdim = e, .vdim = e, .bias = 1
static const bcase CASES[] = {
    {"mha_d16_fused", {MHA(64, 4)}, 0, 3, {37, 1, 130}, {37, 1, 130}, 0, 1, ATTN_WEIGHTS_NONE, 0},
    {"mha_d16_heads", {MHA(64, 4)}, 0, 2, {9, 20}, {9, 20}, 1, 1, ATTN_WEIGHTS_HEADS, 0},
    {"mha_d16_mean", {MHA(64, 4)}, 0, 2, {9, 20}, {9, 20}, 0, 2, ATTN_WEIGHTS_MEAN, 0},
    {"mha_d12_tiles", {MHA(48, 4)}, 0, 2, {300, 5}, {300, 5}, 1, 2, ATTN_WEIGHTS_NONE, 0},
    {"cross_d12",
     {.embed_dim = 48, .num_heads = 4, .kdim = 40, .vdim = 24, .bias = 1},
     1,
     2,
     {5, 20},
     {9, 3},
     0,
     1,
     ATTN_WEIGHTS_HEADS,
     0},
    {"cross_d64_none",
     {.embed_dim = 256, .num_heads = 4, .kdim = 100, .vdim = 64},
     1,
     2,
     {70, 3},
     {260, 33},
     0,
     2,
     ATTN_WEIGHTS_NONE,
     0},
    {"mha_d64_long", {MHA(512, 8)}, 0, 1, {200}, {200}, 1, 0, ATTN_WEIGHTS_NONE, 0},
    {"mha_d64_mean", {MHA(256, 4)}, 0, 2, {64, 33}, {64, 33}, 0, 1, ATTN_WEIGHTS_MEAN, 0},
    {"gqa_rope_d32",
     {.embed_dim = 256,
      .num_heads = 8,
      .kdim = 256,
      .vdim = 256,
      .num_kv_heads = 2,
      .rope = {.dim = 32, .theta = 10000}},
     0,
     2,
     {50, 7},
     {50, 7},
     1,
     0,
     ATTN_WEIGHTS_NONE,
     0},
    {"gqa_rope_d32_steps",
     {.embed_dim = 256,
      .num_heads = 8,
      .kdim = 256,
      .vdim = 256,
      .num_kv_heads = 2,
      .rope = {.dim = 32, .theta = 10000}},
     0,
     2,
     {3, 1},
     {43, 70},
     0,
     0,
     ATTN_WEIGHTS_HEADS,
     1},
    {"mqa_headdim_scale_steps",
     {.embed_dim = 128,
      .num_heads = 4,
      .kdim = 128,
      .vdim = 128,
      .bias = 1,
      .num_kv_heads = 1,
      .head_dim = 64,
      .scale = 0.1,
      .rope = {.dim = 32, .theta = 500000, .style = ATTN_ROPE_INTERLEAVED}},
     0,
     2,
     {5, 40},
     {100, 40},
     0,
     0,
     ATTN_WEIGHTS_NONE,
     1},
    {"gqa_d12_mean",
     {.embed_dim = 48, .num_heads = 4, .kdim = 48, .vdim = 48, .num_kv_heads = 2, .bias = 1},
     0,
     2,
     {11, 30},
     {11, 30},
     1,
     2,
     ATTN_WEIGHTS_MEAN,
     0},
};
enum { NCASES = sizeof CASES / sizeof CASES[0] };

/* A case's batch, its buffers owned here. */
typedef struct {
    attn_seq seqs[4];
    attn_batch b;
    float *kv[4]; /* caches of step cases */
    void *own[32];
    int nown;
} run_t;

static void *keep(run_t *r, void *p) {
    r->own[r->nown++] = p;
    return p;
}

/* Masks of sequence s drawn from the case. */
static void masks_of(run_t *r, const bcase *c, attn_seq *s) {
    if (c->masks == 1) {
        uint8_t *kpm = keep(r, xcalloc((size_t)s->S, 1)),
                *mb = keep(r, rand_bools((size_t)s->L * s->S, 0.6f));
        for (int j = 1; j < s->S; j += 3)
            kpm[j] = 1;
        s->key_padding_mask = kpm;
        s->attn_mask_bool = mb;
    } else if (c->masks == 2) {
        float *ma = keep(r, rand_floats((size_t)s->L * s->S, 2.0f));
        for (size_t e = 0; e < (size_t)s->L * s->S; e += 7)
            ma[e] = -1e9f;
        s->attn_mask_add = ma;
    }
}

/* The case's batch, inputs drawn from a seed of its own. */
static void build(run_t *r, const bcase *c, const attn_model *m) {
    memset(r, 0, sizeof *r);
    int E = m->hp.embed_dim, H = m->hp.num_heads, row = 2 * m->hp.num_kv_heads * m->hp.head_dim;
    size_t T = 0, U = 0;
    for (int i = 0; i < c->n; i++) {
        T += (size_t)c->L[i];
        U += (size_t)c->S[i];
    }
    r->b = (attn_batch){.B = c->n, .seqs = r->seqs};
    r->b.query = keep(r, rand_floats(T * E, 1.0f));
    r->b.out = keep(r, xcalloc(T * E, sizeof(float)));
    if (c->cross) {
        r->b.key = keep(r, rand_floats(U * m->hp.kdim, 1.0f));
        r->b.value = keep(r, rand_floats(U * m->hp.vdim, 1.0f));
    }
    for (int i = 0; i < c->n; i++) {
        attn_seq *s = &r->seqs[i];
        *s = (attn_seq){.L = c->L[i], .S = c->S[i], .causal = c->causal, .weights = c->weights};
        if (c->steps) { /* a cache of S - L earlier tokens' rows, then this step */
            s->causal = 0;
            s->cached = c->S[i] - c->L[i];
            s->kv = r->kv[i] = keep(r, rand_floats((size_t)s->S * row, 1.0f));
        } else {
            masks_of(r, c, s);
        }
        size_t na = c->weights == ATTN_WEIGHTS_HEADS  ? (size_t)H * s->L * s->S
                    : c->weights == ATTN_WEIGHTS_MEAN ? (size_t)s->L * s->S
                                                      : 0;
        if (na) s->attn = keep(r, xcalloc(na, sizeof(float)));
    }
}

static void run_free(run_t *r) {
    for (int i = 0; i < r->nown; i++)
        free(r->own[i]);
}

/* The hash of case c at `threads` threads: outputs, attention matrices and
 * caches, in order. */
static uint64_t case_hash(const bcase *c, int threads) {
    g_rng = 0x5eed0000u + (uint64_t)(c - CASES);
    attn_model m;
    rand_model(&m, &c->hp, 0.25f); /* biases drawn too, bias 0 or not */
    run_t r;
    build(&r, c, &m);
    attn_ctx *ctx = attn_ctx_new(threads);
    ck_assert(ctx != NULL);
    char err[256] = "";
    ck_assert_msg(attn_forward(ctx, &m, &r.b, err, sizeof err) == 0, "%s: %s", c->name, err);
    int E = m.hp.embed_dim, H = m.hp.num_heads, row = 2 * m.hp.num_kv_heads * m.hp.head_dim;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t T = 0;
    for (int i = 0; i < c->n; i++)
        T += (size_t)c->L[i];
    h = fnv(h, r.b.out, T * E * sizeof(float));
    for (int i = 0; i < c->n; i++) {
        const attn_seq *s = &r.seqs[i];
        size_t na = s->weights == ATTN_WEIGHTS_HEADS  ? (size_t)H * s->L * s->S
                    : s->weights == ATTN_WEIGHTS_MEAN ? (size_t)s->L * s->S
                                                      : 0;
        if (na) h = fnv(h, s->attn, na * sizeof(float));
        if (s->kv) h = fnv(h, s->kv, (size_t)s->S * row * sizeof(float));
    }
    attn_ctx_free(ctx);
    run_free(&r);
    attn_model_free(&m);
    return h;
}

/* "isa=N blas=CORE build=B": what the bits depend on. */
static void signature(char *out, size_t n) {
#if defined(__SANITIZE_ADDRESS__)
    const char *build = "asan";
#elif defined(__SANITIZE_THREAD__)
    const char *build = "tsan";
#else
    const char *build = "make";
#endif
    snprintf(out, n, "isa=%d blas=%s build=%s", attn_isa(), attn_blas_corename(), build);
}

/* ---- the test ------------------------------------------------------------------- */

static int write_file(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    char sig[128];
    signature(sig, sizeof sig);
    fprintf(f, "# fp32 forward bits (tests/test_fp32_bits.c); kernels: %s\n", sig);
    for (int c = 0; c < NCASES; c++)
        fprintf(f, "%s %016llx\n", CASES[c].name, (unsigned long long)case_hash(&CASES[c], 1));
    fclose(f);
    printf("wrote %s (%s)\n", path, sig);
    return 0;
}

/* Moves f to the line after this build's "# kernels:" line; 0 when the
 * file has no section for it (want: the signatures it has). */
static int find_section(FILE *f, const char *sig, char *want, size_t n) {
    char line[256];
    want[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "kernels: ");
        if (line[0] != '#' || !at) continue;
        line[strcspn(line, "\n")] = 0;
        if (strcmp(at + 9, sig) == 0) return 1;
        snprintf(want + strlen(want), n - strlen(want), "%s%s", want[0] ? "; " : "", at + 9);
    }
    return 0;
}

START_TEST(test_fp32_bits) {
    ck_assert_int_eq(attn_blas_init(NULL, 0), 0);
    const char *out = getenv("ATTND_FP32_BITS_WRITE");
    if (out && *out) {
        write_file(out);
        return;
    }
    FILE *f = fopen(BITS_FILE, "r");
    ck_assert_msg(f != NULL, "%s is missing", BITS_FILE);
    char line[256], sig[128], have[512];
    signature(sig, sizeof sig);
    int same_cpu = find_section(f, sig, have, sizeof have);
    if (!same_cpu)
        printf("fp32 bits: %s holds kernels %s; this build runs %s: hashes not compared, "
               "1 and 3 threads compared with each other only\n",
               BITS_FILE, have, sig);
    int n = 0;
    while (n < NCASES) {
        char name[64] = "";
        unsigned long long want = 0;
        if (same_cpu) {
            ck_assert_msg(fgets(line, sizeof line, f) != NULL, "%s: %s ends early", BITS_FILE, sig);
            ck_assert_msg(sscanf(line, "%63s %llx", name, &want) == 2, "%s: bad line %s", BITS_FILE,
                          line);
            ck_assert_msg(strcmp(name, CASES[n].name) == 0, "%s: case %s where %s was expected",
                          BITS_FILE, name, CASES[n].name);
        }
        uint64_t one = case_hash(&CASES[n], 1), three = case_hash(&CASES[n], 3);
        ck_assert_msg(one == three, "%s: 1 and 3 threads differ", CASES[n].name);
        if (same_cpu)
            ck_assert_msg(one == want, "%s: fp32 bits changed (hash %016llx, was %016llx)", name,
                          (unsigned long long)one, want);
        n++;
    }
    fclose(f);
    printf("fp32 bits: %d cases%s\n", n, same_cpu ? ", every bit as written" : "");
}
END_TEST

int main(void) {
    Suite *s = suite_create("fp32_bits");
    TCase *t = tcase_create("bits");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_fp32_bits);
    suite_add_tcase(s, t);
    return check_run(s);
}
