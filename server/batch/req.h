/* req.h - one request on its way from admission to its answer, as the
 * batch side sees it: the parsed job, its place in a queue, its times, its
 * reply, and, for a KV-cache session step, the session step it carries.
 * The HTTP side (or a test, or a fuzz target) embeds attnd_req as the first
 * member of its own per-request struct and frees that struct in free_fn,
 * which calls attnd_req_clear: the one place a request's job, reply and
 * step are let go. No HTTP and no threads of its own.
 */
#ifndef ATTND_REQ_H
#define ATTND_REQ_H

#include <stdatomic.h>
#include <stdint.h>

#include "../base/reply.h"
#include "../body/request.h"
#include "../session/session.h"

typedef enum {
    RQ_NEW = 0, /* not admitted */
    RQ_QUEUED,  /* in its model's queue */
    RQ_RUNNING, /* taken by the batcher */
    RQ_DONE     /* answered (or dropped) */
} rq_state;

/* The session step a request carries (attnd_admit begins it). */
typedef struct {
    attnd_sessions *table; /* borrowed; NULL: the request is no session step */
    attnd_session_step st; /* begun; st.s == NULL once ended */
    char id[ATTND_SESSION_ID_LEN + 1];
    int opened; /* 1: the request opened the session (a native open answers 201) */
} attnd_req_step;

typedef struct attnd_req attnd_req;

/* Whose request it is: the side that sends its answer (server.c's finish
 * callback picks it). */
enum { ATTND_PROTO_HTTP = 0, ATTND_PROTO_GRPC = 1 };

struct attnd_req {
    int proto;                     /* ATTND_PROTO_*: set by the side that made it */
    atomic_int refs;               /* one for the connection, one for the scheduler while queued or
                                      running; the last unref calls free_fn */
    void (*free_fn)(attnd_req *r); /* frees the embedding struct (after attnd_req_clear) */
    /* guarded by the scheduler mutex */
    rq_state state;
    attnd_req *prev, *next; /* queue links */
    int cancelled;          /* 1: the connection is gone; never finish() it */
    /* set before admission */
    attnd_job job;            /* what to compute; owned */
    long long tokens;         /* what the batch token limit counts (attnd_admit) */
    uint64_t t_admit_us;      /* attnd_mono_us() at admission */
    int asked_timeout_ms;     /* the client's deadline outside the body (Request-Timeout-Ms), ms;
                                 0 = none (the body's is job.timeout_ms) */
    int timeout_ms;           /* the deadline that holds, set by attnd_req_deadline: the smallest
                                 of asked_timeout_ms, job.timeout_ms and request_timeout_ms */
    const char *timeout_from; /* where timeout_ms came from, for the 504's sentence (static) */
    uint64_t deadline_us;     /* t_admit_us + timeout_ms */
    attnd_req_step step;      /* a KV-cache session step, or none */
    /* written once by whoever finishes the request, before finish() */
    attnd_reply reply;             /* the answer; no body when the client left */
    uint64_t t_start_us, t_end_us; /* compute of its batch; 0 when it never ran */
    int batch_requests;            /* requests in that batch */
};

/* r zeroed, one reference held, free_fn set. */
void attnd_req_init(attnd_req *r, void (*free_fn)(attnd_req *r));
void attnd_req_ref(attnd_req *r);
void attnd_req_unref(attnd_req *r); /* NULL is fine */
/* Ends r's session step, if it holds one still begun: commit 1 keeps its
 * rows (the answer went out whole), 0 drops them (and an open takes its
 * session with it). Before the answer is handed over, so that the
 * session's next step finds it free. */
void attnd_req_end_step(attnd_req *r, int commit);
/* Lets go of what r holds: its step (dropped), its job and its reply.
 * What free_fn calls before freeing the embedding struct. */
void attnd_req_clear(attnd_req *r);
/* Sets r's deadline from its admission time (t_admit_us): the smallest of
 * its own (asked_timeout_ms, job.timeout_ms) and server_ms. */
void attnd_req_deadline(attnd_req *r, int server_ms);
/* r's reply: the 504 of a request not done within its timeout_ms. */
void attnd_req_timeout(attnd_req *r);

#endif
