/* model.c - the model's one allocation, and its packing: the one place
 * where a precision is chosen. attn_model_pack picks the model's rows of
 * the precision tables (ops.h) from what it asks for and what this CPU
 * runs, and the rows pack the weights; every later step calls the rows it
 * holds. No math here. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kv_pages.h"
#include "../ops/ops.h"
#include "../ops/seq.h"
#include "../sizes.h"
#include "model.h"

/* YaRN's numbers: every one finite and not negative (0: the default),
 * a trained context, and a theta whose logarithm can divide. */
static int check_yarn(const attn_rope *r, char *err, size_t errlen) {
    double v[] = {r->beta_fast, r->beta_slow, r->mscale, r->mscale_all_dim, r->attention_factor};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!(v[i] >= 0) || !isfinite(v[i])) {
            snprintf(err, errlen,
                     "yarn rope scaling needs beta_fast, beta_slow, mscale, mscale_all_dim and "
                     "attention_factor finite and >= 0 (got %g, %g, %g, %g, %g)",
                     v[0], v[1], v[2], v[3], v[4]);
            return -1;
        }
    if (r->original_max_position < 1 || r->theta == 1) {
        snprintf(err, errlen,
                 "yarn rope scaling needs original_max_position >= 1 and theta other than 1 "
                 "(got %d, %g)",
                 r->original_max_position, r->theta);
        return -1;
    }
    return 0;
}

/* Checks the decoder options of hp (rope, scale); hp's D is d. */
static int check_rope(const attn_hparams *hp, int d, char *err, size_t errlen) {
    const attn_rope *r = &hp->rope;
    if (!(hp->scale >= 0) || !isfinite(hp->scale)) {
        snprintf(err, errlen, "scale must be positive and finite (got %g)", hp->scale);
        return -1;
    }
    if (r->dim == 0) return 0;
    if (r->dim < 0 || r->dim % 2 != 0 || r->dim > d) {
        snprintf(err, errlen, "rope dim %d must be even and between 2 and the head width %d",
                 r->dim, d);
        return -1;
    }
    if (!(r->theta > 0) || !isfinite(r->theta)) {
        snprintf(err, errlen, "rope theta must be positive (got %g)", r->theta);
        return -1;
    }
    if (r->style != ATTN_ROPE_HALF && r->style != ATTN_ROPE_INTERLEAVED) {
        snprintf(err, errlen, "unknown rope style %d", (int)r->style);
        return -1;
    }
    if (r->scaling == ATTN_ROPE_SCALE_NONE) return 0;
    if (r->scaling != ATTN_ROPE_SCALE_LINEAR && r->scaling != ATTN_ROPE_SCALE_LLAMA3 &&
        r->scaling != ATTN_ROPE_SCALE_YARN) {
        snprintf(err, errlen, "unknown rope scaling %d", (int)r->scaling);
        return -1;
    }
    if (!(r->factor > 0) || !isfinite(r->factor)) {
        snprintf(err, errlen, "rope scaling factor must be positive (got %g)", r->factor);
        return -1;
    }
    if (r->scaling == ATTN_ROPE_SCALE_LLAMA3 &&
        (!(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) ||
         !isfinite(r->high_freq_factor) || r->original_max_position < 1)) {
        snprintf(err, errlen,
                 "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and "
                 "original_max_position >= 1 (got %g, %g, %d)",
                 r->low_freq_factor, r->high_freq_factor, r->original_max_position);
        return -1;
    }
    return r->scaling == ATTN_ROPE_SCALE_YARN ? check_yarn(r, err, errlen) : 0;
}

/* Checks hp and fills the defaults of num_kv_heads, head_dim and scale. */
static int check_hparams(attn_hparams *hp, char *err, size_t errlen) {
    int E = hp->embed_dim, H = hp->num_heads;
    if (E < 1 || H < 1) {
        snprintf(err, errlen, "embed_dim and num_heads must be positive (got %d and %d)", E, H);
        return -1;
    }
    if (hp->head_dim < 0 || (hp->head_dim == 0 && E % H != 0)) {
        snprintf(err, errlen, "embed_dim %d is not divisible by num_heads %d", E, H);
        return -1;
    }
    if (hp->kdim < 1 || hp->vdim < 1) {
        snprintf(err, errlen, "kdim and vdim must be positive (got %d and %d)", hp->kdim, hp->vdim);
        return -1;
    }
    if (hp->num_kv_heads < 0 || (hp->num_kv_heads > 0 && H % hp->num_kv_heads != 0)) {
        snprintf(err, errlen, "num_kv_heads %d does not divide num_heads %d", hp->num_kv_heads, H);
        return -1;
    }
    if (hp->precision != ATTN_FP32 && hp->precision != ATTN_BF16 && hp->precision != ATTN_INT8) {
        snprintf(err, errlen, "unknown precision %d", (int)hp->precision);
        return -1;
    }
    hp->num_kv_heads = attn_hparams_kv_heads(hp);
    hp->head_dim = attn_hparams_head_dim(hp);
    if (check_rope(hp, hp->head_dim, err, errlen) < 0) return -1;
    if (hp->scale == 0) hp->scale = 1.0 / sqrt((double)hp->head_dim);
    return 0;
}

int attn_model_init(attn_model *m, const attn_hparams *hp, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    attn_hparams h = *hp;
    if (check_hparams(&h, err, errlen) < 0) return -1;
    uint64_t e = (uint64_t)h.embed_dim, qd, kvd, n = 0, t;
    /* q_w, k_w, v_w, q_b, k_b, v_b, out_w, out_b: see attn.h */
    int bad = sz_mul((uint64_t)h.num_heads, (uint64_t)h.head_dim, INT32_MAX, &qd) < 0 ||
              sz_mul((uint64_t)h.num_kv_heads, (uint64_t)h.head_dim, INT32_MAX, &kvd) < 0;
    uint64_t parts[][2] = {{qd, e},
                           {kvd, (uint64_t)h.kdim},
                           {kvd, (uint64_t)h.vdim},
                           {qd, 1},
                           {kvd, 1},
                           {kvd, 1},
                           {e, qd},
                           {e, 1}};
    for (int i = 0; !bad && i < 8; i++)
        bad = sz_mul(parts[i][0], parts[i][1], SIZE_MAX / sizeof(float), &t) < 0 ||
              sz_add(n, t, SIZE_MAX / sizeof(float), &n) < 0;
    float *mem = bad ? NULL : calloc((size_t)n, sizeof(float));
    if (!mem) {
        snprintf(err, errlen, "out of memory for the weights (H*D %llu, G*D %llu, E %llu)",
                 (unsigned long long)qd, (unsigned long long)kvd, (unsigned long long)e);
        return -1;
    }
    m->hp = h;
    m->mem = mem;
    m->n_floats = (size_t)n;
    m->q_w = mem;
    m->k_w = m->q_w + qd * e;
    m->v_w = m->k_w + kvd * h.kdim;
    m->q_b = m->v_w + kvd * h.vdim;
    m->k_b = m->q_b + qd;
    m->v_b = m->k_b + kvd;
    m->out_w = m->v_b + kvd;
    m->out_b = m->out_w + e * qd;
    return 0;
}

/* The precisions a model may compute in: the rows of the two tables a
 * model asking for `asked` takes, first row this CPU runs for it; fp32,
 * which runs everywhere, last. A BF16 model whose head width the bf16
 * block does not take projects in bf16 and attends in fp32. An INT8 model
 * attends as a BF16 model does; on a CPU without int8 kernels it is a BF16
 * model (or, without bf16 kernels either, an FP32 one). */
static const struct {
    attn_precision asked;
    const attn_proj_ops *proj;
    const attn_attend_ops *attend;
} g_precisions[] = {
    {ATTN_INT8, &attn_proj_int8, &attn_attend_bf16},
    {ATTN_INT8, &attn_proj_int8, &attn_attend_fp32},
    {ATTN_INT8, &attn_proj_bf16, &attn_attend_bf16},
    {ATTN_INT8, &attn_proj_bf16, &attn_attend_fp32},
    {ATTN_BF16, &attn_proj_bf16, &attn_attend_bf16},
    {ATTN_BF16, &attn_proj_bf16, &attn_attend_fp32},
    {ATTN_FP32, &attn_proj_fp32, &attn_attend_fp32},
};
enum { NPRECISIONS = sizeof g_precisions / sizeof g_precisions[0] };

static int precision_of(const attn_hparams *hp) {
    for (int i = 0; i < NPRECISIONS - 1; i++)
        if (g_precisions[i].asked == hp->precision && g_precisions[i].proj->runs(hp) &&
            g_precisions[i].attend->runs(hp))
            return i;
    return NPRECISIONS - 1;
}

void attn_model_rows(const attn_model *m, const attn_proj_ops **proj,
                     const attn_attend_ops **attend) {
    int row = precision_of(&m->hp);
    *proj = m->proj_ops ? m->proj_ops : g_precisions[row].proj;
    *attend = m->attend_ops ? m->attend_ops : g_precisions[row].attend;
}

static void unpack(attn_model *m) {
    if (m->proj_ops) m->proj_ops->unpack(m);
    m->proj_ops = NULL;
    m->attend_ops = NULL;
}

int attn_model_pack(attn_model *m, char *err, size_t errlen) {
    if (m->proj_ops && !m->q_w) return 0; /* packed once: its fp32 weights went */
    unpack(m);
    int row = precision_of(&m->hp);
    const attn_proj_ops *proj = g_precisions[row].proj;
    size_t bytes = m->n_floats * sizeof(float);
    if (proj->pack(m) < 0) {
        snprintf(err, errlen, "out of memory packing the weights (about %zu bytes)", bytes);
        return -1;
    }
    m->proj_ops = proj;
    m->attend_ops = g_precisions[row].attend;
    m->precision = proj->precision;
    m->attn16 = m->attend_ops->pages;
    return 0;
}

int attn_model_rows_free(const attn_model *m) {
    const attn_hparams *hp = &m->hp;
    attn_attend a = {.H = hp->num_heads, .G = hp->num_kv_heads, .D = hp->head_dim};
    const attn_proj_ops *proj;
    attn_model_rows(m, &proj, &a.ops);
    a.rows_alone = !attn_is_mha(hp); /* as fwd_plan sets it */
    a.ops->prepare(&a);
    return a.ops->rows_free(&a);
}

int attn_model_weight_blocks(const attn_model *m, const void *p[5], size_t n[5]) {
    int k = 0;
    p[k] = m->mem;
    n[k++] = m->n_floats * sizeof(float);
    for (int i = 0; m->proj_ops && i < 4; i++) {
        p[k] = m->proj_ops->data(m->proj_ops->weights(m, i), &n[k]);
        if (p[k]) k++;
    }
    return k;
}

size_t attn_model_bytes(const attn_model *m) {
    size_t n = m->n_floats * sizeof(float);
    for (int i = 0; m->proj_ops && i < 4; i++)
        n += m->proj_ops->bytes(m->proj_ops->weights(m, i));
    return n;
}

size_t attn_kv_bytes(const attn_model *m, size_t tokens) {
    int G = m->hp.num_kv_heads, D = m->hp.head_dim;
    if (m->attn16) return attn_kv_bf16_elems(tokens, G, D) * sizeof(attn_bf16);
    return tokens * 2 * (size_t)G * D * sizeof(float);
}

void attn_model_free(attn_model *m) {
    if (!m) return;
    unpack(m);
    free(m->mem);
    memset(m, 0, sizeof *m);
}
