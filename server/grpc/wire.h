/* wire.h - the Open Inference Protocol's gRPC messages, read and written
 * as the HTTP v2 routes' bodies (wire.c). A ModelInferRequest becomes the
 * body POST /v2/models/{name}/infer would carry with the binary data
 * extension (a JSON part, then each input's bytes), which the v2 reader
 * (body/v2.c) reads into a job; the v2 answer, every output binary, becomes
 * a ModelInferResponse; the repository's and the metadata's JSON bodies
 * become their messages. One reader, one set of checks and one sentence
 * per refusal for both protocols, and the same bits. No gRPC library here:
 * protobuf-c's messages and plain buffers.
 */
#ifndef ATTND_GRPC_WIRE_H
#define ATTND_GRPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/buffer.h"
#include "../base/reply.h"
#include "../body/job.h"

/* gRPC's status codes (grpc/status.h), by the numbers every client knows. */
enum {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_ALREADY_EXISTS = 6,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_FAILED_PRECONDITION = 9,
    GRPC_ABORTED = 10,
    GRPC_OUT_OF_RANGE = 11,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_DATA_LOSS = 15,
    GRPC_UNAUTHENTICATED = 16,
    GRPC_CODES = 17
};

/* The code of a refusal of kind k (docs/api.md's table); GRPC_OK for a
 * success. */
int attnd_grpc_code(attnd_kind k);
/* A code's name: "OK", "INVALID_ARGUMENT", ... */
const char *attnd_grpc_code_name(int code);

/* The longest ModelInferRequest id a refusal on a stream repeats. */
#define ATTND_GRPC_ID_MAX 256

/* What a ModelInferRequest names besides its body. */
typedef struct {
    char model[ATTND_NAME_MAX]; /* model_name */
    char version[24];           /* model_version, "" when not given */
    char id[ATTND_GRPC_ID_MAX]; /* id, "" when not given or longer than this holds */
} attnd_grpc_target;

/* ModelInferRequest bytes (msg, len) into the v2 body of the same request:
 * b gets the JSON part, then the inputs' bytes, *json_len the JSON part's
 * length. Returns 0, or -1 with e set (400 naming the field). */
int attnd_grpc_infer_body(const uint8_t *msg, size_t len, attnd_grpc_target *t, attnd_sbuf *b,
                          size_t *json_len, attnd_error *e);
/* The same, read into job by the v2 reader for the model named (a
 * model_version other than the one serving is 404). Returns 0, or -1 with
 * e set; job holds nothing after a failure. */
int attnd_grpc_parse_infer(const attnd_parse_env *env, const uint8_t *msg, size_t len,
                           attnd_grpc_target *t, attnd_job *job, attnd_error *e);

/* A v2 answer's body (JSON part of json_len bytes, then the binary
 * outputs; json_len 0: JSON only) as a ModelInferResponse, in a malloc'd
 * buffer (*out, *out_len). Returns 0, or -1 (out of memory, or a body that
 * is no v2 answer). */
int attnd_grpc_infer_answer(const char *body, size_t len, size_t json_len, uint8_t **out,
                            size_t *out_len);
/* A ModelStreamInferResponse around an answer (resp, n bytes: a packed
 * ModelInferResponse), in a malloc'd buffer (*out_len bytes), or NULL. */
uint8_t *attnd_grpc_stream_answer(const uint8_t *resp, size_t n, size_t *out_len);

/* A ModelStreamInferResponse for a message refused: error_message, and an
 * infer_response naming the model and the request's id (either may be ""),
 * so that a client with several steps in flight can match the refusal to
 * its request; in a malloc'd buffer (*out_len bytes), or NULL. */
uint8_t *attnd_grpc_stream_error(const char *error, const char *model, const char *id,
                                 size_t *out_len);

/* The sentence of a refusal's body {"error": "..."} into msg. */
void attnd_grpc_error_text(const char *body, size_t len, char *msg, size_t cap);

#endif
