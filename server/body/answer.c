/* answer.c - the 200 bodies of computed requests (request.h, answer.h):
 * the native and the v2 layouts, written once to a sink, by the plain
 * writer on one thread or by the parallel writer over the pool (how: above
 * attnd_write_answers), byte for byte the same text.
 */
#include "answer.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "../codec/base64.h"
#include "../codec/floattext.h"
#include "../codec/half.h"

/* ---- the sink: tensors written at once, or noted for later ---- */

/* How a tensor goes out. */
typedef enum {
    TK_NESTED, /* nested JSON arrays of its shape */
    TK_FLAT,   /* numbers and commas, no brackets (v2 "data") */
    TK_B64,    /* base64 of its elements' bytes */
    TK_RAW     /* its elements' bytes (v2 binary data extension) */
} tkind;

enum { MAX_TENSORS = 3 }; /* the output, and the attention or top-k's indices and values */

/* A tensor noted by a plan. */
typedef struct {
    tkind kind;
    const void *x;      /* (n) floats, or int32_t for ATTND_ELEM_I32 */
    attnd_elem elem;    /* what its elements are on the wire */
    size_t n;           /* elements */
    int rank, shape[4]; /* TK_NESTED */
    size_t at;          /* offset in the plan's text where its bytes go */
    int c0, nc;         /* its chunks in the writing's list */
} tensor_note;

/* An answer as text with its tensors left out. */
typedef struct {
    tensor_note t[MAX_TENSORS];
    int nt;
    size_t json_at;  /* the text offset where the JSON part ends (binary follows) */
    int json_before; /* tensors before that point; -1: the whole body is JSON */
} plan;

typedef struct {
    attnd_sbuf *b;    /* the text, and the tensors too when p is NULL */
    plan *p;          /* NULL: the plain writer */
    size_t *json_len; /* the plain writer's: set at the end of the JSON part */
} sink;

static void write_now(attnd_sbuf *b, const tensor_note *t);

static void put_t(sink *s, tkind kind, const void *x, attnd_elem elem, size_t n, int rank,
                  const int *shape) {
    tensor_note note = {.kind = kind, .x = x, .elem = elem, .n = n, .rank = rank, .at = s->b->len};
    if (kind == TK_NESTED) memcpy(note.shape, shape, sizeof(int) * (size_t)rank);
    if (!s->p)
        write_now(s->b, &note);
    else
        s->p->t[s->p->nt++] = note;
}

/* The JSON part ends here: the bytes that follow are binary tensors. */
static void end_json(sink *s) {
    if (!s->p) {
        *s->json_len = s->b->len;
        return;
    }
    s->p->json_at = s->b->len;
    s->p->json_before = s->p->nt;
}

/* ---- the layouts ---- */

static void put_shape(attnd_sbuf *b, int rank, const int *shape) {
    attnd_sb_putc(b, '[');
    for (int i = 0; i < rank; i++)
        attnd_sb_printf(b, "%s%d", i ? "," : "", shape[i]);
    attnd_sb_putc(b, ']');
}

/* An element type's names: a native tensor object's dtype, a v2 datatype. */
static const char *const DTYPE_NAME[] = {"float32", "float16", "bfloat16", "int32"};
static const char *const DATATYPE_NAME[] = {"FP32", "FP16", "BF16", "INT32"};

/* A tensor in the native encoding the client chose. */
static void put_tensor(sink *s, const void *x, attnd_elem elem, int rank, const int *shape,
                       attnd_encoding enc) {
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)shape[i];
    if (enc == ENC_BASE64) {
        attnd_sb_puts(s->b, "{\"shape\":");
        put_shape(s->b, rank, shape);
        attnd_sb_printf(s->b, ",\"dtype\":\"%s\",\"b64\":\"", DTYPE_NAME[elem]);
        put_t(s, TK_B64, x, elem, n, 0, NULL);
        attnd_sb_puts(s->b, "\"}");
    } else {
        put_t(s, TK_NESTED, x, elem, n, rank, shape);
    }
}

/* Shapes of the answer tensors. Native answers keep the request's rank
 * ((L,E) or (B,L,E); attention (H,L,S) or (L,S), with a leading B for a
 * batch). v2 answers always have the ranks /v2/models/{name} declares:
 * output (B,L,E) and attention (B,H,L,S), H being 1 for "mean", whatever
 * the rank of the query (a (L,E) query is a batch of one). */
static int out_shape(const attnd_job *job, const attnd_model_info *m, int *shape) {
    int r = 0;
    if (job->rank3 || job->api == API_V2) shape[r++] = job->B;
    shape[r++] = job->L;
    shape[r++] = m->hp.embed_dim;
    return r;
}

/* The attention answer's shape: its selection's heads, rows and top_k (or
 * all heads, L and S). */
static int attn_shape(const attnd_job *job, const attnd_model_info *m, int *shape) {
    const attnd_attn_select *sel = &job->sel;
    int r = 0;
    int v2 = job->api == API_V2;
    if (job->rank3 || v2) shape[r++] = job->B;
    if (job->weights == ATTN_WEIGHTS_HEADS)
        shape[r++] = sel->heads ? sel->n_heads : m->hp.num_heads;
    else if (v2)
        shape[r++] = 1;
    shape[r++] = sel->row1 ? sel->row1 - sel->row0 : job->L;
    shape[r++] = sel->top_k ? sel->top_k : job->S;
    return r;
}

/* A session step's fields, first in the answer (native) or in its
 * parameters (v2): the session's id and its cached tokens. */
static void put_session(attnd_sbuf *b, const attnd_job *job, const attnd_usage *u) {
    if (!u->session) return;
    attnd_sb_puts(b, job->api == API_V2 ? "\"session_id\":" : "\"session\":");
    attnd_sb_json_str(b, u->session);
    attnd_sb_printf(b, ",\"cached_tokens\":%d,", u->cached_tokens);
    if (job->session_close) attnd_sb_puts(b, "\"session_closed\":true,");
}

/* One v2 output: a tensor, its name and whether it goes in binary. */
typedef struct {
    const char *name;
    const void *x;
    attnd_elem elem;
    size_t n;
    int rank, shape[4];
    int binary;
} v2_out;

/* One v2 output's JSON, and its bytes after the JSON when binary. */
static void put_v2_output(sink *s, const v2_out *o, int first) {
    attnd_sb_puts(s->b, first ? "{\"name\":\"" : ",{\"name\":\"");
    attnd_sb_puts(s->b, o->name);
    attnd_sb_printf(s->b, "\",\"datatype\":\"%s\",\"shape\":", DATATYPE_NAME[o->elem]);
    put_shape(s->b, o->rank, o->shape);
    if (o->binary) {
        attnd_sb_printf(s->b, ",\"parameters\":{\"binary_data_size\":%zu}}",
                        o->n * attnd_elem_size(o->elem));
    } else {
        attnd_sb_puts(s->b, ",\"data\":[");
        put_t(s, TK_FLAT, o->x, o->elem, o->n, 0, NULL);
        attnd_sb_puts(s->b, "]}");
    }
}

/* The outputs of job's v2 answer, in order, into o: the ones it listed
 * (all when it listed none) of output, and attention or top-k's indices
 * and values; each binary as the request asked. Returns how many. */
static int v2_outputs_of(const attnd_job *job, const attnd_model_info *m, const float *out,
                         v2_out *o) {
    int n = 0, want = job->v2_outputs ? job->v2_outputs : V2_OUT_ALL;
    if (want & V2_OUT_OUTPUT) {
        o[n] = (v2_out){.name = "output",
                        .x = out,
                        .elem = ATTND_ELEM_F32,
                        .n = (size_t)job->B * job->L * m->hp.embed_dim,
                        .binary = (job->v2_binary & V2_OUT_OUTPUT) != 0};
        o[n].rank = out_shape(job, m, o[n].shape);
        n++;
    }
    if (job->weights == ATTN_WEIGHTS_NONE || !job->attn) return n;
    size_t nattn = (size_t)attnd_job_attention_floats(job, m->hp.num_heads); /* admitted */
    int topk = job->sel.top_k > 0;
    int bits[2] = {V2_OUT_TOPK_INDICES, topk ? V2_OUT_TOPK_VALUES : V2_OUT_ATTENTION};
    for (int k = topk ? 0 : 1; k < 2; k++) {
        if (!(want & bits[k])) continue;
        o[n] = (v2_out){.name = k == 0 ? "attention_topk_indices"
                                : topk ? "attention_topk_values"
                                       : "attention",
                        .x = k == 0 ? (const void *)job->attn_idx : job->attn,
                        .elem = k == 0 ? ATTND_ELEM_I32 : job->sel.dtype,
                        .n = nattn,
                        .binary = (job->v2_binary & bits[k]) != 0};
        o[n].rank = attn_shape(job, m, o[n].shape);
        n++;
    }
    return n;
}

/* The v2 answer: the outputs the request listed (all when it listed none);
 * binary ones follow the JSON (whose end the sink notes). */
static void write_v2(sink *s, const attnd_job *job, const attnd_model_info *m, const float *out,
                     const attnd_usage *u) {
    attnd_sbuf *b = s->b;
    v2_out o[MAX_TENSORS];
    int n = v2_outputs_of(job, m, out, o), any_bin = 0;
    for (int k = 0; k < n; k++)
        any_bin |= o[k].binary;
    attnd_sb_puts(b, "{\"model_name\":");
    attnd_sb_json_str(b, m->name);
    attnd_sb_printf(b, ",\"model_version\":\"%d\"", m->version);
    if (job->v2_id) {
        attnd_sb_puts(b, ",\"id\":");
        attnd_sb_json_str(b, job->v2_id);
    }
    attnd_sb_puts(b, ",\"parameters\":{");
    put_session(b, job, u);
    attnd_sb_printf(b, "\"batch\":%d,\"queue_us\":%llu,\"compute_us\":%llu},\"outputs\":[",
                    u->batch_requests, (unsigned long long)u->queue_us,
                    (unsigned long long)u->compute_us);
    for (int k = 0; k < n; k++)
        put_v2_output(s, &o[k], k == 0);
    if (!any_bin) {
        attnd_sb_puts(b, "]}\n");
        return;
    }
    attnd_sb_puts(b, "]}"); /* binary data extension: the JSON, then the bytes */
    end_json(s);
    for (int k = 0; k < n; k++)
        if (o[k].binary) put_t(s, TK_RAW, o[k].x, o[k].elem, o[k].n, 0, NULL);
}

/* The native answer, tensors in the encoding the client chose. */
static void write_native(sink *s, const attnd_job *job, const attnd_model_info *m, const float *out,
                         const attnd_usage *u) {
    attnd_sbuf *b = s->b;
    int oshape[3], ashape[4];
    int orank = out_shape(job, m, oshape), arank = attn_shape(job, m, ashape);
    attnd_sb_putc(b, '{');
    put_session(b, job, u);
    attnd_sb_puts(b, "\"model\":");
    attnd_sb_json_str(b, m->name);
    attnd_sb_puts(b, ",\"output\":");
    put_tensor(s, out, ATTND_ELEM_F32, orank, oshape, job->enc);
    if (job->weights != ATTN_WEIGHTS_NONE && job->attn && job->sel.top_k) {
        attnd_sb_puts(b, ",\"attention\":{\"indices\":");
        put_tensor(s, job->attn_idx, ATTND_ELEM_I32, arank, ashape, job->enc);
        attnd_sb_puts(b, ",\"values\":");
        put_tensor(s, job->attn, job->sel.dtype, arank, ashape, job->enc);
        attnd_sb_putc(b, '}');
    } else if (job->weights != ATTN_WEIGHTS_NONE && job->attn) {
        attnd_sb_puts(b, ",\"attention\":");
        put_tensor(s, job->attn, job->sel.dtype, arank, ashape, job->enc);
    }
    attnd_sb_printf(b,
                    ",\"usage\":{\"batch\":%d,\"sequences\":%d,\"query_tokens\":%lld,"
                    "\"key_tokens\":%lld,\"queue_us\":%llu,\"compute_us\":%llu,"
                    "\"model_version\":%d}}\n",
                    u->batch_requests, job->B, (long long)job->B * job->L,
                    (long long)job->B * job->S, (unsigned long long)u->queue_us,
                    (unsigned long long)u->compute_us, m->version);
}

static void write_layout(sink *s, const attnd_job *job, const attnd_model_info *m, const float *out,
                         const attnd_usage *u) {
    if (job->api == API_NATIVE)
        write_native(s, job, m, out, u);
    else
        write_v2(s, job, m, out, u);
}

int attnd_write_answer(attnd_sbuf *b, const attnd_job *job, const attnd_model_info *m,
                       const float *out, const attnd_usage *u, size_t *json_len) {
    *json_len = 0;
    uint64_t nattn = attnd_job_attention_floats(job, m->hp.num_heads); /* admitted: it fits */
    size_t floats = (size_t)job->B * job->L * m->hp.embed_dim +
                    (job->attn ? (job->sel.top_k ? 2 : 1) * nattn : 0);
    /* one allocation: at most 16 bytes a number as text, 6 as base64 */
    attnd_sb_reserve(b, 256 + floats * (job->enc == ENC_BASE64 && job->api == API_NATIVE ? 6 : 17));
    sink s = {b, NULL, json_len};
    write_layout(&s, job, m, out, u);
    return b->oom ? -1 : 0;
}

char *attnd_write_close_answer(const attnd_job *job, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"model_name\":");
    attnd_sb_json_str(&b, job->ver->name);
    attnd_sb_printf(&b, ",\"model_version\":\"%d\"", job->ver->info.version);
    if (job->v2_id) {
        attnd_sb_puts(&b, ",\"id\":");
        attnd_sb_json_str(&b, job->v2_id);
    }
    attnd_sb_puts(&b, ",\"parameters\":{\"session_id\":");
    attnd_sb_json_str(&b, job->session_id);
    attnd_sb_puts(&b, ",\"session_closed\":true},\"outputs\":[]}\n");
    return attnd_sb_take(&b, len);
}

char *attnd_write_open_answer(const char *id, const char *model, int cached_tokens, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"session\":");
    attnd_sb_json_str(&b, id);
    attnd_sb_puts(&b, ",\"model\":");
    attnd_sb_json_str(&b, model);
    attnd_sb_printf(&b, ",\"cached_tokens\":%d}\n", cached_tokens);
    return attnd_sb_take(&b, len);
}

/* ---- elements ---- */

enum { WIRE_PIECE = 3 * 1024 }; /* 16-bit elements converted at a time: whole base64 groups */

/* v in decimal at dst (11 bytes of room); returns the length. */
static size_t fmt_i32(char *dst, int32_t v) {
    char tmp[10];
    uint32_t u = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    size_t n = 0, len = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) dst[len++] = '-';
    while (n)
        dst[len++] = tmp[--n];
    return len;
}

/* Element f of t as JSON text: an int32's decimal, a float's "%.9g" (of
 * the value rounded to float16 or bfloat16 when t is one). Returns the
 * length. */
static size_t fmt_elem(char *dst, const tensor_note *t, size_t f) {
    if (t->elem == ATTND_ELEM_I32) return fmt_i32(dst, ((const int32_t *)t->x)[f]);
    return attnd_fmt_f32(dst, attnd_elem_round(((const float *)t->x)[f], t->elem));
}

/* Bytes elements [f0, f1) of t take on the wire: base64 text (b64) or raw. */
static size_t wire_len(const tensor_note *t, size_t f0, size_t f1, int b64) {
    size_t bytes = (f1 - f0) * attnd_elem_size(t->elem);
    return b64 ? (bytes + 2) / 3 * 4 : bytes;
}

/* Elements [f0, f1) of t on the wire into dst (wire_len bytes of room):
 * base64 (b64) or raw little-endian bytes, 16-bit types converted a piece
 * at a time. Returns the bytes written. */
static size_t wire_write(char *dst, const tensor_note *t, size_t f0, size_t f1, int b64) {
    size_t n = f1 - f0;
    const float *x = (const float *)t->x + f0; /* int32 elements are 4 bytes too */
    if (attnd_elem_size(t->elem) == 4) {
        if (b64) return attnd_b64_encode(dst, x, n * 4);
        memcpy(dst, x, n * 4);
        return n * 4;
    }
    if (!b64) {
        attnd_elems_of(dst, x, n, t->elem);
        return 2 * n;
    }
    unsigned char piece[2 * WIRE_PIECE];
    size_t at = 0;
    for (size_t f = 0; f < n; f += WIRE_PIECE) {
        size_t m = n - f < WIRE_PIECE ? n - f : WIRE_PIECE;
        attnd_elems_of(piece, x + f, m, t->elem);
        at += attnd_b64_encode(dst + at, piece, 2 * m);
    }
    return at;
}

/* ---- chunks of numbers ---- */

static size_t chunk_floats(tkind k) {
    return k == TK_B64 ? ANSWER_B64_CHUNK : k == TK_RAW ? ANSWER_RAW_CHUNK : ANSWER_TEXT_CHUNK;
}

/* Room the printers need for nf numbers of t: 15 bytes a number at most, a
 * comma and the brackets between rows; a printer may write F32_TEXT_MAX
 * bytes at the last one. */
static size_t text_room(const tensor_note *t, size_t nf) {
    return nf * (16 + 2 * (size_t)t->rank) + 2 * (size_t)t->rank + F32_TEXT_MAX;
}

/* The brackets before the first number of row r of a nested tensor: all of
 * them for the first row, else those that close the rows ending here, a
 * comma, and as many opening. */
static char *row_open(char *s, const tensor_note *t, size_t r) {
    int k = t->rank;
    if (r > 0) {
        size_t span = 1;
        k = 1;
        for (int d = t->rank - 2; d >= 1; d--) {
            span *= (size_t)t->shape[d];
            if (r % span) break;
            k++;
        }
        memset(s, ']', (size_t)k);
        s += k;
        *s++ = ',';
    }
    memset(s, '[', (size_t)k);
    return s + k;
}

/* Numbers [f0, f1) of a nested tensor (n > 0), each with what comes before
 * it, and the closing brackets after the last one. Returns the end. */
static char *print_nested(char *s, const tensor_note *t, size_t f0, size_t f1) {
    size_t inner = (size_t)t->shape[t->rank - 1];
    size_t f = f0;
    while (f < f1) {
        size_t r = f / inner, end = (r + 1) * inner < f1 ? (r + 1) * inner : f1;
        if (f == r * inner)
            s = row_open(s, t, r);
        else
            *s++ = ',';
        s += fmt_elem(s, t, f++);
        for (; f < end; f++) {
            *s++ = ',';
            s += fmt_elem(s, t, f);
        }
    }
    if (f1 == t->n) {
        memset(s, ']', (size_t)t->rank);
        s += t->rank;
    }
    return s;
}

static char *print_flat(char *s, const tensor_note *t, size_t f0, size_t f1) {
    for (size_t f = f0; f < f1; f++) {
        if (f) *s++ = ',';
        s += fmt_elem(s, t, f);
    }
    return s;
}

/* The plain writer's tensor t, into b at once: float32 text by the codec's
 * writers, everything else by the chunk printers over the whole tensor. */
static void write_now(attnd_sbuf *b, const tensor_note *t) {
    int f32 = t->elem == ATTND_ELEM_F32, wire = t->kind == TK_B64 || t->kind == TK_RAW;
    if (t->kind == TK_NESTED && (f32 || t->n == 0)) {
        attnd_sb_tensor_json(b, t->x, t->rank, t->shape);
        return;
    }
    if (t->kind == TK_FLAT && f32) {
        attnd_sb_floats(b, t->x, t->n);
        return;
    }
    if (attnd_sb_reserve(b, wire ? wire_len(t, 0, t->n, t->kind == TK_B64) : text_room(t, t->n)) <
        0)
        return;
    char *at = b->p + b->len, *end;
    if (wire)
        end = at + wire_write(at, t, 0, t->n, t->kind == TK_B64);
    else
        end = t->kind == TK_NESTED ? print_nested(at, t, 0, t->n) : print_flat(at, t, 0, t->n);
    b->len += (size_t)(end - at);
    b->p[b->len] = '\0';
}

/* ---- the parallel writer ---- */

/* A run of numbers of one tensor of one answer. */
typedef struct {
    int answer, tensor;
    size_t f0, f1; /* floats [f0, f1) of the tensor */
    char *text;    /* TK_NESTED, TK_FLAT: the printed chunk, malloc'd; NULL before */
    size_t len;    /* its bytes in the body (every kind), after print */
    size_t at;     /* its offset in the body, after place */
} chunk;

/* What the writer keeps of one answer written in chunks. */
typedef struct {
    int big;         /* 1: written in chunks; 0: whole, at plan */
    attnd_sbuf text; /* the layout's text, tensors left out */
    plan p;
    atomic_int failed; /* 1: out of memory somewhere; the answer's body is NULL */
    char *body;        /* after place */
    size_t len, json_len;
} answer_state;

typedef struct {
    attnd_answer *a;
    answer_state *st; /* (n) */
    int n;
    chunk *c; /* (nc) every chunk of every big answer */
    int nc;
    int *big; /* (nbig) indices of the big answers */
    int nbig;
    void (*done)(void *arg, int i);
    void *arg;
} writing;

/* fn(arg, task, thread) for every task, on ctx's threads or the caller's. */
static void run(attn_ctx *ctx, int ntasks, void (*fn)(void *, int, int), void *arg) {
    if (ctx && ntasks > 1) {
        attn_ctx_parallel(ctx, ntasks, fn, arg);
        return;
    }
    for (int t = 0; t < ntasks; t++)
        fn(arg, t, 0);
}

/* Writes answer i whole with the plain writer and hands it back. */
static void write_whole(writing *w, int i) {
    attnd_answer *a = &w->a[i];
    attnd_sbuf b;
    attnd_sb_init(&b);
    if (attnd_write_answer(&b, a->job, a->model, a->out, &a->usage, &a->json_len) < 0) {
        attnd_sb_free(&b);
        a->body = NULL;
    } else {
        a->body = attnd_sb_take(&b, &a->body_len);
    }
    w->done(w->arg, i);
}

static int chunks_of(const tensor_note *t) {
    size_t per = chunk_floats(t->kind);
    return t->n ? (int)((t->n + per - 1) / per) : 1;
}

/* plan: answer i's text and tensors; one chunk or less is written whole. */
static void plan_task(void *arg, int i, int thread) {
    (void)thread;
    writing *w = arg;
    attnd_answer *a = &w->a[i];
    answer_state *st = &w->st[i];
    attnd_sb_init(&st->text);
    st->p.json_before = -1;
    sink s = {&st->text, &st->p, NULL};
    write_layout(&s, a->job, a->model, a->out, &a->usage);
    int chunks = 0;
    for (int k = 0; k < st->p.nt; k++)
        chunks += chunks_of(&st->p.t[k]);
    if (chunks <= 1 || st->text.oom) {
        attnd_sb_free(&st->text);
        write_whole(w, i);
        return;
    }
    st->big = 1;
}

/* The chunk list of every big answer; 0, or -1 when out of memory. */
static int list_chunks(writing *w) {
    int total = 0;
    for (int i = 0; i < w->n; i++) {
        answer_state *st = &w->st[i];
        if (!st->big) continue;
        w->big[w->nbig++] = i;
        for (int k = 0; k < st->p.nt; k++) {
            st->p.t[k].c0 = total;
            st->p.t[k].nc = chunks_of(&st->p.t[k]);
            total += st->p.t[k].nc;
        }
    }
    w->c = calloc(total ? (size_t)total : 1, sizeof *w->c);
    if (!w->c) return -1;
    w->nc = total;
    for (int j = 0; j < w->nbig; j++) {
        answer_state *st = &w->st[w->big[j]];
        for (int k = 0; k < st->p.nt; k++) {
            const tensor_note *t = &st->p.t[k];
            size_t per = chunk_floats(t->kind);
            for (int c = 0; c < t->nc; c++) {
                size_t f0 = (size_t)c * per, f1 = f0 + per < t->n ? f0 + per : t->n;
                w->c[t->c0 + c] = (chunk){.answer = w->big[j], .tensor = k, .f0 = f0, .f1 = f1};
            }
        }
    }
    return 0;
}

/* print: chunk k's numbers as text into its own buffer (JSON kinds); the
 * size of the others. */
static void print_task(void *arg, int k, int thread) {
    (void)thread;
    writing *w = arg;
    chunk *c = &w->c[k];
    answer_state *st = &w->st[c->answer];
    const tensor_note *t = &st->p.t[c->tensor];
    size_t nf = c->f1 - c->f0;
    if (t->kind == TK_B64 || t->kind == TK_RAW) {
        c->len = wire_len(t, c->f0, c->f1, t->kind == TK_B64);
        return;
    }
    if (t->n == 0) { /* an empty tensor: its brackets, as the plain writer puts them */
        attnd_sbuf b;
        attnd_sb_init(&b);
        if (t->kind == TK_NESTED) attnd_sb_tensor_json(&b, t->x, t->rank, t->shape);
        c->text = attnd_sb_take(&b, &c->len);
    } else {
        c->text = malloc(text_room(t, nf));
        if (c->text) {
            char *end = t->kind == TK_NESTED ? print_nested(c->text, t, c->f0, c->f1)
                                             : print_flat(c->text, t, c->f0, c->f1);
            c->len = (size_t)(end - c->text);
        }
    }
    if (!c->text) atomic_store(&st->failed, 1);
}

/* place: answer j's size and body; its text copied around the tensors'
 * places, and every chunk's offset. */
static void place_task(void *arg, int j, int thread) {
    (void)thread;
    writing *w = arg;
    answer_state *st = &w->st[w->big[j]];
    const plan *p = &st->p;
    if (atomic_load(&st->failed)) return; /* a chunk (or the chunk list) had no memory */
    size_t len = st->text.len;
    for (int k = 0; k < p->nt; k++)
        for (int c = 0; c < p->t[k].nc; c++)
            len += w->c[p->t[k].c0 + c].len;
    if (!(st->body = malloc(len + 1))) {
        atomic_store(&st->failed, 1);
        return;
    }
    size_t from = 0, at = 0; /* text copied so far; body written so far */
    for (int k = 0; k < p->nt; k++) {
        if (k == p->json_before) st->json_len = at + (p->json_at - from);
        memcpy(st->body + at, st->text.p + from, p->t[k].at - from);
        at += p->t[k].at - from;
        from = p->t[k].at;
        for (int c = 0; c < p->t[k].nc; c++) {
            chunk *ch = &w->c[p->t[k].c0 + c];
            ch->at = at;
            at += ch->len;
        }
    }
    if (p->json_before == p->nt) st->json_len = at + (p->json_at - from);
    memcpy(st->body + at, st->text.p + from, st->text.len - from);
    st->len = len;
    st->body[len] = '\0';
}

/* copy: chunk k into its answer's body. */
static void copy_task(void *arg, int k, int thread) {
    (void)thread;
    writing *w = arg;
    chunk *c = &w->c[k];
    answer_state *st = &w->st[c->answer];
    const tensor_note *t = &st->p.t[c->tensor];
    if (!atomic_load(&st->failed)) {
        char *dst = st->body + c->at;
        if (t->kind == TK_B64 || t->kind == TK_RAW)
            wire_write(dst, t, c->f0, c->f1, t->kind == TK_B64);
        else
            memcpy(dst, c->text, c->len);
    }
    free(c->text);
    c->text = NULL;
}

/* finish: answer j handed back. */
static void finish_task(void *arg, int j, int thread) {
    (void)thread;
    writing *w = arg;
    int i = w->big[j];
    answer_state *st = &w->st[i];
    attnd_answer *a = &w->a[i];
    attnd_sb_free(&st->text);
    if (atomic_load(&st->failed)) {
        free(st->body);
        a->body = NULL;
    } else {
        a->body = st->body;
        a->body_len = st->len;
        a->json_len = st->p.json_before >= 0 ? st->json_len : 0;
    }
    st->body = NULL;
    w->done(w->arg, i);
}

/* The layouts of the native and the v2 answer are written once, below, to a
 * sink. The plain writer (attnd_write_answer) gives the sink a buffer and
 * the tensors are written into it as they come. The parallel writer
 * (attnd_write_answers) gives it a plan instead: the layout's text goes to
 * the buffer, each tensor is only noted with the offset it belongs at, and
 * then, over the pool, in named phases:
 *   plan    each answer's text and tensors; answers of one chunk or less
 *           are written whole there, by the plain writer;
 *   print   every chunk of JSON numbers of every answer into its own buffer;
 *   place   each answer's size and body, with its text copied in;
 *   copy    every chunk into place (base64 encoded and binary copied there);
 *   finish  each answer handed back.
 * A chunk of numbers prints each number with what comes before it (a comma,
 * or the brackets between two rows), so the chunks joined are the plain
 * writer's text byte for byte; tests hold the two to that.
 *
 * Tensors are float32 in memory; the attention answer's weights travel as
 * its attention_dtype (float16 and bfloat16: 2 bytes an element in base64
 * and binary, the rounded values as JSON numbers), top-k indices as int32.
 */
void attnd_write_answers(attn_ctx *ctx, attnd_answer *a, int n, void (*done)(void *arg, int i),
                         void *arg) {
    if (n <= 0) return;
    writing w = {.a = a, .n = n, .done = done, .arg = arg};
    w.st = calloc((size_t)n, sizeof *w.st);
    w.big = calloc((size_t)n, sizeof *w.big);
    if (!w.st || !w.big) { /* too little memory to plan: each answer whole */
        for (int i = 0; i < n; i++)
            write_whole(&w, i);
        goto cleanup;
    }
    run(ctx, n, plan_task, &w);
    if (list_chunks(&w) < 0)
        for (int j = 0; j < w.nbig; j++)
            atomic_store(&w.st[w.big[j]].failed, 1);
    run(ctx, w.nc, print_task, &w);
    run(ctx, w.nbig, place_task, &w);
    run(ctx, w.nc, copy_task, &w);
    run(ctx, w.nbig, finish_task, &w);
cleanup:
    free(w.c);
    free(w.big);
    free(w.st);
}
