/* req.c - a request's references, its session step's end, and the one
 * place what it holds is let go (req.h). */
#include "req.h"

#include <string.h>

#include "../base/clock.h"

void attnd_req_init(attnd_req *r, void (*free_fn)(attnd_req *r)) {
    memset(r, 0, sizeof *r);
    atomic_init(&r->refs, 1);
    r->free_fn = free_fn;
}

void attnd_req_ref(attnd_req *r) {
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

void attnd_req_unref(attnd_req *r) {
    if (!r) return;
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) r->free_fn(r);
}

void attnd_req_end_step(attnd_req *r, int commit) {
    if (!r->step.table || !r->step.st.s) return;
    attnd_session_end(r->step.table, &r->step.st, commit, attnd_mono_s());
    /* parameters.session_close: the step's answer is whole, the session goes */
    if (commit && r->job.session_close)
        attnd_session_delete(r->step.table, r->step.id, attnd_mono_s());
}

void attnd_req_clear(attnd_req *r) {
    attnd_req_end_step(r, 0); /* a step that never computed */
    attnd_job_free(&r->job);
    attnd_reply_free(&r->reply);
}

void attnd_req_deadline(attnd_req *r, int server_ms) {
    r->timeout_ms = server_ms;
    r->timeout_from = "server.request_timeout_ms";
    if (r->job.timeout_ms > 0 && r->job.timeout_ms < r->timeout_ms) {
        r->timeout_ms = r->job.timeout_ms;
        r->timeout_from = r->job.api == API_V2 ? "parameters.timeout_ms" : "timeout_ms";
    }
    if (r->asked_timeout_ms > 0 && r->asked_timeout_ms < r->timeout_ms) {
        r->timeout_ms = r->asked_timeout_ms;
        r->timeout_from =
            r->proto == ATTND_PROTO_GRPC ? "the call's grpc-timeout" : "Request-Timeout-Ms";
    }
    r->deadline_us = r->t_admit_us + (uint64_t)r->timeout_ms * 1000u;
}

void attnd_req_timeout(attnd_req *r) {
    attnd_error e;
    attnd_set_error(&e, AERR_TIMEOUT, "request not done within %d ms (%s); its work was dropped",
                    r->timeout_ms, r->timeout_from ? r->timeout_from : "its deadline");
    attnd_reply_error(&r->reply, &e);
}
