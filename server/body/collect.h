/* collect.h - what the two body readers (request.c, native; v2.c, Open
 * Inference Protocol) share, for them alone: the tensors and fields a body
 * gave (collected), and collect.c's road from those to one checked job
 * (attnd_build_job), the same checks and refusals for both APIs. No HTTP.
 */
#ifndef ATTND_COLLECT_H
#define ATTND_COLLECT_H

#include <stddef.h>

#include "../codec/jsonin.h"
#include "../codec/tensor.h"
#include "job.h"
#include "selection.h"

/* The tensors a body may carry, by role. */
enum { T_QUERY, T_KEY, T_VALUE, T_KPM, T_MASK, T_POS, T_COUNT };
/* The roles' names, as messages and v2 inputs name them. */
extern const char *const attnd_role_names[T_COUNT];

/* What a body is: a whole request, a session's open with a prefix, or a
 * session step (whose keys are known at admission only). */
typedef enum { BODY_WHOLE, BODY_OPEN, BODY_STEP } body_kind;

/* What both parsers collect before the common checks. */
typedef struct {
    attnd_tensor t[T_COUNT];
    int given[T_COUNT];
    const char *label[T_COUNT]; /* how messages name the tensor */
    char model[ATTND_NAME_MAX + 8];
    int have_model;
    int causal;               /* 1, 0, or -1: the model's default */
    int weights;              /* attn_weights_mode, or -1 when the body did not say */
    int enc;                  /* attnd_encoding */
    int timeout_ms;           /* timeout_ms, 0 when not given */
    const char *causal_label; /* how messages name causal: "causal", "parameters.causal" */
    attnd_sel_in sel;         /* attention_heads, _rows, _top_k, _dtype as given */
    attnd_version *pin;       /* a session step's: the version its session was opened on,
                                 borrowed; NULL: the model's version serving now */
} collected;

/* c emptied: nothing given, causal and weights -1 (not said), the roles'
 * labels their names; v2 1 for v2's parameter names in messages. */
void attnd_collected_init(collected *c, int v2);
void attnd_collected_free(collected *c);

/* The model from the path (path_model, or NULL) and the body's "model":
 * its version serving now, or c->pin when set, with a reference for the
 * caller; or NULL with e set (404 unknown or not loaded, 400 a mismatch or
 * none named while several are served). */
attnd_version *attnd_resolve_model(const attnd_parse_env *env, const char *path_model,
                                   const collected *c, attnd_error *e);

/* What c holds, checked against the model and the limits, into job (kind:
 * a whole request, a session's open or its step). Returns 0, or -1 with e
 * set; job holds nothing to free after a failure. */
int attnd_build_job(const attnd_parse_env *env, const char *path_model, collected *c,
                    body_kind kind, attnd_job *job, attnd_error *e);

/* The whole body, which must be one JSON object, against table t into
 * dst, and nothing after it; given, when not NULL, gets the fields that
 * were there (attnd_jin_object). Returns 0, or -1 with e set. */
int attnd_read_body(const char *body, size_t len, const jtable *t, void *dst, unsigned *given,
                    attnd_error *e);

/* The reader of "timeout_ms" (v2: parameters.timeout_ms), an int at
 * f->offset in dst, and the table row that uses it. */
int attnd_read_timeout(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);
#define TIMEOUT_FIELD(nm, off)                                                                     \
    {                                                                                              \
        .name = nm, .type = JF_CUSTOM, .read = attnd_read_timeout, .offset = off,                  \
        .accepts = 1u << JT_NUMBER, .expects = "a whole number of milliseconds, 1 or more"         \
    }

#endif
