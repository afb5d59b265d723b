/* call.h - one gRPC call as serve.c drives it (a gcall): its state, its
 * references, its place in the drain's count, and its end: the access log
 * line, the count by method and code, the spans (call.c). serve.c alone
 * includes it.
 */
#ifndef ATTND_GRPC_CALL_H
#define ATTND_GRPC_CALL_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../batch/req.h"
#include "../http/hreq.h"
#include "../obs/trace.h"
#include "grpc.h"
#include "merge.h"
#include "wire.h"

typedef struct gcall gcall;

/* A stream's answer waiting for the one before it to go out. */
typedef struct omsg {
    struct omsg *next;
    uint8_t *out;
    size_t len;
} omsg;

/* What a completion is about. */
enum { T_NEW, T_RECV, T_CLOSE, T_SEND, T_SENT_MSG, T_SHUTDOWN };

typedef struct {
    gcall *c; /* NULL for T_SHUTDOWN */
    int kind;
} gtag;

/* One inference of a call (a unary ModelInfer, or one message of a
 * stream), as the scheduler sees it. */
typedef struct {
    attnd_req r; /* first: the scheduler's */
    gcall *c;
} greq;

struct gcall {
    attnd_grpc *g;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv; /* the message RECV_MESSAGE read, or NULL */
    int cancelled;          /* RECV_CLOSE_ON_SERVER's: the call ended without its status */
    gtag t_new, t_recv, t_close, t_send, t_sent_msg;
    pthread_mutex_t mu;
    int refs;          /* under mu */
    int over;          /* under mu: gRPC ended the call; nothing more is sent */
    greq *cur;         /* under mu: the inference in flight, held */
    int method;        /* GM_* */
    int md_sent;       /* initial metadata went out */
    int busy;          /* under mu: counted in g->active */
    int arrived_ready; /* the server served when the call arrived */
    /* the answer on its way: one send at a time */
    grpc_byte_buffer *send;
    grpc_slice details_slice;
    int code;           /* the status sent (or to send) */
    int http_status;    /* the HTTP status of the same answer, for the log */
    attnd_kind refused; /* the refusal that ends it (attnd_rejected_total), AOK when none */
    int logged;
    int final_started; /* under mu: the status is on its way, nothing more is read */
    /* a stream's, under mu */
    int step_out; /* a step is dispatched and its answer not yet written */
    int reading;  /* a RECV_MESSAGE is in flight */
    /* messages read while step_out, in order: up to ATTND_GRPC_MERGE_MAX
     * are read ahead; a merged step refused puts its own back in front */
    grpc_slice hq[2 * ATTND_GRPC_MERGE_MAX];
    int hq_n;
    int no_merge; /* this many steps go alone: a merged step of them was refused */
    /* not under mu: the step's owner's (who dispatched it, then who answers it) */
    attnd_grpc_merge plan;                  /* the step out merges plan.n >= 2 messages */
    grpc_slice parts[ATTND_GRPC_MERGE_MAX]; /* their messages, until answered */
    int merge_off;       /* the stream's model gives other bits in merged steps: none merge */
    int client_done;     /* the client's messages ended while answers were still due */
    int sending;         /* an answer's SEND_MESSAGE is in flight */
    omsg *oq, **oq_tail; /* answers written, waiting for that send */
    int ending;          /* the stream's status is decided */
    size_t sent_bytes;
    int batch;
    int asked_ms; /* the call's own deadline (grpc-timeout), ms; 0: none */
    /* for the log and the spans */
    uint64_t t_start_us, t_start_ns, t_admit_us, t_compute0_us, t_compute1_us;
    char path[96];
    char model[ATTND_NAME_MAX];
    char id[ATTND_REQUEST_ID_MAX];
    char req_id[ATTND_GRPC_ID_MAX]; /* the id of the ModelInferRequest read last, for its refusal */
    /* a Health/Watch call, under g->watch_mu */
    gcall *watch_next; /* the next one watching */
    int watch_known;   /* it watches a service served */
    int watch_status;  /* the status it sent last; -1 before the first */
    attnd_trace trace;
};

/* The value of metadata key (lowercase, as HTTP/2 carries it) into out
 * (NUL-terminated, cut at cap), how many times it came in *count. NULL when
 * absent. */
const char *attnd_gcall_md_value(const gcall *c, const char *key, char *out, size_t cap,
                                 int *count);

/* The message's bytes as one slice the caller unrefs (the buffer's own
 * when it holds one uncompressed slice): 0, or -1 when gRPC cannot read it. */
int attnd_gcall_message(grpc_byte_buffer *bb, grpc_slice *out);
/* The call's deadline (grpc-timeout) as milliseconds left: 0 when none,
 * -1 when already past. */
int attnd_gcall_deadline_ms(const gcall *c);

/* A message of len bytes over server.max_body_bytes: -1 with HTTP's 413
 * for a body of that size (gRPC's core takes messages up to a margin past
 * the limit, so that this sentence answers them); else 0. */
int attnd_gcall_too_large(const gcall *c, size_t len, attnd_error *e);

/* 1 when c may go on: the server has no API key, the method is open
 * (liveness, readiness, health), or the metadata authorization is
 * "Bearer <key>" (compared in time that does not depend on the key). */
int attnd_gcall_key_ok(const gcall *c, int open);

/* References: the last unref frees the call (attnd_gcall_free, also for a
 * call gRPC never filled). */
void attnd_gcall_ref(gcall *c);
void attnd_gcall_unref(gcall *c);
void attnd_gcall_free(gcall *c);

/* Counts c in the drain's g->active (busy 1) or not; _locked with c->mu
 * held. */
void attnd_gcall_set_busy_locked(gcall *c, int busy);
void attnd_gcall_set_busy(gcall *c, int busy);

/* The call's line in the access log (method GRPC, the gRPC path, the
 * HTTP status of the same answer; end says how it ended), its count by
 * method and code, its refusal or the client's leaving counted as an HTTP
 * request's (attnd_rejected_total, attnd_timeouts_total), its spans. Once
 * per call. */
void attnd_gcall_record(gcall *c, const char *end);

#endif
