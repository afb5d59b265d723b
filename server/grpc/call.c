/* call.c - one gRPC call's metadata, references, drain count and end
 * (call.h); the calls counted, for /metrics (grpc.h).
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/clock.h"
#include "../obs/log.h"
#include "call.h"
#include "calls.h"
#include "wire.h"

/* The value of metadata key (lowercase, as HTTP/2 carries it) into out
 * (NUL-terminated, cut at cap), how many times it came in *count. NULL when
 * absent. */
const char *attnd_gcall_md_value(const gcall *c, const char *key, char *out, size_t cap,
                                 int *count) {
    const char *found = NULL;
    size_t kn = strlen(key);
    if (count) *count = 0;
    for (size_t i = 0; i < c->md.count; i++) {
        grpc_slice k = c->md.metadata[i].key, v = c->md.metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) != kn || memcmp(GRPC_SLICE_START_PTR(k), key, kn) != 0) continue;
        if (count) (*count)++;
        if (found) continue;
        size_t n = GRPC_SLICE_LENGTH(v) < cap - 1 ? GRPC_SLICE_LENGTH(v) : cap - 1;
        memcpy(out, GRPC_SLICE_START_PTR(v), n);
        out[n] = '\0';
        found = out;
    }
    return found;
}

/* ---- references ---- */

void attnd_gcall_ref(gcall *c) {
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

void attnd_gcall_free(gcall *c) {
    if (c->call) grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv) grpc_byte_buffer_destroy(c->recv);
    if (c->send) grpc_byte_buffer_destroy(c->send);
    for (int i = 0; i < c->hq_n; i++)
        grpc_slice_unref(c->hq[i]);
    for (int i = 0; i < c->plan.n; i++) /* a merged step dropped unanswered */
        grpc_slice_unref(c->parts[i]);
    attnd_grpc_merge_free(&c->plan);
    grpc_slice_unref(c->details_slice);
    while (c->oq) {
        omsg *m = c->oq;
        c->oq = m->next;
        free(m->out);
        free(m);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void attnd_gcall_unref(gcall *c) {
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0) attnd_gcall_free(c);
}

/* Counts c in the drain's g->active (busy 1) or not (mu held). */
void attnd_gcall_set_busy_locked(gcall *c, int busy) {
    if (c->busy == busy) return;
    c->busy = busy;
    atomic_fetch_add(&c->g->active, busy ? 1 : -1);
}

void attnd_gcall_set_busy(gcall *c, int busy) {
    pthread_mutex_lock(&c->mu);
    attnd_gcall_set_busy_locked(c, busy);
    pthread_mutex_unlock(&c->mu);
}

/* ---- the end of a call: metrics, access log, spans ---- */

static uint64_t unix_at(uint64_t t_us, uint64_t now_us, uint64_t now_ns) {
    if (!t_us) return 0;
    uint64_t ago = now_us > t_us ? (now_us - t_us) * 1000 : 0;
    return now_ns > ago ? now_ns - ago : 0;
}

static void export_spans(const gcall *c, uint64_t now_us) {
    if (!c->g->otlp) return;
    uint64_t now_ns = attnd_unix_ns();
    attnd_request_times t = {
        .trace = &c->trace,
        .method = "POST", /* gRPC rides HTTP/2 POSTs to the method's path */
        .path = c->path,
        .route = c->path,
        .model = c->model[0] ? c->model : NULL,
        .request_id = c->id,
        .status = c->http_status,
        .batch_size = c->batch,
        .start_ns = c->t_start_ns,
        .end_ns = now_ns,
        .queue_start_ns = unix_at(c->t_admit_us, now_us, now_ns),
        .queue_end_ns = unix_at(c->t_compute0_us ? c->t_compute0_us : now_us, now_us, now_ns),
        .compute_start_ns = unix_at(c->t_compute0_us, now_us, now_ns),
        .compute_end_ns = unix_at(c->t_compute1_us, now_us, now_ns)};
    if (!c->t_admit_us) t.queue_end_ns = 0;
    attnd_span spans[3];
    int n = attnd_request_spans(&t, spans);
    if (n) attnd_otlp_submit(c->g->otlp, spans, n);
}

/* The call's line in the access log (method GRPC, the gRPC path, the
 * HTTP status of the same answer), its count by method and code, its
 * spans. Once per call. */
void attnd_gcall_record(gcall *c, const char *end) {
    if (c->logged) return;
    c->logged = 1;
    uint64_t now = attnd_mono_us();
    int code = c->code >= 0 && c->code < GRPC_CODES ? c->code : GRPC_UNKNOWN;
    atomic_fetch_add(&c->g->calls[c->method][code], 1);
    if (attnd_kind_is_error(c->refused))
        attnd_metrics_reject(c->g->metrics, c->refused);
    else if (code == GRPC_CANCELLED)
        attnd_metrics_disconnect(c->g->metrics); /* HTTP's 499 */
    char trace_id[2 * ATTND_TRACE_ID_BYTES + 1], span_id[2 * ATTND_SPAN_ID_BYTES + 1];
    attnd_hex(trace_id, c->trace.trace_id, sizeof c->trace.trace_id);
    attnd_hex(span_id, c->trace.span_id, sizeof c->trace.span_id);
    attnd_access a = {"GRPC",
                      c->path,
                      c->http_status,
                      c->sent_bytes,
                      (double)(now - c->t_start_us) / 1e3,
                      c->batch,
                      c->id,
                      end,
                      trace_id,
                      span_id};
    attnd_log_access(&a);
    export_spans(c, now);
}

/* The message's bytes as one slice the caller unrefs: the buffer's own
 * when it holds one uncompressed slice (no copy), else its slices joined.
 * 0, or -1 when gRPC cannot read it. */
int attnd_gcall_message(grpc_byte_buffer *bb, grpc_slice *out) {
    *out = grpc_empty_slice();
    if (!bb) return -1;
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        *out = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
        return 0;
    }
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return -1;
    *out = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    return 0;
}

/* The call's deadline (grpc-timeout) as milliseconds left: 0 when none,
 * -1 when already past. */
int attnd_gcall_deadline_ms(const gcall *c) {
    gpr_timespec d = c->details.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0) return 0;
    int64_t ms = gpr_time_to_millis(gpr_time_sub(d, gpr_now(d.clock_type)));
    if (ms <= 0) return -1;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

int attnd_gcall_too_large(const gcall *c, size_t len, attnd_error *e) {
    long long max = c->g->cfg->max_body_bytes;
    if ((unsigned long long)len <= (unsigned long long)max) return 0;
    return attnd_set_error(e, AERR_TOO_LARGE, "body of %zu bytes, the limit is %lld", len, max);
}

int attnd_gcall_key_ok(const gcall *c, int open) {
    const attnd_grpc *g = c->g;
    if (!g->api_key || open) return 1;
    char v[512];
    const char *h = attnd_gcall_md_value(c, "authorization", v, sizeof v, NULL);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    const char *t = h + 7;
    while (*t == ' ')
        t++;
    size_t n = strlen(t);
    unsigned char d = n != g->api_key_len; /* constant time in the key's length */
    for (size_t i = 0; i < g->api_key_len; i++)
        d |= (unsigned char)(g->api_key[i] ^ (i < n ? t[i] : 0));
    return d == 0;
}

void attnd_grpc_metrics(const attnd_grpc *g, attnd_sbuf *b) {
    attnd_sb_puts(b, "# HELP attnd_grpc_calls_total gRPC calls ended, by method and status code.\n"
                     "# TYPE attnd_grpc_calls_total counter\n");
    for (int m = 0; m < GM_COUNT; m++) {
        const char *name = strrchr(attnd_grpc_methods[m].path, '/');
        name = name ? name + 1 : "unknown";
        if (m == GM_UNKNOWN) name = "unknown";
        for (int k = 0; k < GRPC_CODES; k++) {
            unsigned long long n = atomic_load(&g->calls[m][k]);
            if (n || (k == GRPC_OK && g->port))
                attnd_sb_printf(b, "attnd_grpc_calls_total{method=\"%s\",code=\"%s\"} %llu\n", name,
                                attnd_grpc_code_name(k), n);
        }
    }
    if (!g->port) return;
    attnd_sb_printf(b,
                    "# HELP attnd_grpc_stream_merged_steps_total ModelStreamInfer steps answered "
                    "from one step with others sent ahead on their stream.\n"
                    "# TYPE attnd_grpc_stream_merged_steps_total counter\n"
                    "attnd_grpc_stream_merged_steps_total %llu\n",
                    (unsigned long long)atomic_load(&g->merged));
}
