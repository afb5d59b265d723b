/* merge.h - a stream's steps sent ahead, computed as one (merge.c).
 *
 * A client that sends a session's steps on a ModelStreamInfer stream
 * without waiting for their answers leaves them queued behind the step in
 * flight. Steps of one session that differ in nothing but their rows and
 * their id are one step of all their rows: the causal mask over the cache
 * makes each row see what it would have seen alone, and where the model's
 * rows are computed alike in any number (attn_model_rows_free: decoder
 * models, the fused AVX-512 block, bf16 attention) each row gets the bits
 * it gets alone; serve.c merges nothing else. So the stream reads the
 * layer's weights once for the run, not once a step, and splits the
 * answer back into one per message, in order, each with its own rows, id
 * and cached_tokens.
 *
 * Only plain steps merge: one raw FP32 or FP64 input of shape [1, L, E] or
 * [L, E], parameters session_id and at most timeout_ms, alike in all, no
 * outputs asked for but "output". Anything else goes alone, as it came.
 * Nothing here knows the scheduler or the call: bytes in, bytes out.
 */
#ifndef ATTND_GRPC_MERGE_H
#define ATTND_GRPC_MERGE_H

#include <grpc/slice.h>
#include <stddef.h>
#include <stdint.h>

/* At most this many messages, and this many rows, a merged step. */
#define ATTND_GRPC_MERGE_MAX 16
#define ATTND_GRPC_MERGE_ROWS 256

/* How a merged step's answer splits: each message's rows and id. */
typedef struct {
    int n;                           /* messages merged, >= 2 */
    int rows[ATTND_GRPC_MERGE_MAX];  /* each message's rows, in order */
    char *ids[ATTND_GRPC_MERGE_MAX]; /* each message's id (malloc'd), or NULL */
} attnd_grpc_merge;

/* How many of msgs[0..n) (a stream's messages, in the order they came) go
 * as one step: the longest run from the first that merges, no larger than
 * max_bytes packed. 1 when the first goes alone (then nothing is set);
 * else *merged holds the run's ModelInferRequest (malloc'd, *len bytes)
 * and plan how to split its answer (attnd_grpc_merge_free frees it). */
int attnd_grpc_merge_steps(const grpc_slice *msgs, int n, size_t max_bytes, uint8_t **merged,
                           size_t *len, attnd_grpc_merge *plan);

/* A merged step's answer (resp: a packed ModelInferResponse of all the
 * rows) as plan->n ModelStreamInferResponses, out[i] (malloc'd) of lens[i]
 * bytes. 0, or -1 (out of memory, or an answer not of the rows merged)
 * with nothing left allocated. */
int attnd_grpc_merge_split(const uint8_t *resp, size_t n, const attnd_grpc_merge *plan,
                           uint8_t **out, size_t *lens);

void attnd_grpc_merge_free(attnd_grpc_merge *plan);

#endif
