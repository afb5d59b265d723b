/* weights.c - fills an attn_model from a model's config: finds the tensor
 * for each of the eight weight roles (by layout, "tensors" map and prefix),
 * checks its dtype and shape against the hyper-parameters, and reads and
 * converts its data to float32. Or, with no weights file, draws the
 * embedded default weights. The header checks live in safetensors.c.
 *
 * Layouts (names before the prefix; docs/config.md):
 *   torch    in_proj_weight (3E,E) + in_proj_bias (3E) when kdim = vdim = E,
 *            else q_proj_weight (E,E), k_proj_weight (E,Kd), v_proj_weight
 *            (E,Vd) + in_proj_bias (3E); out_proj.weight, out_proj.bias;
 *            a file holding bias_k or bias_v (add_bias_kv) is refused
 *   bert     attention.self.{query,key,value}.{weight,bias},
 *            attention.output.dense.{weight,bias}
 *   hf_proj  {q,k,v}_proj.{weight,bias}; out_proj.* or else o_proj.*
 *   llama    {q,k,v,o}_proj.{weight,bias}; o_proj.bias is read when present
 *            (Llama with attention_bias) and zero when absent (Qwen2)
 * With grouped key/value heads and a head_dim, q has H*D rows, k and v G*D
 * rows, and out H*D columns (attn.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "default_model.h"
#include "enums.h"
#include "refuse.h"
#include "safetensors.h"
#include "weights.h"

static const attnd_enum_row ROLES[] = {
    {"q_weight", ROLE_Q_WEIGHT},     {"q_bias", ROLE_Q_BIAS},     {"k_weight", ROLE_K_WEIGHT},
    {"k_bias", ROLE_K_BIAS},         {"v_weight", ROLE_V_WEIGHT}, {"v_bias", ROLE_V_BIAS},
    {"out_weight", ROLE_OUT_WEIGHT}, {"out_bias", ROLE_OUT_BIAS},
};
const attnd_enum attnd_roles = ATTND_ENUM(ROLES);

const char *attnd_role_name(attnd_role r) {
    const char *w = attnd_enum_name(&attnd_roles, (int)r);
    return w ? w : "?";
}

/* Where one role's floats come from. */
typedef struct {
    const char *name; /* tensor name before the prefix */
    const char *alt;  /* second choice when name is absent (o_proj.*), or NULL */
    int part;         /* -1: the tensor is the role; 0..2: rows [part*E, part*E+E) of a
                         3-part tensor (in_proj_weight, in_proj_bias) */
    int optional;     /* 1: an absent tensor leaves the role zero */
} role_src;

static const char *const bert_names[ROLE_COUNT] = {
    "attention.self.query.weight",   "attention.self.query.bias",   "attention.self.key.weight",
    "attention.self.key.bias",       "attention.self.value.weight", "attention.self.value.bias",
    "attention.output.dense.weight", "attention.output.dense.bias",
};
static const char *const hf_names[ROLE_COUNT] = {
    "q_proj.weight", "q_proj.bias", "k_proj.weight",   "k_proj.bias",
    "v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias",
};
static const char *const llama_names[ROLE_COUNT] = {
    "q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
    "v_proj.weight", "v_proj.bias", "o_proj.weight", "o_proj.bias",
};
static const char *const torch_split_names[ROLE_COUNT] = {
    "q_proj_weight", "in_proj_bias", "k_proj_weight",   "in_proj_bias",
    "v_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias",
};

/* The roles alternate weight, bias (attnd_role). */
static int role_is_bias(attnd_role r) {
    return r % 2 == 1;
}

static role_src layout_role(int layout, attnd_role r, const attn_hparams *hp) {
    role_src s = {NULL, NULL, -1, 0};
    int is_bias = role_is_bias(r);
    int qkv = r / 2; /* 0 q, 1 k, 2 v, 3 out */
    switch (layout) {
    case ATTND_LAYOUT_BERT:
        s.name = bert_names[r];
        break;
    case ATTND_LAYOUT_HF_PROJ:
        s.name = hf_names[r];
        if (r == ROLE_OUT_WEIGHT) s.alt = "o_proj.weight";
        if (r == ROLE_OUT_BIAS) s.alt = "o_proj.bias";
        break;
    case ATTND_LAYOUT_LLAMA:
        s.name = llama_names[r];
        s.optional = r == ROLE_OUT_BIAS;
        break;
    default:
        s.name = torch_split_names[r];
        if (qkv < 3 && is_bias) s.part = qkv;
        if (qkv < 3 && !is_bias && hp->kdim == hp->embed_dim && hp->vdim == hp->embed_dim) {
            s.name = "in_proj_weight";
            s.part = qkv;
        }
    }
    return s;
}

/* The bytes of a safetensors file: an open file or a buffer. */
typedef struct {
    int fd;                   /* >= 0: read with pread */
    const unsigned char *mem; /* else: the whole file */
    size_t len;               /* bytes at mem */
} source;

static int source_read(const source *s, void *dst, size_t n, uint64_t off) {
    if (s->fd >= 0) return st_read_full(s->fd, dst, n, off);
    if (off > s->len || n > s->len - off) return -1;
    memcpy(dst, s->mem + off, n);
    return 0;
}

static void shape_text(char *out, size_t n, int ndim, const uint64_t *shape) {
    size_t at = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < ndim && at < n; i++)
        at += (size_t)snprintf(out + at, n - at, "%s%llu", i ? ", " : "",
                               (unsigned long long)shape[i]);
    if (at < n) snprintf(out + at, n - at, "]");
}

/* Floats from this magnitude up round to infinity in bf16 (0x7F7F8000, a
 * tie that rounds to even: up), so a bf16 model cannot hold them. */
#define BF16_OVERFLOW 0x1.ffp+127f

/* Reads count floats starting at element first of tensor t into dst,
 * refusing NaN and Inf, and with bf16 set (a bf16 model's weights, held in
 * bf16) a value bf16 cannot hold. */
static int read_floats(float *dst, const source *src, const st_header *h, const st_tensor *t,
                       uint64_t first, size_t count, int bf16, const char *file, char *err,
                       size_t errlen) {
    enum { CHUNK = 16384 };
    unsigned char buf[CHUNK * 4];
    size_t esz = st_dtype_size(t->dtype);
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CHUNK ? count - done : CHUNK;
        uint64_t off = h->data_start + t->begin + (first + done) * esz;
        if (source_read(src, buf, n * esz, off) != 0)
            return cfg_fail(err, errlen,
                            "%s: tensor \"%s\": cannot read its data (file changed or "
                            "truncated).",
                            file, t->name);
        st_to_f32(dst + done, buf, t->dtype, n);
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(dst[done + i]))
                return cfg_fail(err, errlen, "%s: tensor \"%s\": element %llu is NaN or Inf.", file,
                                t->name, (unsigned long long)(first + done + i));
            if (bf16 && fabsf(dst[done + i]) >= BF16_OVERFLOW)
                return cfg_fail(err, errlen,
                                "%s: tensor \"%s\": element %llu, %g, is past bf16's largest "
                                "value (3.3895e+38), and a bf16 model holds its weights in "
                                "bf16; serve it with precision fp32 or int8.",
                                file, t->name, (unsigned long long)(first + done + i),
                                (double)dst[done + i]);
        }
        done += n;
    }
    return 0;
}

/* What does not fit between a model and its file, gathered over every role
 * so that one message names it all. */
typedef struct {
    char text[2048];               /* "; "-separated sentences, cut short when full */
    size_t len;                    /* strlen(text) */
    int n;                         /* problems found, at most one per role */
    const char *names[ROLE_COUNT]; /* role_src names reported: a tensor that stacks
                                      q, k and v is reported once, not per part */
} misfits;

static void misfit(misfits *mf, const char *name, const char *fmt, ...) {
    for (int i = 0; i < mf->n; i++)
        if (strcmp(mf->names[i], name) == 0) return;
    mf->names[mf->n++] = name;
    char one[sizeof mf->text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(one, sizeof one, fmt, ap);
    va_end(ap);
    size_t room = sizeof mf->text - mf->len;
    int k = snprintf(mf->text + mf->len, room, "%s%s", mf->len ? "; " : "", one);
    if (k > 0) mf->len = (size_t)k < room ? mf->len + (size_t)k : sizeof mf->text - 1;
}

/* Where one role's floats are in the file: tensor t (NULL when an optional
 * role is absent, or on a misfit), from element first, count of them. */
typedef struct {
    const st_tensor *t;
    uint64_t first;
    size_t count;
} role_at;

/* The shape of role r's floats: rows x cols, or rows alone (cols 0) for a
 * bias. hp has num_kv_heads and head_dim filled in. */
static void role_shape(const attn_hparams *hp, attnd_role r, uint64_t *rows, uint64_t *cols) {
    uint64_t E = (uint64_t)hp->embed_dim, QD = (uint64_t)hp->num_heads * hp->head_dim;
    uint64_t KVD = (uint64_t)hp->num_kv_heads * hp->head_dim;
    const uint64_t R[ROLE_COUNT] = {QD, QD, KVD, KVD, KVD, KVD, E, E};
    const uint64_t C[ROLE_COUNT] = {E, 0, (uint64_t)hp->kdim, 0, (uint64_t)hp->vdim, 0, QD, 0};
    *rows = R[r];
    *cols = C[r];
}

/* "role q_weight", or for a part of a stacked tensor the three roles it
 * holds ("roles q_weight, k_weight and v_weight"). */
static void role_label(char *out, size_t n, attnd_role r, int part) {
    if (part < 0) {
        snprintf(out, n, "role %s", attnd_role_name(r));
        return;
    }
    int q = (int)r - 2 * part;
    snprintf(out, n, "roles %s, %s and %s", attnd_role_name((attnd_role)q),
             attnd_role_name((attnd_role)(q + 2)), attnd_role_name((attnd_role)(q + 4)));
}

/* The tensor rs names (after prefix), or its second choice. NULL when
 * neither is present (a misfit, unless the role is optional) or both are
 * (a misfit). `role` and `from` only say, in a misfit, what needed it and
 * who named it. */
static const st_tensor *lookup_tensor(const st_header *h, const role_src *rs, const char *prefix,
                                      const char *role, const char *from, misfits *mf) {
    char name[2200], alt[2200];
    snprintf(name, sizeof name, "%s%s", prefix, rs->name);
    const st_tensor *t = st_find(h, name);
    if (rs->alt) {
        snprintf(alt, sizeof alt, "%s%s", prefix, rs->alt);
        const st_tensor *ta = st_find(h, alt);
        if (t && ta) {
            misfit(mf, rs->name,
                   "both \"%s\" and \"%s\" are present for %s (name one in "
                   "\"tensors\")",
                   name, alt, role);
            return NULL;
        }
        if (!t) t = ta;
    }
    if (!t && !rs->optional)
        misfit(mf, rs->name, "tensor \"%s\"%s%s%s is missing (%s, %s)", name,
               rs->alt ? " (or \"" : "", rs->alt ? alt : "", rs->alt ? "\")" : "", role, from);
    return t;
}

/* Whether t is want (ndim 1 or 2); a misfit naming both shapes if not. */
static int shape_fits(const st_tensor *t, const uint64_t *want, int ndim, const char *src_name,
                      const char *role, misfits *mf) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == want[i];
    if (!ok) {
        char got_s[128], want_s[64];
        shape_text(got_s, sizeof got_s, t->ndim, t->shape);
        shape_text(want_s, sizeof want_s, ndim, want);
        misfit(mf, src_name, "tensor \"%s\" has shape %s but needs %s for %s", t->name, got_s,
               want_s, role);
    }
    return ok;
}

/* Finds the tensor behind role r and checks its dtype and shape; what does
 * not fit goes to mf and leaves at->t NULL. */
static void find_role(role_at *at, const attn_model *m, attnd_role r, const attnd_model_config *mc,
                      int layout, const st_header *h, misfits *mf) {
    uint64_t rows, cols;
    role_shape(&m->hp, r, &rows, &cols);
    role_src rs = layout_role(layout, r, &m->hp);
    if (mc->tensors[r]) rs = (role_src){mc->tensors[r], NULL, -1, 0};
    char role[64], from[64];
    role_label(role, sizeof role, r, rs.part);
    snprintf(from, sizeof from, "%s%s", mc->tensors[r] ? "tensors map" : "layout ",
             mc->tensors[r] ? "" : attnd_enum_name(&attnd_layouts, layout));
    *at = (role_at){NULL, 0, 0};
    const st_tensor *t = lookup_tensor(h, &rs, mc->prefix ? mc->prefix : "", role, from, mf);
    if (!t) return; /* a misfit, or an optional role that stays zero */
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16) {
        misfit(mf, rs.name,
               "tensor \"%s\": dtype %s cannot be read; weights must be F32, F16 "
               "or BF16",
               t->name, st_dtype_name(t->dtype));
        return;
    }
    /* The shape the tensor must have: the role's, or 3 parts stacked. */
    uint64_t want[2] = {(rs.part >= 0 ? 3 : 1) * rows, cols};
    if (!shape_fits(t, want, cols ? 2 : 1, rs.name, role, mf)) return;
    at->t = t;
    at->count = (size_t)(rows * (cols ? cols : 1));
    at->first = rs.part >= 0 ? (uint64_t)rs.part * at->count : 0;
}

/* Checks every role's tensor, refusing with one message that names each
 * missing, unreadable or wrong-shaped one, then reads them. */
static int load_roles(attn_model *m, const attnd_model_config *mc, int layout, const st_header *h,
                      const source *src, const char *file, char *err, size_t errlen) {
    const attn_hparams *hp = &m->hp;
    float *dst[ROLE_COUNT] = {m->q_w, m->q_b, m->k_w, m->k_b, m->v_w, m->v_b, m->out_w, m->out_b};
    role_at at[ROLE_COUNT] = {{0}};
    misfits mf = {.text = "", .len = 0, .n = 0};
    for (int r = 0; r < ROLE_COUNT; r++) {
        if (role_is_bias((attnd_role)r) && !mc->hp.bias) continue; /* stays zero */
        find_role(&at[r], m, (attnd_role)r, mc, layout, h, &mf);
    }
    if (mf.n == 1)
        return cfg_fail(err, errlen,
                        "%s: %s, for model \"%s\" (embed_dim %d, kdim %d, vdim %d, num_heads %d, "
                        "num_kv_heads %d, head_dim %d).",
                        file, mf.text, mc->name, hp->embed_dim, hp->kdim, hp->vdim, hp->num_heads,
                        hp->num_kv_heads, hp->head_dim);
    if (mf.n > 1)
        return cfg_fail(err, errlen,
                        "%s: %d tensors do not fit model \"%s\" (embed_dim %d, kdim %d, vdim %d, "
                        "num_heads %d, num_kv_heads %d, head_dim %d): %s.",
                        file, mf.n, mc->name, hp->embed_dim, hp->kdim, hp->vdim, hp->num_heads,
                        hp->num_kv_heads, hp->head_dim, mf.text);
    for (int r = 0; r < ROLE_COUNT; r++) {
        int bf16 = mc->hp.precision == ATTN_BF16 && !role_is_bias((attnd_role)r);
        if (at[r].t && read_floats(dst[r], src, h, at[r].t, at[r].first, at[r].count, bf16, file,
                                   err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* nn.MultiheadAttention(add_bias_kv=True) saves bias_k and bias_v, a key
 * and a value row added to every sequence, which attnd does not compute:
 * such a file is refused rather than served without them. */
static int torch_bias_kv(const attnd_model_config *mc, const st_header *h, const char *file,
                         char *err, size_t errlen) {
    static const char *const extra[] = {"bias_k", "bias_v"};
    char name[2200];
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s", mc->prefix ? mc->prefix : "", extra[i]);
        if (st_find(h, name))
            return cfg_fail(err, errlen,
                            "%s: tensor \"%s\" is nn.MultiheadAttention's add_bias_kv row, "
                            "which adds a key and a value to every sequence; attnd does not "
                            "serve add_bias_kv layers (model \"%s\").",
                            file, name, mc->name);
    }
    return 0;
}

static int load_from(attn_model *m, const attnd_model_config *mc, const st_header *h,
                     const source *src, const char *file, char *err, size_t errlen) {
    int layout = ATTND_LAYOUT_TORCH;
    char words[160];
    if (mc->layout && attnd_enum_value(&attnd_layouts, mc->layout, &layout) < 0)
        return cfg_fail(err, errlen, "%s: model \"%s\": unknown layout \"%s\" (%s).", file,
                        mc->name, mc->layout,
                        attnd_enum_list(&attnd_layouts, " or ", words, sizeof words));
    if (layout == ATTND_LAYOUT_TORCH && torch_bias_kv(mc, h, file, err, errlen) != 0) return -1;
    if (attn_model_init(m, &mc->hp, err, errlen) != 0) return -1;
    const attn_hparams *hp = &m->hp;
    if (layout == ATTND_LAYOUT_TORCH &&
        (hp->num_kv_heads != hp->num_heads || hp->head_dim * hp->num_heads != hp->embed_dim)) {
        attn_model_free(m);
        return cfg_fail(err, errlen,
                        "%s: model \"%s\": layout torch has no room for num_kv_heads or "
                        "head_dim; use layout llama, hf_proj or a tensors map.",
                        file, mc->name);
    }
    if (load_roles(m, mc, layout, h, src, file, err, errlen) != 0 ||
        attn_model_pack(m, err, errlen) != 0) {
        attn_model_free(m);
        return -1;
    }
    return 0;
}

int attnd_model_load_mem(attn_model *m, const attnd_model_config *mc, const void *buf, size_t len,
                         const char *file, char *err, size_t errlen) {
    st_header h;
    source src = {-1, buf, len};
    memset(m, 0, sizeof *m);
    if (st_header_parse(&h, buf, len, len, file, err, errlen) != 0) return -1;
    int rc = load_from(m, mc, &h, &src, file, err, errlen);
    st_header_free(&h);
    return rc;
}

int attnd_model_load(attn_model *m, const attnd_model_config *mc, char *err, size_t errlen) {
    st_header h = {0};
    int fd = -1, rc = -1;
    memset(m, 0, sizeof *m);
    if (!mc->weights) return attnd_seeded_model(m, &mc->hp, ATTND_DEFAULT_SEED, err, errlen);
    fd = open(mc->weights, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is not waited on */
    struct stat st;
    if (fd < 0) {
        cfg_fail(err, errlen, "%s: cannot open weights file: %s.", mc->weights, strerror(errno));
        goto cleanup;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        cfg_fail(err, errlen, "%s: the weights are not a regular file.", mc->weights);
        goto cleanup;
    }
    if (st_header_read(&h, fd, mc->weights, err, errlen) != 0) goto cleanup;
    source src = {fd, NULL, 0};
    rc = load_from(m, mc, &h, &src, mc->weights, err, errlen);
cleanup:
    st_header_free(&h);
    if (fd >= 0) close(fd);
    return rc;
}
