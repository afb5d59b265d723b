/* merge.c - a stream's steps sent ahead, computed as one: which messages
 * merge, their one ModelInferRequest, and the answer split back into one
 * ModelStreamInferResponse each (merge.h). */
#include "merge.h"

#include <stdlib.h>
#include <string.h>

#include "inference.pb-c.h"
#include "wire.h"

typedef Inference__ModelInferRequest InferRequest;
typedef Inference__ModelInferRequest__InferInputTensor InferInput;
typedef Inference__ModelInferRequest__ParametersEntry ReqParam;
typedef Inference__InferParameter InferParameter;
typedef Inference__ModelInferResponse InferResponse;
typedef Inference__ModelInferResponse__InferOutputTensor OutputTensor;
typedef Inference__ModelInferResponse__ParametersEntry RespParam;

static int same_str(const char *a, const char *b) {
    return strcmp(a ? a : "", b ? b : "") == 0;
}

static int same_value(const InferParameter *a, const InferParameter *b) {
    if (!a || !b || a->parameter_choice_case != b->parameter_choice_case) return 0;
    switch (a->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        return same_str(a->string_param, b->string_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        return a->int64_param == b->int64_param;
    default:
        return 0; /* the two keys a step may carry are a string and an integer */
    }
}

/* The element size of a datatype a step's raw rows may have; 0: none. */
static size_t elem_size(const char *dt) {
    if (same_str(dt, "FP32")) return 4;
    if (same_str(dt, "FP64")) return 8;
    return 0;
}

/* A plain step's rows (its input's row count), or 0 when rq is no plain
 * step: one raw FP32 or FP64 input [1, L, E] or [L, E] whose bytes are
 * all its rows, session_id and at most timeout_ms, "output" alone asked. */
static int64_t plain_rows(const InferRequest *rq) {
    if (rq->n_inputs != 1 || rq->n_raw_input_contents != 1) return 0;
    const InferInput *in = rq->inputs[0];
    size_t es = elem_size(in->datatype);
    if (!es || in->contents || in->n_parameters) return 0;
    if (in->n_shape != 2 && !(in->n_shape == 3 && in->shape[0] == 1)) return 0;
    int64_t L = in->shape[in->n_shape - 2], E = in->shape[in->n_shape - 1];
    if (L < 1 || L > ATTND_GRPC_MERGE_ROWS || E < 1 || E > (1 << 20)) return 0;
    if (rq->raw_input_contents[0].len != (size_t)(L * E) * es) return 0;
    int has_id = 0;
    for (size_t i = 0; i < rq->n_parameters; i++) {
        const char *k = rq->parameters[i]->key;
        if (same_str(k, "session_id"))
            has_id = 1;
        else if (!same_str(k, "timeout_ms"))
            return 0;
    }
    for (size_t i = 0; i < rq->n_outputs; i++)
        if (!same_str(rq->outputs[i]->name, "output") || rq->outputs[i]->n_parameters) return 0;
    return has_id ? L : 0;
}

/* The parameter key of rq, or NULL. */
static const InferParameter *param(const InferRequest *rq, const char *key) {
    for (size_t i = 0; i < rq->n_parameters; i++)
        if (same_str(rq->parameters[i]->key, key)) return rq->parameters[i]->value;
    return NULL;
}

/* 1 when b is a plain step that goes with a: the same model, version,
 * parameters, input name, datatype, rank and row width, outputs. */
static int goes_with(const InferRequest *a, const InferRequest *b) {
    if (!same_str(a->model_name, b->model_name) || !same_str(a->model_version, b->model_version))
        return 0;
    if (a->n_parameters != b->n_parameters || a->n_outputs != b->n_outputs) return 0;
    for (size_t i = 0; i < a->n_parameters; i++)
        if (!same_value(a->parameters[i]->value, param(b, a->parameters[i]->key))) return 0;
    const InferInput *x = a->inputs[0], *y = b->inputs[0];
    if (!same_str(x->name, y->name) || !same_str(x->datatype, y->datatype) ||
        x->n_shape != y->n_shape || x->shape[x->n_shape - 1] != y->shape[y->n_shape - 1])
        return 0;
    return 1;
}

/* The run's one request: a's fields, every row of rq[0..k) in order, no
 * id (each message's stays in plan). */
static int pack_merged(InferRequest **rq, int k, int64_t rows, uint8_t **merged, size_t *len) {
    InferRequest m = *rq[0];
    InferInput in = *rq[0]->inputs[0], *inp = &in;
    int64_t shape[3];
    memcpy(shape, in.shape, in.n_shape * sizeof *shape);
    shape[in.n_shape - 2] = rows;
    in.shape = shape;
    size_t bytes = 0;
    for (int i = 0; i < k; i++)
        bytes += rq[i]->raw_input_contents[0].len;
    ProtobufCBinaryData raw = {bytes, malloc(bytes ? bytes : 1)};
    if (!raw.data) return -1;
    for (size_t i = 0, off = 0; i < (size_t)k; off += rq[i]->raw_input_contents[0].len, i++)
        memcpy(raw.data + off, rq[i]->raw_input_contents[0].data, rq[i]->raw_input_contents[0].len);
    m.id = NULL;
    m.inputs = &inp;
    m.raw_input_contents = &raw;
    *len = inference__model_infer_request__get_packed_size(&m);
    *merged = malloc(*len);
    if (*merged) inference__model_infer_request__pack(&m, *merged);
    free(raw.data);
    return *merged ? 0 : -1;
}

/* Fills plan from rq[0..k); -1 when out of memory. */
static int fill_plan(InferRequest **rq, int k, attnd_grpc_merge *plan) {
    memset(plan, 0, sizeof *plan);
    plan->n = k;
    for (int i = 0; i < k; i++) {
        plan->rows[i] = (int)plain_rows(rq[i]);
        if (rq[i]->id && rq[i]->id[0] && !(plan->ids[i] = strdup(rq[i]->id))) return -1;
    }
    return 0;
}

int attnd_grpc_merge_steps(const grpc_slice *msgs, int n, size_t max_bytes, uint8_t **merged,
                           size_t *len, attnd_grpc_merge *plan) {
    InferRequest *rq[ATTND_GRPC_MERGE_MAX];
    int k = 0, ok = 0;
    int64_t rows = 0;
    size_t bytes = 0;
    if (n > ATTND_GRPC_MERGE_MAX) n = ATTND_GRPC_MERGE_MAX;
    for (; k < n; k++) {
        rq[k] = inference__model_infer_request__unpack(NULL, GRPC_SLICE_LENGTH(msgs[k]),
                                                       GRPC_SLICE_START_PTR(msgs[k]));
        int64_t r = rq[k] ? plain_rows(rq[k]) : 0;
        bytes += GRPC_SLICE_LENGTH(msgs[k]);
        if (!r || (k && !goes_with(rq[0], rq[k])) || rows + r > ATTND_GRPC_MERGE_ROWS ||
            bytes > max_bytes) {
            if (rq[k]) inference__model_infer_request__free_unpacked(rq[k], NULL);
            break;
        }
        rows += r;
    }
    if (k >= 2) {
        ok = pack_merged(rq, k, rows, merged, len) == 0 && fill_plan(rq, k, plan) == 0;
        if (!ok) {
            attnd_grpc_merge_free(plan);
            free(*merged);
            *merged = NULL;
        }
    }
    for (int i = 0; i < k; i++)
        inference__model_infer_request__free_unpacked(rq[i], NULL);
    return ok ? k : 1;
}

void attnd_grpc_merge_free(attnd_grpc_merge *plan) {
    for (int i = 0; i < plan->n && i < ATTND_GRPC_MERGE_MAX; i++)
        free(plan->ids[i]);
    memset(plan, 0, sizeof *plan);
}

/* ---- the answer, split ---- */

/* Part i of r (rows r0..r0+rows of total): its outputs' rows, its id, its
 * cached_tokens (the session's count once its own rows were in), packed
 * in a ModelStreamInferResponse. */
static uint8_t *pack_part(const InferResponse *r, const attnd_grpc_merge *plan, int i, int r0,
                          int total, size_t *len) {
    InferResponse p = *r;
    size_t no = r->n_outputs, np = r->n_parameters;
    OutputTensor outs[4], *out_ptrs[4];
    int64_t shapes[4][8];
    ProtobufCBinaryData raw[4];
    RespParam params[16], *param_ptrs[16];
    InferParameter values[16];
    if (no > 4 || np > 16 || r->n_raw_output_contents != no) return NULL;
    for (size_t o = 0; o < no; o++) {
        OutputTensor *t = r->outputs[o];
        size_t nd = t->n_shape, all = r->raw_output_contents[o].len;
        if (nd < 2 || nd > 8 || t->shape[nd - 2] != total || all % (size_t)total) return NULL;
        size_t row = all / (size_t)total;
        outs[o] = *t;
        memcpy(shapes[o], t->shape, nd * sizeof **shapes);
        shapes[o][nd - 2] = plan->rows[i];
        outs[o].shape = shapes[o];
        raw[o].data = r->raw_output_contents[o].data + row * (size_t)r0;
        raw[o].len = row * (size_t)plan->rows[i];
        out_ptrs[o] = &outs[o];
    }
    for (size_t k = 0; k < np; k++) {
        params[k] = *r->parameters[k];
        values[k] = *params[k].value;
        if (same_str(params[k].key, "cached_tokens"))
            values[k].int64_param -= total - (r0 + plan->rows[i]);
        params[k].value = &values[k];
        param_ptrs[k] = &params[k];
    }
    p.outputs = out_ptrs;
    p.raw_output_contents = raw;
    p.parameters = param_ptrs;
    p.id = plan->ids[i] ? plan->ids[i] : (char *)"";
    size_t n = inference__model_infer_response__get_packed_size(&p);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return NULL;
    inference__model_infer_response__pack(&p, buf);
    uint8_t *wrapped = attnd_grpc_stream_answer(buf, n, len);
    free(buf);
    return wrapped;
}

int attnd_grpc_merge_split(const uint8_t *resp, size_t n, const attnd_grpc_merge *plan,
                           uint8_t **out, size_t *lens) {
    InferResponse *r = inference__model_infer_response__unpack(NULL, n, resp);
    int total = 0, r0 = 0, i = 0;
    for (int k = 0; k < plan->n; k++)
        total += plan->rows[k];
    for (; r && i < plan->n; r0 += plan->rows[i], i++)
        if (!(out[i] = pack_part(r, plan, i, r0, total, &lens[i]))) break;
    if (r) inference__model_infer_response__free_unpacked(r, NULL);
    if (i == plan->n) return 0;
    while (i-- > 0)
        free(out[i]);
    return -1;
}
