/* serve.c - gRPC's C core under attnd (grpc.h): the listener, the polling
 * thread, each call's life, ModelInfer and ModelStreamInfer on the
 * scheduler, the repository's load on the loader thread, and each call's
 * metrics, access log line and spans.
 *
 * A call is a gcall, alive while anything refers to it: each operation
 * batch started and not completed, each inference (greq) queued or
 * computing, and the call itself until gRPC says it is over (its
 * RECV_CLOSE_ON_SERVER). The last reference frees it. Messages are read on
 * the polling thread; an inference's answer is written and its send
 * started by the worker that answers it (grpc_call_start_batch may be
 * called from any thread). A stream's steps run in order, one at a time:
 * its next message is read while a step computes and held until that
 * step's answer is written, then queued by the worker that wrote it (a
 * client that sends its steps without waiting for answers finds the next
 * one computing while the last answer goes out; one that waits for each
 * finds the read waiting, not one more round through the poller). The
 * answers go out in order, one send at a time, the rest queued behind it.
 */
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../batch/admit.h"
#include "../http/hreq.h"
#include "../http/http.h"
#include "../http/status.h"
#include "../obs/log.h"
#include "../obs/trace.h"
#include "call.h"
#include "calls.h"
#include "wire.h"

/* A stream is busy for the drain while a step of it computes or an answer
 * of it waits to go out, until its status is on its way (mu held). */
static void stream_busy_locked(gcall *c) {
    attnd_gcall_set_busy_locked(c,
                                !c->final_started && (c->step_out || c->sending || c->oq != NULL));
}

/* ---- sending ---- */

/* Starts a batch of n ops on c with tag t, holding a reference for it; on
 * failure (-1) the reference goes at once and t never completes. */
static int start(gcall *c, const grpc_op *ops, size_t n, gtag *t) {
    attnd_gcall_ref(c);
    if (grpc_call_start_batch(c->call, ops, n, t, NULL) == GRPC_CALL_OK) return 0;
    attnd_gcall_unref(c);
    return -1;
}

/* The answer of a unary call, or a stream's last: its message (NULL for a
 * refusal), the status and its message. Takes out (malloc'd). */
static void send_final(gcall *c, uint8_t *out, size_t out_len, int code, const char *msg) {
    pthread_mutex_lock(&c->mu);
    int over = c->over;
    c->final_started = 1;
    pthread_mutex_unlock(&c->mu);
    c->code = code;
    if (over) { /* the client left: nothing goes out */
        free(out);
        return;
    }
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = 1;
    if (out) {
        grpc_slice s = grpc_slice_new(out, out_len, free);
        c->send = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        c->sent_bytes += out_len;
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send;
    }
    c->details_slice = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = &c->details_slice;
    start(c, ops, n, &c->t_send);
}

/* A refusal as the call's status: its code and the HTTP route's sentence. */
static void send_error(gcall *c, const attnd_error *e) {
    c->http_status = attnd_kind_status(e->code);
    c->refused = e->code; /* counted when the call ends, once */
    send_final(c, NULL, 0, attnd_grpc_code(e->code), e->msg);
}

static void stream_sent(gcall *c, int ok);

/* Starts sending one answer of a stream (a ModelStreamInferResponse), out
 * (malloc'd, taken); the caller set c->sending, so it is the only one. */
static void stream_send(gcall *c, uint8_t *out, size_t out_len) {
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = 1;
    if (c->send) grpc_byte_buffer_destroy(c->send);
    grpc_slice s = grpc_slice_new(out, out_len, free);
    c->send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    c->sent_bytes += out_len;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->send;
    if (start(c, ops, n, &c->t_sent_msg) < 0) stream_sent(c, 0);
}

/* 1 when the stream's status may go now: the client is done and every
 * answer is out (mu held); the caller then sends it, once. */
static int stream_may_end_locked(gcall *c) {
    if (!c->client_done || c->step_out || c->sending || c->oq || c->ending) return 0;
    c->ending = 1;
    return 1;
}

static void stream_next(gcall *c);
static void stream_end(gcall *c);

/* The answers of a stream's step are written (outs[0..k), each malloc'd
 * and taken; k 0 when none can go): sent, or queued behind the answers
 * still going out. Then the next step is dispatched (on this thread) from
 * the messages read meanwhile, or the stream ends if the client is done. */
static void send_stream(gcall *c, uint8_t **outs, const size_t *lens, int k) {
    int send_now = -1, next = 0, end = 0;
    uint8_t *first = NULL;
    pthread_mutex_lock(&c->mu);
    int gone = c->over || c->final_started; /* nothing more goes out */
    for (int i = 0; i < k && !gone; i++) {
        omsg *m = NULL;
        if (!c->sending) {
            c->sending = 1;
            send_now = i;
            first = outs[i];
        } else if ((m = malloc(sizeof *m)) != NULL) {
            *m = (omsg){NULL, outs[i], lens[i]};
            if (!c->oq) c->oq_tail = &c->oq;
            *c->oq_tail = m;
            c->oq_tail = &m->next;
        }
        if (send_now == i || m) outs[i] = NULL; /* taken; else dropped: no memory to queue it */
    }
    c->step_out = 0;
    if (c->hq_n && !gone)
        c->step_out = next = 1;
    else
        end = stream_may_end_locked(c);
    stream_busy_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (first) stream_send(c, first, lens[send_now]);
    for (int i = 0; i < k; i++)
        free(outs[i]); /* those not taken: the call is over, or no memory to queue them */
    if (next)
        stream_next(c);
    else if (end)
        stream_end(c);
}

static void send_one(gcall *c, uint8_t *out, size_t out_len) {
    send_stream(c, &out, &out_len, out ? 1 : 0);
}

/* A stream's answer went out (ok), or could not (the call is over): the
 * next one queued, or the stream's end once the client is done. */
static void stream_sent(gcall *c, int ok) {
    omsg *m = NULL, *drop = NULL;
    pthread_mutex_lock(&c->mu);
    c->sending = 0;
    int gone = !ok || c->over || c->final_started;
    if (!gone && c->oq) {
        m = c->oq;
        c->oq = m->next;
        c->sending = 1;
    } else if (gone) {
        drop = c->oq;
        c->oq = NULL;
    }
    int end = stream_may_end_locked(c);
    stream_busy_locked(c);
    pthread_mutex_unlock(&c->mu);
    while (drop) {
        omsg *d = drop;
        drop = d->next;
        free(d->out);
        free(d);
    }
    if (m) {
        stream_send(c, m->out, m->len);
        free(m);
    } else if (end) {
        stream_end(c);
    }
}

/* A merged step refused: its messages go back in front of those read
 * since, to go again each alone, so that each gets the answer it would
 * have got: a refusal of its own, or its rows. */
static void unmerge(gcall *c) {
    int k = c->plan.n;
    attnd_grpc_merge_free(&c->plan);
    pthread_mutex_lock(&c->mu);
    memmove(c->hq + k, c->hq, (size_t)c->hq_n * sizeof *c->hq);
    memcpy(c->hq, c->parts, (size_t)k * sizeof *c->hq);
    c->hq_n += k;
    c->no_merge = k;
    pthread_mutex_unlock(&c->mu);
}

/* A merged step's answer (resp, a packed ModelInferResponse), split into
 * one for each of its messages and sent. */
static void send_merged(gcall *c, uint8_t *resp, size_t n) {
    uint8_t *outs[ATTND_GRPC_MERGE_MAX];
    size_t lens[ATTND_GRPC_MERGE_MAX];
    int k = c->plan.n;
    int rc = attnd_grpc_merge_split(resp, n, &c->plan, outs, lens);
    free(resp);
    if (rc < 0) { /* out of memory: again one by one */
        unmerge(c);
        send_stream(c, NULL, NULL, 0);
        return;
    }
    for (int i = 0; i < k; i++)
        grpc_slice_unref(c->parts[i]);
    attnd_grpc_merge_free(&c->plan);
    atomic_fetch_add(&c->g->merged, (uint64_t)k);
    send_stream(c, outs, lens, k);
}

/* A stream's answer to one message that was refused: its error_message,
 * and the stream goes on. */
static void stream_error(gcall *c, const attnd_error *e) {
    size_t n = 0;
    if (c->plan.n) { /* a merged step: each of its messages again, alone */
        unmerge(c);
        send_stream(c, NULL, NULL, 0);
        return;
    }
    c->http_status = attnd_kind_status(e->code);
    attnd_metrics_reject(c->g->metrics, e->code); /* each message's refusal, as a request's */
    /* n is set by the call: read it after, not as the same call's argument
     * (the order in which arguments are evaluated is unspecified) */
    uint8_t *out = attnd_grpc_stream_error(e->msg, c->model, c->req_id, &n);
    send_one(c, out, n);
}

/* A refusal of one message: a stream's error_message, a unary call's status. */
static void refuse(gcall *c, const attnd_error *e) {
    (c->method == GM_STREAM_INFER ? stream_error : send_error)(c, e);
}

/* ---- inference ---- */

static void greq_free(attnd_req *r) {
    greq *q = (greq *)r;
    gcall *c = q->c;
    attnd_req_clear(r);
    free(q);
    attnd_gcall_unref(c);
}

/* An answer for an inference of c: the call's final message (unary) or a
 * stream's next. kind and body: the scheduler's or admission's reply. */
static void answer(gcall *c, const attnd_reply *rep) {
    int stream = c->method == GM_STREAM_INFER;
    attnd_error e = {AOK, ""};
    if (attnd_kind_is_error(rep->kind)) {
        e.code = rep->kind;
        attnd_grpc_error_text(rep->body, rep->len, e.msg, sizeof e.msg);
    } else {
        uint8_t *out = NULL;
        size_t n = 0;
        if (attnd_grpc_infer_answer(rep->body, rep->len, rep->json_len, &out, &n) == 0) {
            c->http_status = 200;
            if (!stream) {
                send_final(c, out, n, GRPC_OK, NULL);
                return;
            }
            if (c->plan.n) {
                send_merged(c, out, n);
                return;
            }
            uint8_t *wrapped = attnd_grpc_stream_answer(out, n, &n);
            free(out);
            send_one(c, wrapped, n);
            return;
        }
        attnd_set_error(&e, AERR_INTERNAL, "out of memory writing the answer");
    }
    refuse(c, &e);
}

void attnd_grpc_answer_ready(attnd_req *r) {
    greq *q = (greq *)r;
    gcall *c = q->c;
    pthread_mutex_lock(&c->mu);
    int mine = c->cur == q; /* the call's hold on q, unless a cancel took it */
    if (mine) c->cur = NULL;
    pthread_mutex_unlock(&c->mu);
    c->batch = r->batch_requests;
    c->t_compute0_us = r->t_start_us;
    c->t_compute1_us = r->t_end_us;
    answer(c, &r->reply);
    if (mine) attnd_req_unref(r);
}

/* Admits and queues q (its job parsed), or answers it at once: an open
 * without a prefix, a close, or a refusal. */
static void queue_job(gcall *c, greq *q) {
    attnd_grpc *g = c->g;
    attnd_error e = {AOK, ""};
    int retry = 0;
    if (q->r.job.ver) snprintf(c->model, sizeof c->model, "%s", q->r.job.ver->name);
    char x_id[64];
    const char *want = attnd_gcall_md_value(c, "x-session-id", x_id, sizeof x_id, NULL);
    attnd_admit_env a = {g->sessions, g->env};
    c->t_admit_us = attnd_mono_us();
    int rc = attnd_admit(&a, &q->r, want, attnd_mono_s(), &e, &retry);
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        c->cur = q; /* the call's hold: a cancel drops the queued work */
        pthread_mutex_unlock(&c->mu);
        attnd_req_ref(&q->r);
        if (attnd_sched_submit(g->sched, &q->r, &e) == 0) {
            attnd_req_unref(&q->r);
            return;
        }
        pthread_mutex_lock(&c->mu);
        c->cur = NULL;
        pthread_mutex_unlock(&c->mu);
        attnd_req_unref(&q->r);
    }
    attnd_reply rep = {0};
    if (rc == 1)
        rep = q->r.reply;
    else
        attnd_reply_error(&rep, &e);
    answer(c, &rep);
    if (rc != 1) attnd_reply_free(&rep);
    attnd_req_unref(&q->r);
}

/* One ModelInferRequest of c (a unary call's, or a stream's next): read
 * into a job and queued, or refused. */
static void infer(gcall *c, const uint8_t *msg, size_t len) {
    attnd_error e = {AOK, ""};
    greq *q = calloc(1, sizeof *q);
    if (!q) {
        attnd_set_error(&e, AERR_INTERNAL, "out of memory");
        refuse(c, &e);
        return;
    }
    attnd_req_init(&q->r, greq_free);
    q->r.proto = ATTND_PROTO_GRPC;
    q->c = c;
    attnd_gcall_ref(c);
    attnd_grpc_target t = {{0}, {0}, {0}};
    /* a call that arrived before the drain is answered, as an HTTP request
     * whose header lines came before it; a stream's later requests are not */
    int ready =
        c->method == GM_STREAM_INFER ? atomic_load(c->g->state) == S_READY : c->arrived_ready;
    int parsed = ready && attnd_grpc_parse_infer(c->g->env, msg, len, &t, &q->r.job, &e) == 0;
    if (!ready) attnd_set_error(&e, AERR_UNAVAILABLE, "the server is draining");
    snprintf(c->model, sizeof c->model, "%s", t.model); /* this message's, for its refusal */
    snprintf(c->req_id, sizeof c->req_id, "%s", t.id);
    if (parsed && c->plan.n && q->r.job.ver && !q->r.job.ver->info.rows_free) {
        /* merged, its bits would not be those of its steps alone: not on
         * this stream (stream_error sends them again, each alone) */
        c->merge_off = 1;
        attnd_set_error(&e, AERR_INTERNAL, "not merged");
    } else if (parsed) {
        q->r.asked_timeout_ms = c->asked_ms;
        queue_job(c, q);
        return;
    }
    refuse(c, &e);
    attnd_req_unref(&q->r);
}

/* ---- the repository's load, on the loader thread ---- */

static void load_done(void *arg, int rc, int version, const attnd_error *e) {
    gcall *c = arg;
    (void)version;
    uint8_t *out = NULL;
    size_t n = 0;
    if (rc < 0) {
        send_error(c, e);
    } else if (attnd_grpc_repo_load_answer(&out, &n) == 0) {
        c->http_status = 200;
        send_final(c, out, n, GRPC_OK, NULL);
    } else {
        attnd_error oom;
        attnd_set_error(&oom, AERR_INTERNAL, "out of memory");
        send_error(c, &oom);
    }
    attnd_gcall_unref(c); /* the loader's */
}

static void load(gcall *c, const uint8_t *msg, size_t len) {
    attnd_model_config mc;
    attnd_error e = {AOK, ""};
    if (attnd_grpc_repo_load_entry(c->g, msg, len, &mc, &e) < 0) {
        send_error(c, &e);
        return;
    }
    snprintf(c->model, sizeof c->model, "%s", mc.name);
    attnd_gcall_ref(c);
    if (attnd_models_load_async(c->g->env->models, &mc, load_done, c, &e) < 0) {
        send_error(c, &e);
        attnd_gcall_unref(c);
    }
    attnd_model_config_free(&mc);
}

/* ---- grpc.health.v1.Health/Watch ---- */

/* Sends c its status when it is not the one it sent last (watch_mu held,
 * so that the statuses go out in the order they were read). */
static void watch_send_locked(gcall *c) {
    attnd_error e;
    uint8_t *out = NULL;
    size_t n = 0;
    int status = attnd_grpc_health_status(c->g, c->watch_known);
    if (status == c->watch_status || attnd_grpc_health_answer(status, &out, &n, &e) < 0) return;
    c->watch_status = status;
    send_one(c, out, n);
}

/* A Watch call's request: its status now, then each change of it, until
 * the client leaves or the server stops. Not busy for the drain: it ends
 * with the server, after saying NOT_SERVING. */
static void watch(gcall *c, const uint8_t *msg, size_t len) {
    attnd_error e = {AOK, ""};
    if (attnd_grpc_health_service(msg, len, &c->watch_known, &e) < 0) {
        send_error(c, &e);
        return;
    }
    attnd_gcall_ref(c);   /* the list's, until on_close */
    c->http_status = 200; /* on this thread, as the access line reads it */
    pthread_mutex_lock(&c->g->watch_mu);
    c->watch_status = -1;
    c->watch_next = c->g->watchers;
    c->g->watchers = c;
    watch_send_locked(c);
    pthread_mutex_unlock(&c->g->watch_mu);
    attnd_gcall_set_busy(c, 0);
}

void attnd_grpc_health_changed(attnd_grpc *g) {
    if (!g->port) return;
    pthread_mutex_lock(&g->watch_mu);
    for (gcall *c = g->watchers; c; c = c->watch_next)
        watch_send_locked(c);
    pthread_mutex_unlock(&g->watch_mu);
}

/* A Watch call ended: off the list, and its reference let go. */
static void unwatch(gcall *c) {
    pthread_mutex_lock(&c->g->watch_mu);
    gcall **p = &c->g->watchers;
    while (*p && *p != c)
        p = &(*p)->watch_next;
    int found = *p == c;
    if (found) *p = c->watch_next;
    pthread_mutex_unlock(&c->g->watch_mu);
    if (found) attnd_gcall_unref(c);
}

/* ---- a call's messages ---- */

/* Starts reading c's next message. */
static void read_next(gcall *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    if (c->recv) grpc_byte_buffer_destroy(c->recv);
    c->recv = NULL;
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv;
    start(c, &op, 1, &c->t_recv);
}

/* A message of c arrived (msg, len): answered at once, queued, loaded or refused. */
static void dispatch(gcall *c, const uint8_t *msg, size_t len) {
    attnd_error e = {AOK, ""};
    if (c->method != GM_STREAM_INFER)
        attnd_gcall_set_busy(c, 1); /* a stream's: stream_busy_locked */
    if (!attnd_gcall_key_ok(c, attnd_grpc_methods[c->method].open)) {
        attnd_set_error(&e, AERR_UNAUTHORIZED,
                        "missing or wrong API key: send Authorization: Bearer <key>");
        send_error(c, &e);
        return;
    }
    if (attnd_gcall_too_large(c, len, &e) < 0) {
        refuse(c, &e);
        return;
    }
    if (c->method == GM_INFER || c->method == GM_STREAM_INFER) {
        infer(c, msg, len);
        return;
    }
    if (c->method == GM_REPO_LOAD || c->method == GM_HEALTH_WATCH) {
        (c->method == GM_REPO_LOAD ? load : watch)(c, msg, len);
        return;
    }
    if (c->method == GM_UNKNOWN) {
        c->http_status = 404;
        c->refused = AERR_NOT_FOUND; /* HTTP's "no route" */
        char m[160];
        snprintf(m, sizeof m, "unknown method %.*s", (int)GRPC_SLICE_LENGTH(c->details.method),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        send_final(c, NULL, 0, GRPC_UNIMPLEMENTED, m);
        return;
    }
    uint8_t *out = NULL;
    size_t n = 0;
    if (attnd_grpc_methods[c->method].unary(c->g, msg, len, &out, &n, &e) < 0) {
        send_error(c, &e);
        return;
    }
    c->http_status = 200;
    send_final(c, out, n, GRPC_OK, NULL);
}

/* 1 (and reading set) when a stream reads its next message now: none is
 * being read, the client is not done, its status is not on its way, and
 * fewer than ATTND_GRPC_MERGE_MAX wait (mu held). */
static int want_read_locked(gcall *c) {
    if (c->reading || c->client_done || c->final_started || c->over ||
        c->hq_n >= ATTND_GRPC_MERGE_MAX)
        return 0;
    c->reading = 1;
    return 1;
}

/* A stream's step (step_out set), msg (len bytes): dispatched, and the
 * next message read meanwhile, if there is room to hold it. */
static void stream_step(gcall *c, const uint8_t *msg, size_t len) {
    dispatch(c, msg, len);
    pthread_mutex_lock(&c->mu);
    int rd = want_read_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (rd) read_next(c);
}

/* The stream's next step (step_out set) from the messages held: the run
 * of them that merges into one step (merge.h), or the first alone. */
static void next_step(gcall *c) {
    grpc_slice run[ATTND_GRPC_MERGE_MAX];
    uint8_t *merged = NULL;
    size_t len = 0;
    pthread_mutex_lock(&c->mu); /* others only append: the front is this thread's */
    int n = c->hq_n < ATTND_GRPC_MERGE_MAX ? c->hq_n : ATTND_GRPC_MERGE_MAX;
    memcpy(run, c->hq, (size_t)n * sizeof *run);
    int alone = c->no_merge > 0;
    c->no_merge -= alone;
    pthread_mutex_unlock(&c->mu);
    size_t max = (size_t)c->g->cfg->max_body_bytes;
    int k = n >= 2 && !alone && !c->merge_off
                ? attnd_grpc_merge_steps(run, n, max, &merged, &len, &c->plan)
                : 1;
    pthread_mutex_lock(&c->mu);
    c->hq_n -= k;
    memmove(c->hq, c->hq + k, (size_t)c->hq_n * sizeof *c->hq);
    pthread_mutex_unlock(&c->mu);
    if (k == 1) {
        stream_step(c, GRPC_SLICE_START_PTR(run[0]), GRPC_SLICE_LENGTH(run[0]));
        grpc_slice_unref(run[0]);
        return;
    }
    memcpy(c->parts, run, (size_t)k * sizeof *run); /* before the answer can come */
    stream_step(c, merged, len);
    free(merged);
}

/* The stream's next steps, on this thread. A step refused at once
 * (send_stream on this thread, not a worker's answer) asks for the next
 * one before its own call returns: that ask only marks the loop here to
 * go round again, so that a client streaming refusals while the poller
 * reads more cannot grow this thread's stack without bound. */
static void stream_next(gcall *c) {
    static _Thread_local const gcall *running;
    static _Thread_local int again;
    if (running == c) {
        again = 1;
        return;
    }
    const gcall *outer = running;
    int outer_again = again;
    running = c;
    do {
        again = 0;
        next_step(c);
    } while (again);
    running = outer;
    again = outer_again;
}

/* The end of a stream, once every answer is out: its OK status. */
static void stream_end(gcall *c) {
    if (!c->http_status) c->http_status = 200;
    send_final(c, NULL, 0, GRPC_OK, NULL);
}

/* A stream's next message arrived (msg), or the client's messages ended
 * (no msg): dispatched, held (and the next read) while a step computes,
 * or the end once every answer is out. */
static void stream_recv(gcall *c, grpc_slice msg, int got) {
    int now = 0, rd = 0;
    pthread_mutex_lock(&c->mu);
    c->reading = 0;
    if (!got) {
        c->client_done = 1;
        now = stream_may_end_locked(c);
    } else if (c->step_out) {
        c->hq[c->hq_n++] = msg;
        rd = want_read_locked(c);
    } else {
        c->step_out = now = 1;
        stream_busy_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (rd) read_next(c);
    if (now && got) {
        stream_step(c, GRPC_SLICE_START_PTR(msg), GRPC_SLICE_LENGTH(msg));
        grpc_slice_unref(msg);
    } else if (now) {
        stream_end(c);
    }
}

/* RECV_MESSAGE completed: a message, or the end of the client's messages. */
static void on_recv(gcall *c, int ok) {
    attnd_error e = {AOK, ""};
    int stream = c->method == GM_STREAM_INFER;
    if (!ok) return; /* the call failed: RECV_CLOSE_ON_SERVER ends it */
    if (!c->recv) {
        if (stream) {
            stream_recv(c, grpc_empty_slice(), 0);
            return;
        }
        attnd_set_error(&e, AERR_BAD_REQUEST, "no request message");
        send_error(c, &e);
        return;
    }
    grpc_slice msg;
    int rc = attnd_gcall_message(c->recv, &msg);
    grpc_byte_buffer_destroy(c->recv);
    c->recv = NULL;
    if (rc < 0) {
        attnd_set_error(&e, AERR_BAD_REQUEST, "the message could not be read (its compression)");
        send_error(c, &e);
        return;
    }
    if (stream) {
        stream_recv(c, msg, 1);
        return;
    }
    dispatch(c, GRPC_SLICE_START_PTR(msg), GRPC_SLICE_LENGTH(msg));
    grpc_slice_unref(msg);
}

/* ---- a call's life ---- */

/* Asks gRPC for the next call. */
static void request_call(attnd_grpc *g) {
    if (atomic_load(&g->shutting)) return;
    gcall *c = calloc(1, sizeof *c);
    if (!c) return;
    c->g = g;
    pthread_mutex_init(&c->mu, NULL);
    c->refs = 1; /* the request's, then the call's until RECV_CLOSE_ON_SERVER */
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->details_slice = grpc_empty_slice();
    c->t_new = (gtag){c, T_NEW};
    c->t_recv = (gtag){c, T_RECV};
    c->t_close = (gtag){c, T_CLOSE};
    c->t_send = (gtag){c, T_SEND};
    c->t_sent_msg = (gtag){c, T_SENT_MSG};
    if (grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cq, g->cq,
                                 &c->t_new) != GRPC_CALL_OK)
        attnd_gcall_free(c);
}

/* A call arrived: its place in a trace, its deadline, the watch on its
 * end, and the read of its first message. */
static void on_new(gcall *c, int ok) {
    attnd_grpc *g = c->g;
    if (!ok) { /* the server shuts down: no call */
        attnd_gcall_unref(c);
        return;
    }
    request_call(g);
    c->t_start_us = attnd_mono_us();
    c->t_start_ns = attnd_unix_ns();
    c->method = attnd_grpc_method_of((const char *)GRPC_SLICE_START_PTR(c->details.method),
                                     GRPC_SLICE_LENGTH(c->details.method));
    c->arrived_ready = atomic_load(g->state) == S_READY;
    /* the drain waits for a unary call from its arrival (its message may
     * still be on its way); a stream only while a request of it computes */
    if (c->method != GM_STREAM_INFER) attnd_gcall_set_busy(c, 1);
    snprintf(c->path, sizeof c->path, "%.*s", (int)GRPC_SLICE_LENGTH(c->details.method),
             (const char *)GRPC_SLICE_START_PTR(c->details.method));
    for (char *p = c->path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == ' ' || *p == 0x7f) *p = '?';
    char parent[128], state[2 * ATTND_TRACESTATE_MAX + 2], rid[64];
    int n_parent = 0;
    const char *tp = attnd_gcall_md_value(c, "traceparent", parent, sizeof parent, &n_parent);
    const char *ts = attnd_gcall_md_value(c, "tracestate", state, sizeof state, NULL);
    attnd_trace_start(&c->trace, n_parent == 1 ? tp : NULL, ts);
    attnd_http_request_id(attnd_gcall_md_value(c, "x-request-id", rid, sizeof rid, NULL), c->id);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
        attnd_gcall_unref(c);
        return;
    }
    int ms = attnd_gcall_deadline_ms(c);
    c->asked_ms = ms > 0 ? ms : 0;
    c->reading = 1;
    read_next(c);
}

/* gRPC ended the call: its status went out, or the client left (or its
 * deadline passed) first. Queued work of a call that ended early is
 * dropped. */
static void on_close(gcall *c) {
    pthread_mutex_lock(&c->mu);
    c->over = 1;
    greq *q = c->cur;
    c->cur = NULL;
    pthread_mutex_unlock(&c->mu);
    if (q) {
        attnd_sched_cancel(c->g->sched, &q->r);
        attnd_req_unref(&q->r);
    }
    if (!c->logged && c->cancelled) {
        int late = c->asked_ms && attnd_gcall_deadline_ms(c) < 0;
        int stop = !late && atomic_load(&c->g->shutting); /* ended by the stop, not its client */
        c->code = late ? GRPC_DEADLINE_EXCEEDED : stop ? GRPC_UNAVAILABLE : GRPC_CANCELLED;
        c->http_status = late ? 504 : stop ? 503 : 499;
        c->refused = late ? AERR_TIMEOUT : AOK;
        attnd_gcall_record(c, late ? "deadline" : stop ? "shutdown" : "client_gone");
    }
    if (c->method == GM_HEALTH_WATCH) unwatch(c);
    attnd_gcall_set_busy(c, 0); /* on_event lets go of the call's own reference */
}

static void on_event(attnd_grpc *g, gtag *t, int ok) {
    gcall *c = t->c;
    /* What a worker wrote before it started this batch (the answer's code,
     * status and bytes) was written before it took c->mu in start(); taking
     * it here orders those writes before the reads below for every checker
     * (gRPC's own ordering lies inside a library ThreadSanitizer does not
     * see). */
    if (t->kind != T_NEW) {
        pthread_mutex_lock(&c->mu);
        pthread_mutex_unlock(&c->mu);
    }
    switch (t->kind) {
    case T_NEW:
        on_new(c, ok);
        return;
    case T_RECV:
        on_recv(c, ok);
        break;
    case T_CLOSE:
        on_close(c);
        break;
    case T_SEND: /* the status went out (or could not: the call is over) */
        attnd_gcall_record(c, ok ? "ok" : "client_gone");
        attnd_gcall_set_busy(c, 0);
        break;
    case T_SENT_MSG: /* a stream's answer went out: the next one */
        stream_sent(c, ok);
        break;
    default:
        (void)g;
        return;
    }
    attnd_gcall_unref(c); /* the batch's */
}

/* ---- start and stop ---- */

static gtag shutdown_tag = {NULL, T_SHUTDOWN};

static void *poll_loop(void *arg) {
    attnd_grpc *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        gtag *t = ev.tag;
        if (t->kind == T_SHUTDOWN) { /* every call is over: nothing more will complete */
            grpc_completion_queue_shutdown(g->cq);
            continue;
        }
        on_event(g, t, ev.success);
    }
    return NULL;
}

/* The listening address: host:port, IPv6 literals in brackets. */
static void listen_addr(const attnd_config *c, char *out, size_t cap) {
    const char *h = c->host && c->host[0] ? c->host : "0.0.0.0";
    int port = c->grpc_port < 0 ? 0 : c->grpc_port; /* -1: gRPC picks a free one */
    if (strchr(h, ':'))
        snprintf(out, cap, "[%s]:%d", h, port);
    else
        snprintf(out, cap, "%s:%d", h, port);
}

/* The server with its limits: any size out; in, twice max_body_bytes and
 * 1 MiB (what HTTP reads of a refused body), so that attnd_gcall_too_large
 * answers those over the limit; gRPC's core refuses larger ones itself. */
static grpc_server *new_server(const attnd_config *c) {
    long long max_in = 2 * c->max_body_bytes + (1 << 20); /* max_body_bytes: at most 2^34 */
    if (max_in > INT_MAX) max_in = INT_MAX;
    /* gRPC's core sets SO_REUSEPORT by default: a second daemon given the
     * port of a first would share it, the calls split between them */
    grpc_arg args[3] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = (int)max_in}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = -1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}}};
    grpc_channel_args ca = {3, args};
    return grpc_server_create(&ca, NULL);
}

/* Calls asked for at once: arrivals that find one waiting are taken at
 * once, without a round through the poller. */
#define CALLS_WAITING 16

int attnd_grpc_start(attnd_grpc *g, int *listen_failed, char *err, size_t errlen) {
    const attnd_config *c = g->cfg;
    *listen_failed = 0;
    if (c->grpc_port == 0) return 0;
    grpc_init();
    pthread_mutex_init(&g->watch_mu, NULL);
    g->server = new_server(c);
    g->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    char addr[300];
    listen_addr(c, addr, sizeof addr);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    g->port = grpc_server_add_http2_port(g->server, addr, cr);
    grpc_server_credentials_release(cr);
    if (g->port <= 0) {
        snprintf(err, errlen, "cannot listen for gRPC on %s (address in use, or not allowed)",
                 addr);
        *listen_failed = 1;
        g->port = 0;
        return -1;
    }
    grpc_server_start(g->server);
    for (int i = 0; i < CALLS_WAITING; i++)
        request_call(g);
    if (pthread_create(&g->poller, NULL, poll_loop, g) != 0) {
        snprintf(err, errlen, "cannot start the gRPC thread");
        return -1;
    }
    g->running = 1;
    attnd_log(LOG_INFO,
              "grpc: inference.GRPCInferenceService and grpc.health.v1.Health on %s (port %d)",
              addr, g->port);
    return 0;
}

void attnd_grpc_stop(attnd_grpc *g) {
    if (!g->server) return;
    if (!atomic_exchange(&g->shutting, 1))
        grpc_server_shutdown_and_notify(g->server, g->cq, &shutdown_tag);
    grpc_server_cancel_all_calls(g->server); /* idle streams, calls still sending */
    /* the poller takes every event up to the queue's end; a server that
     * never got its poller (its port refused) is drained here, the same
     * way, or gRPC keeps the server and its quota past grpc_shutdown */
    if (g->running)
        pthread_join(g->poller, NULL);
    else
        poll_loop(g);
    g->running = 0;
    grpc_server_destroy(g->server);
    grpc_completion_queue_destroy(g->cq);
    g->server = NULL;
    g->cq = NULL;
    pthread_mutex_destroy(&g->watch_mu); /* every call over: no Watch is left */
    grpc_shutdown();
}
