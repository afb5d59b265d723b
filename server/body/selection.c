/* selection.c - the attention selection of a request, read and checked
 * (selection.h). Choices where the contract is silent (docs/api.md says
 * them too):
 * - heads come back in the order given; a head given twice is refused (a
 *   repeated head is a client's slip, not a wish for two copies); "mean"
 *   averages the heads given;
 * - rows are [start, end) of the request's query rows (a session step's own
 *   new rows), 0 <= start < end <= L;
 * - a selection, attention_dtype included, needs attention asked for: with
 *   "none" it is refused rather than ignored;
 * - numbers are whole: a head, row or k past 2^53 is 413 "too large" like
 *   every size; v2 strings take up to 10 digits a number.
 */
#include "selection.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const attnd_enum_row ATTENTION_DTYPES[] = {
    {"float32", ATTND_ELEM_F32},
    {"float16", ATTND_ELEM_F16},
    {"bfloat16", ATTND_ELEM_BF16},
};
const attnd_enum attnd_attention_dtypes = ATTND_ENUM(ATTENTION_DTYPES);

static const attnd_enum_row ATTENTION_DATATYPES[] = {
    {"FP32", ATTND_ELEM_F32},
    {"FP16", ATTND_ELEM_F16},
    {"BF16", ATTND_ELEM_BF16},
};
const attnd_enum attnd_attention_datatypes = ATTND_ENUM(ATTENTION_DATATYPES);

enum {
    MAX_LISTED = 65536 /* heads a list may hold: the config's largest num_heads */
};

void attnd_sel_in_init(attnd_sel_in *s, int v2) {
    memset(s, 0, sizeof *s);
    s->top_k = -1;
    s->dtype = -1;
    s->v2 = v2;
}

void attnd_sel_in_free(attnd_sel_in *s) {
    free(s->heads);
    s->heads = NULL;
}

static attnd_sel_in *sel_at(const jfield *f, void *dst) {
    return (attnd_sel_in *)((char *)dst + f->offset);
}

/* Appends head h; -1 when out of memory or past MAX_LISTED (e set). */
static int add_head(attnd_sel_in *s, int64_t h, const char *label, attnd_error *e) {
    if (s->n_heads == MAX_LISTED)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: more than %d heads (no model has more)",
                               label, MAX_LISTED);
    if ((s->n_heads & (s->n_heads - 1)) == 0) { /* 0, 1, 2, 4, ...: double the room */
        int64_t *p = realloc(s->heads, sizeof(int64_t) * (size_t)(s->n_heads ? 2 * s->n_heads : 1));
        if (!p) return attnd_set_error(e, AERR_INTERNAL, "out of memory");
        s->heads = p;
    }
    s->heads[s->n_heads++] = h;
    return 0;
}

/* A selection's whole number: as attnd_jin_whole, but one past 2^53 is a
 * 400 like any other out of range (no model has so many heads, rows or
 * keys), not a size over a limit. */
static int sel_whole(jin *j, int64_t *out, jpath *path, attnd_error *e) {
    if (attnd_jin_whole(j, 0, ATTND_SEL_MAX, out, path, e) == 0) return 0;
    if (e->code == AERR_TOO_LARGE) e->code = AERR_BAD_REQUEST;
    return -1;
}

int attnd_sel_read_top_k(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    return sel_whole(j, &sel_at(f, dst)->top_k, path, e);
}

int attnd_sel_read_heads(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    attnd_sel_in *s = sel_at(f, dst);
    int r = attnd_jin_open(j, '[');
    if (r < 0) return attnd_jin_fail(j, path, e);
    s->have_heads = 1;
    for (int idx = 0; r == 0; idx++) {
        int64_t h;
        size_t mark = attnd_jpath_index(path, idx);
        if (sel_whole(j, &h, path, e) < 0) return -1;
        attnd_jpath_cut(path, mark);
        if (add_head(s, h, path->s, e) < 0) return -1;
        r = attnd_jin_next(j, ']');
        if (r < 0) return attnd_jin_fail(j, path, e);
    }
    return 0;
}

int attnd_sel_read_rows(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    attnd_sel_in *s = sel_at(f, dst);
    int n = 0, r = attnd_jin_open(j, '[');
    if (r < 0) return attnd_jin_fail(j, path, e);
    while (r == 0 && n < 2) {
        size_t mark = attnd_jpath_index(path, n);
        if (sel_whole(j, &s->rows[n++], path, e) < 0) return -1;
        attnd_jpath_cut(path, mark);
        r = attnd_jin_next(j, ']');
        if (r < 0) return attnd_jin_fail(j, path, e);
    }
    if (r == 0 || n != 2)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: expected [start, end], two whole numbers, got %s", path->s,
                               r == 0 ? "more than two"
                               : n    ? "one"
                                      : "none");
    s->have_rows = 1;
    return 0;
}

/* A whole number of 1 to 10 digits at *p, spaces around it skipped; moves
 * *p past it. -1 when there is none. */
static int text_whole(const char **p, int64_t *v) {
    const char *q = *p;
    while (*q == ' ')
        q++;
    int digits = 0;
    *v = 0;
    for (; *q >= '0' && *q <= '9' && digits <= 10; q++, digits++)
        *v = *v * 10 + (*q - '0');
    if (digits == 0 || digits > 10) return -1;
    while (*q == ' ')
        q++;
    *p = q;
    return 0;
}

/* A string parameter into a new buffer (the caller frees it). */
static int read_text(jin *j, char **text, jpath *path, attnd_error *e) {
    *text = NULL;
    return attnd_jin_string(j, text, NULL) < 0 ? attnd_jin_fail(j, path, e) : 0;
}

int attnd_sel_read_v2_heads(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    attnd_sel_in *s = sel_at(f, dst);
    int64_t h;
    s->have_heads = 1;
    if (attnd_jin_next_type(j) == JT_NUMBER) { /* one head, as a number */
        if (sel_whole(j, &h, path, e) < 0) return -1;
        return add_head(s, h, path->s, e);
    }
    char *text;
    if (read_text(j, &text, path, e) < 0) return -1;
    const char *p = text;
    int rc = 0;
    while (rc == 0 && *p) {
        if (text_whole(&p, &h) < 0 || (*p && *p != ',') || (*p == ',' && !p[1])) {
            rc = attnd_set_error(e, AERR_BAD_REQUEST,
                                 "%s: \"%.60s\" is not a list of heads (whole numbers and "
                                 "commas, such as \"0,3,5\")",
                                 path->s, text);
            break;
        }
        rc = add_head(s, h, path->s, e);
        p += *p == ',';
    }
    free(text);
    return rc;
}

int attnd_sel_read_v2_rows(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    attnd_sel_in *s = sel_at(f, dst);
    char *text;
    if (read_text(j, &text, path, e) < 0) return -1;
    const char *p = text;
    int ok = text_whole(&p, &s->rows[0]) == 0 && *p++ == ':' && text_whole(&p, &s->rows[1]) == 0 &&
             *p == '\0';
    int rc = ok ? 0
                : attnd_set_error(e, AERR_BAD_REQUEST,
                                  "%s: \"%.60s\" is not \"start:end\" (two whole numbers, such as "
                                  "\"0:16\")",
                                  path->s, text);
    free(text);
    s->have_rows = ok;
    return rc;
}

/* ---- checks ---- */

/* "attention_x" or "parameters.attention_x", as the body named it. */
static const char *name_of(const attnd_sel_in *s, const char *field, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s", s->v2 ? "parameters." : "", field);
    return buf;
}

/* The first field of the selection that was given, or NULL. */
static const char *first_given(const attnd_sel_in *s) {
    if (s->have_heads) return "attention_heads";
    if (s->have_rows) return "attention_rows";
    if (s->top_k >= 0) return "attention_top_k";
    if (s->dtype >= 0) return s->v2 ? "attention_datatype" : "attention_dtype";
    return NULL;
}

/* The heads against the model's H: none, out of range, or twice. */
static int check_heads(const attnd_sel_in *s, const attnd_model_info *m, attnd_error *e) {
    char at[64];
    int H = m->hp.num_heads, rc = 0;
    if (s->n_heads == 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: empty: name at least one head, or leave it out for every head",
                               name_of(s, "attention_heads", at, sizeof at));
    unsigned char *seen = calloc((size_t)H, 1);
    if (!seen) return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    for (int a = 0; a < s->n_heads && rc == 0; a++) {
        int64_t h = s->heads[a];
        if (s->v2)
            snprintf(at, sizeof at, "parameters.attention_heads");
        else
            snprintf(at, sizeof at, "attention_heads[%d]", a);
        if (h >= H)
            rc =
                attnd_set_error(e, AERR_BAD_REQUEST,
                                "%s: head %lld is out of range: model '%s' has %d head%s (0 to %d)",
                                at, (long long)h, m->name, H, H == 1 ? "" : "s", H - 1);
        else if (seen[h])
            rc = attnd_set_error(e, AERR_BAD_REQUEST, "%s: head %lld is given twice", at,
                                 (long long)h);
        else
            seen[h] = 1;
    }
    free(seen);
    return rc;
}

/* The rows against the request's L query rows. */
static int check_rows(const attnd_sel_in *s, int L, attnd_error *e) {
    char at[64], v[64];
    long long r0 = (long long)s->rows[0], r1 = (long long)s->rows[1];
    name_of(s, "attention_rows", at, sizeof at);
    if (s->v2)
        snprintf(v, sizeof v, "\"%lld:%lld\"", r0, r1);
    else
        snprintf(v, sizeof v, "[%lld, %lld]", r0, r1);
    if (r0 > r1)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: %s is reversed: the start must be below the end", at, v);
    if (r0 == r1)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: %s is empty: the end must be above the start", at, v);
    if (r1 > L)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: %s is out of range: the query has %d row%s (the end is at "
                               "most %d)",
                               at, v, L, L == 1 ? "" : "s", L);
    return 0;
}

/* The refusal of k past the S keys of each row (api: how to name it). */
static int top_k_refusal(attnd_api api, long long k, int S, attnd_error *e) {
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "%sattention_top_k: %lld is more than the %d key%s each row has",
                           api == API_V2 ? "parameters." : "", k, S, S == 1 ? "" : "s");
}

int attnd_check_top_k(const attnd_job *job, attnd_error *e) {
    return job->sel.top_k <= job->S ? 0 : top_k_refusal(job->api, job->sel.top_k, job->S, e);
}

/* The selection's heads into job->sel, as ints. */
static int take_heads(const attnd_sel_in *s, attnd_job *job, attnd_error *e) {
    if (!s->have_heads) return 0;
    job->sel.heads = malloc(sizeof(int) * (size_t)s->n_heads);
    if (!job->sel.heads) return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    for (int a = 0; a < s->n_heads; a++)
        job->sel.heads[a] = (int)s->heads[a];
    job->sel.n_heads = s->n_heads;
    return 0;
}

int attnd_sel_check(attnd_sel_in *in, const attnd_model_info *m, attnd_job *job, int step,
                    attnd_error *e) {
    char at[64];
    const char *given = first_given(in);
    if (!given) return 0;
    if (job->weights == ATTN_WEIGHTS_NONE)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: given, but no attention is asked for (%s)",
                               name_of(in, given, at, sizeof at),
                               in->v2 ? "parameters.attention \"mean\" or \"heads\", or an "
                                        "attention output"
                                      : "\"attention\": \"mean\" or \"heads\"");
    if (in->have_heads && check_heads(in, m, e) < 0) return -1;
    if (in->have_rows && check_rows(in, job->L, e) < 0) return -1;
    if (in->top_k == 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: 0: k must be at least 1",
                               name_of(in, "attention_top_k", at, sizeof at));
    /* a step's S is cached + L, known at admission: past 2^31 it is too many anyway */
    if (in->top_k > (step ? INT32_MAX : job->S))
        return top_k_refusal(in->v2 ? API_V2 : API_NATIVE, (long long)in->top_k,
                             step ? INT32_MAX : job->S, e);
    job->sel.row0 = in->have_rows ? (int)in->rows[0] : 0;
    job->sel.row1 = in->have_rows ? (int)in->rows[1] : 0;
    job->sel.top_k = in->top_k > 0 ? (int)in->top_k : 0;
    job->sel.dtype = in->dtype >= 0 ? (attnd_elem)in->dtype : ATTND_ELEM_F32;
    return take_heads(in, job, e);
}
