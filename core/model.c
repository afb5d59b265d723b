/* model.c - the model's one allocation, its packed copy for the projection
 * kernel (fp32, or bf16 for a model that computes in bf16), and the batch
 * checks shared by the fast and the reference forward. No math here. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bf16.h"
#include "internal.h"
#include "sizes.h"

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
    if (r->scaling != ATTN_ROPE_SCALE_LINEAR && r->scaling != ATTN_ROPE_SCALE_LLAMA3) {
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
    return 0;
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
    if (hp->precision != ATTN_FP32 && hp->precision != ATTN_BF16) {
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

static void unpack(attn_model *m) {
    for (int i = 0; m->packed && i < 4; i++)
        attn_packed_free(&m->packed[i]);
    for (int i = 0; m->packed16 && i < 4; i++)
        attn_packed_bf16_free(&m->packed16[i]);
    free(m->packed);
    free(m->packed16);
    m->packed = NULL;
    m->packed16 = NULL;
}

/* The four projections of m: weights (N,K) and bias, in packing order. */
typedef struct {
    const float *W, *b;
    int N, K;
} proj_shape;

static void shapes_of(const attn_model *m, proj_shape p[4]) {
    const attn_hparams *hp = &m->hp;
    int E = hp->embed_dim, HD = hp->num_heads * hp->head_dim, GD = hp->num_kv_heads * hp->head_dim;
    p[0] = (proj_shape){m->q_w, m->q_b, HD, E};        /* (H*D, E) */
    p[1] = (proj_shape){m->k_w, m->k_b, GD, hp->kdim}; /* (G*D, Kd) */
    p[2] = (proj_shape){m->v_w, m->v_b, GD, hp->vdim}; /* (G*D, Vd) */
    p[3] = (proj_shape){m->out_w, m->out_b, E, HD};    /* (E, H*D) */
}

/* The attention of a BF16 model runs on bf16 operands when the block of
 * bf16.h takes its head width on its fast paths, and a group of heads fits
 * one pass. */
static int attention_in_bf16(const attn_hparams *hp) {
    int D = hp->head_dim;
    return D % 32 == 0 && D <= ATTN_BF16_DMAX && hp->num_heads / hp->num_kv_heads <= ATTN_BF16_ROWS;
}

/* A BF16 model keeps its biases alone in fp32: mem shrinks to q_b | k_b |
 * v_b | out_b, and its weight matrices live in packed16 only. */
static int keep_biases(attn_model *m) {
    size_t qd = (size_t)m->hp.num_heads * m->hp.head_dim;
    size_t kvd = (size_t)m->hp.num_kv_heads * m->hp.head_dim, E = (size_t)m->hp.embed_dim;
    float *mem = malloc(sizeof(float) * (qd + 2 * kvd + E));
    if (!mem) return -1;
    memcpy(mem, m->q_b, sizeof(float) * (qd + 2 * kvd)); /* q_b, k_b, v_b: contiguous */
    memcpy(mem + qd + 2 * kvd, m->out_b, sizeof(float) * E);
    free(m->mem);
    m->mem = mem;
    m->n_floats = qd + 2 * kvd + E;
    m->q_w = m->k_w = m->v_w = m->out_w = NULL;
    m->q_b = mem;
    m->k_b = m->q_b + qd;
    m->v_b = m->k_b + kvd;
    m->out_b = m->v_b + kvd;
    const float *bias[4] = {m->q_b, m->k_b, m->v_b, m->out_b};
    for (int i = 0; i < 4; i++)
        m->packed16[i].bias = bias[i];
    return 0;
}

int attn_model_pack(attn_model *m, char *err, size_t errlen) {
    if (m->packed16 && !m->q_w) return 0; /* a BF16 model is packed once: its fp32 weights went */
    proj_shape p[4];
    shapes_of(m, p);
    unpack(m);
    int bf16 = m->hp.precision == ATTN_BF16 && attn_bf16_path() != ATTN_BF16_NONE;
    int bad = 0;
    if (bf16) {
        m->packed16 = calloc(4, sizeof *m->packed16);
        for (int i = 0; i < 4 && !(bad = !m->packed16); i++)
            bad = attn_packed_bf16_init(&m->packed16[i], p[i].W, p[i].b, p[i].N, p[i].K) < 0;
        bad = bad || keep_biases(m) < 0;
    } else {
        m->packed = calloc(4, sizeof *m->packed);
        for (int i = 0; i < 4 && !(bad = !m->packed); i++)
            bad = attn_packed_init(&m->packed[i], p[i].W, p[i].b, p[i].N, p[i].K) < 0;
    }
    if (bad) {
        unpack(m);
        snprintf(err, errlen, "out of memory packing the weights (about %zu bytes)",
                 m->n_floats * (bf16 ? sizeof(attn_bf16) : sizeof(float)));
        return -1;
    }
    m->precision = bf16 ? ATTN_BF16 : ATTN_FP32;
    m->attn16 = bf16 && attention_in_bf16(&m->hp);
    return 0;
}

int attn_model_weight_blocks(const attn_model *m, const void *p[5], size_t n[5]) {
    int k = 0;
    p[k] = m->mem;
    n[k++] = m->n_floats * sizeof(float);
    for (int i = 0; m->packed16 && i < 4; i++, k++) {
        const attn_packed_bf16 *pw = &m->packed16[i];
        p[k] = pw->p;
        n[k] = (size_t)pw->panels * pw->kp * 2 * ATTN_PANEL * sizeof(attn_bf16);
    }
    return k;
}

size_t attn_model_bytes(const attn_model *m) {
    size_t n = m->n_floats * sizeof(float);
    for (int i = 0; m->packed && i < 4; i++)
        n += (size_t)m->packed[i].panels * m->packed[i].K * ATTN_PANEL * sizeof(float);
    for (int i = 0; m->packed16 && i < 4; i++)
        n += (size_t)m->packed16[i].panels * ATTN_PANEL *
             (2 * (size_t)m->packed16[i].kp * sizeof(attn_bf16) + sizeof(float));
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

void attn_select_span(const attn_seq *s, int H, int *row0, int *row1, int *nheads) {
    int whole = s->sel.row0 == 0 && s->sel.row1 == 0;
    *row0 = whole ? 0 : s->sel.row0;
    *row1 = whole ? s->L : s->sel.row1;
    *nheads = s->sel.heads ? s->sel.n_heads : H;
}

size_t attn_select_floats(const attn_seq *s, int H) {
    int r0, r1, nh;
    if (s->weights == ATTN_WEIGHTS_NONE) return 0;
    attn_select_span(s, H, &r0, &r1, &nh);
    size_t n = (size_t)(r1 - r0) * (size_t)(s->sel.top_k ? s->sel.top_k : s->S);
    return s->weights == ATTN_WEIGHTS_HEADS ? n * (size_t)nh : n;
}

int attn_seq_selects(const attn_seq *s, int H) {
    if (s->weights == ATTN_WEIGHTS_NONE) return 0;
    if (s->sel.top_k || s->sel.row0 || s->sel.row1) return 1;
    if (!s->sel.heads) return 0;
    if (s->sel.n_heads != H) return 1;
    for (int h = 0; h < H; h++)
        if (s->sel.heads[h] != h) return 1;
    return 0;
}

/* Sequence i's selection (attn_select) against H heads and its lengths. */
static int check_select(const attn_seq *s, int i, int H, char *err, size_t errlen) {
    const attn_select *sel = &s->sel;
    int whole_rows = sel->row0 == 0 && sel->row1 == 0;
    if (s->weights == ATTN_WEIGHTS_NONE && (sel->heads || sel->top_k || !whole_rows)) {
        snprintf(err, errlen, "sequence %d: a selection of attention weights needs weights", i);
        return -1;
    }
    if (!whole_rows && !(sel->row0 >= 0 && sel->row0 < sel->row1 && sel->row1 <= s->L)) {
        snprintf(err, errlen, "sequence %d: selected rows [%d, %d) are not within [0, %d)", i,
                 sel->row0, sel->row1, s->L);
        return -1;
    }
    if (sel->top_k < 0 || sel->top_k > s->S || (sel->top_k && !s->attn_idx)) {
        snprintf(err, errlen, "sequence %d: top-k %d needs 1 <= k <= S (%d) and an index buffer", i,
                 sel->top_k, s->S);
        return -1;
    }
    if (!sel->heads) return 0;
    if (sel->n_heads < 1 || sel->n_heads > H) {
        snprintf(err, errlen, "sequence %d: %d selected heads, the model has %d", i, sel->n_heads,
                 H);
        return -1;
    }
    uint8_t *seen = calloc((size_t)H, 1);
    int rc = seen ? 0 : -1;
    if (!seen) snprintf(err, errlen, "out of memory checking sequence %d's heads", i);
    for (int a = 0; seen && a < sel->n_heads && rc == 0; a++) {
        int h = sel->heads[a];
        if (h < 0 || h >= H || seen[h]) {
            snprintf(err, errlen, "sequence %d: selected head %d is out of [0, %d) or repeated", i,
                     h, H);
            rc = -1;
        } else {
            seen[h] = 1;
        }
    }
    free(seen);
    return rc;
}

int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen) {
    const attn_hparams *hp = &m->hp;
    if (!m->mem) {
        snprintf(err, errlen, "model has no weights");
        return -1;
    }

    if (b->B < 1 || !b->seqs || !b->query || !b->out) {
        snprintf(err, errlen, "batch needs at least one sequence, a query and an output");
        return -1;
    }
    if (!b->key && (hp->kdim != hp->embed_dim || hp->vdim != hp->embed_dim)) {
        snprintf(err, errlen,
                 "self-attention needs kdim == vdim == embed_dim (%d, %d, %d): give a key",
                 hp->kdim, hp->vdim, hp->embed_dim);
        return -1;
    }
    if (b->key && !b->value && hp->kdim != hp->vdim) {
        snprintf(err, errlen, "value defaults to key, which needs kdim == vdim (%d, %d)", hp->kdim,
                 hp->vdim);
        return -1;
    }
    if (b->key && hp->rope.dim) {
        snprintf(err, errlen,
                 "rotary positions need self-attention (no key): a key row's "
                 "position would be unknown");
        return -1;
    }
    size_t t = 0, u = 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        if (s->positions)
            for (int r = 0; r < s->L; r++)
                if (s->positions[r] < 0) {
                    snprintf(err, errlen, "sequence %d: position %d of row %d is negative", i,
                             (int)s->positions[r], r);
                    return -1;
                }
        if (s->L < 1 || s->S < 1) {
            snprintf(err, errlen, "sequence %d: lengths must be positive (L=%d, S=%d)", i, s->L,
                     s->S);
            return -1;
        }
        if (attn_seq_step(s) &&
            (b->key || s->cached < 0 || s->S - s->L != s->cached || s->positions ||
             s->key_padding_mask || s->attn_mask_bool || s->attn_mask_add)) {
            snprintf(err, errlen,
                     "sequence %d: a cache step is self-attention with S == cached + L "
                     "(S=%d, L=%d, cached=%d) and no positions or masks",
                     i, s->S, s->L, s->cached);
            return -1;
        }
        if (attn_seq_step(s) && (s->kv16 ? !m->attn16 || s->kv : m->attn16)) {
            snprintf(err, errlen,
                     "sequence %d: a cache step of this model keeps its cache in %s (attn_seq.%s)",
                     i, m->attn16 ? "bf16 pages" : "floats", m->attn16 ? "kv16" : "kv");
            return -1;
        }
        if (!b->key && !attn_seq_step(s) && s->S != s->L) {
            snprintf(err, errlen, "sequence %d: self-attention needs S == L (S=%d, L=%d)", i, s->S,
                     s->L);
            return -1;
        }
        if (s->weights != ATTN_WEIGHTS_NONE && s->weights != ATTN_WEIGHTS_MEAN &&
            s->weights != ATTN_WEIGHTS_HEADS) {
            snprintf(err, errlen, "sequence %d: unknown attention weights mode %d", i,
                     (int)s->weights);
            return -1;
        }
        if (s->weights != ATTN_WEIGHTS_NONE && !s->attn) {
            snprintf(err, errlen, "sequence %d: attention weights asked for but no buffer given",
                     i);
            return -1;
        }
        if (check_select(s, i, hp->num_heads, err, errlen) < 0) return -1;
        t += (size_t)s->L;
        u += (size_t)s->S;
    }
    *T = t;
    *U = u;
    return 0;
}

int attn_check_packed(const attn_model *m, char *err, size_t errlen) {
    if (m->packed || m->packed16) return 0;
    snprintf(err, errlen, "model weights are not packed: call attn_model_pack once filled");
    return -1;
}

float attn_scale(const attn_hparams *hp) {
    if (hp->scale == 1.0 / sqrt((double)hp->head_dim)) return 1.0f / sqrtf((float)hp->head_dim);
    return (float)hp->scale;
}

int attn_is_mha(const attn_hparams *hp) {
    return hp->num_kv_heads == hp->num_heads && hp->head_dim * hp->num_heads == hp->embed_dim &&
           hp->rope.dim == 0 && hp->scale == 1.0 / sqrt((double)hp->head_dim);
}
