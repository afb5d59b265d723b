/* otlp.h - a request's spans, exported to an OpenTelemetry collector as
 * OTLP/HTTP JSON (https://opentelemetry.io/docs/specs/otlp/) off the
 * request path.
 *
 * Three parts, each usable alone:
 *   - spans: plain fixed-size records (no pointers to free), and
 *     attnd_request_spans, which makes a request's three spans (the request,
 *     with its queue and compute children) from its trace and its times;
 *   - the encoder (otlp.c): a batch of spans as one ExportTraceServiceRequest
 *     in the protobuf JSON mapping OTLP asks for;
 *   - the exporter (otlp_export.c): a bounded ring that attnd_otlp_submit
 *     fills without ever waiting for the network or for room (what does not
 *     fit is dropped and counted), and a thread of its own that takes
 *     batches from it and POSTs them with libcurl.
 * It knows no routes: the caller makes spans when a request ends.
 */
#ifndef ATTND_OBS_OTLP_H
#define ATTND_OBS_OTLP_H

#include <stddef.h>
#include <stdint.h>

#include "../base/buffer.h"
#include "trace.h"

#define ATTND_SPAN_ATTRS 10  /* attributes a span holds at most */
#define ATTND_SPAN_STR 96    /* bytes of a string attribute, NUL included (longer is cut) */
#define ATTND_SPAN_NAME 48   /* bytes of a span name, NUL included */
#define ATTND_SPAN_STATUS 48 /* bytes of a status message, NUL included */

/* OTLP's SpanKind and Status.code values (the JSON carries the numbers). */
typedef enum { ATTND_SPAN_INTERNAL = 1, ATTND_SPAN_SERVER = 2 } attnd_span_kind;
typedef enum { ATTND_SPAN_UNSET = 0, ATTND_SPAN_OK = 1, ATTND_SPAN_ERROR = 2 } attnd_span_code;

typedef struct {
    const char *key; /* static storage (a literal); the span does not own it */
    int is_int;      /* 1: i holds the value; 0: s does */
    long long i;
    char s[ATTND_SPAN_STR];
} attnd_span_attr;

/* One span, by value: the ring copies it whole. */
typedef struct {
    uint8_t trace_id[ATTND_TRACE_ID_BYTES];
    uint8_t span_id[ATTND_SPAN_ID_BYTES];
    uint8_t parent_id[ATTND_SPAN_ID_BYTES]; /* all zero: a root span */
    uint8_t trace_flags;                    /* W3C flags: ATTND_TRACE_SAMPLED */
    int parent_remote;                      /* 1: the parent is the caller's span */
    char name[ATTND_SPAN_NAME];
    attnd_span_kind kind;
    uint64_t start_ns, end_ns; /* Unix time, nanoseconds */
    attnd_span_code code;
    char message[ATTND_SPAN_STATUS]; /* status message; "" when none */
    int n_attrs;
    attnd_span_attr attrs[ATTND_SPAN_ATTRS];
} attnd_span;

/* Adds an attribute; past ATTND_SPAN_ATTRS it is left out. A string is cut
 * to ATTND_SPAN_STR - 1 bytes (the encoder keeps the JSON valid). */
void attnd_span_str(attnd_span *s, const char *key, const char *value);
void attnd_span_int(attnd_span *s, const char *key, long long value);

/* The realtime clock in Unix nanoseconds, the time spans carry. */
uint64_t attnd_unix_ns(void);

/* What a request did, for its spans. Times are Unix nanoseconds; a phase it
 * never reached has 0 for both ends. */
typedef struct {
    const attnd_trace *trace; /* its trace: ids, the caller's span, flags */
    const char *method;       /* "POST" */
    const char *path;         /* the URL's path, control characters replaced */
    const char *route;        /* the route's template, "/v1/sessions/{id}"; NULL: path */
    const char *model;        /* NULL when none was chosen */
    const char *request_id;   /* X-Request-Id; NULL when none */
    int status;               /* the HTTP status answered */
    int batch_size;           /* requests in its compute batch; 0 when none */
    uint64_t start_ns, end_ns;
    uint64_t queue_start_ns, queue_end_ns;
    uint64_t compute_start_ns, compute_end_ns;
} attnd_request_times;

/* Fills out with the request's spans and returns how many: the request
 * span (SERVER, the trace's span id, the caller's span as parent, named
 * after method and route: "POST /v1/sessions/{id}"; attributes
 * http.request.method, url.path, http.route, http.response.status_code,
 * attnd.model,
 * attnd.batch_size, attnd.queue_us, attnd.compute_us, attnd.request_id, and
 * for 5xx error.type with status ERROR), then `queue` and `compute` (INTERNAL,
 * children of the request span, new span ids) when it reached them. An
 * unsampled trace gives 0 spans: its caller asked for none to be recorded. */
int attnd_request_spans(const attnd_request_times *r, attnd_span out[3]);

/* Appends n spans as one OTLP/HTTP JSON ExportTraceServiceRequest: one
 * resource (service.name "attnd", service.version) and one scope ("attnd",
 * service_version). Ids are lowercase hex, times decimal strings of
 * nanoseconds, integers decimal strings, kinds and codes numbers, as the
 * protobuf JSON mapping and OTLP ask. Check out->oom at the end. */
void attnd_otlp_encode(attnd_sbuf *out, const attnd_span *spans, int n,
                       const char *service_version);

/* ---- the exporter (otlp_export.c) ------------------------------------------- */

typedef struct {
    const char *endpoint;        /* full URL: "http://collector:4318/v1/traces" (copied) */
    int queue_spans;             /* the ring's capacity, >= 1 */
    int batch_max;               /* spans per POST, 1..queue_spans */
    int interval_ms;             /* a queued span waits this long at most for its batch, >= 1 */
    int timeout_ms;              /* one POST, connection included, >= 1 */
    int shutdown_ms;             /* attnd_otlp_free flushes this long at most, >= 0 */
    int fail_log_s;              /* export failures are logged once per this many seconds at
                                    most (a counted summary); 0: 60 */
    const char *service_version; /* the resource's service.version (copied) */
} attnd_otlp_opts;

typedef struct {
    unsigned long long exported; /* spans the collector took */
    unsigned long long dropped;  /* spans that found the ring full, or were left at shutdown */
    unsigned long long failed;   /* spans sent and not taken: unreachable, timed out, refused */
    unsigned long long batches;  /* POSTs made */
    int queued;                  /* spans in the ring now */
} attnd_otlp_stats;

typedef struct attnd_otlp attnd_otlp;

/* Checks o, allocates the ring and starts the exporter's thread. NULL with
 * a sentence in err when o is out of range or nothing can start. */
attnd_otlp *attnd_otlp_new(const attnd_otlp_opts *o, char *err, size_t errlen);

/* Queues a request's n spans, all or none: returns n, or 0 when the ring
 * lacks room for them all (they are counted as dropped). Never waits for
 * the network nor for room, never allocates: it holds the ring's lock only
 * to copy the spans in. Any thread. */
int attnd_otlp_submit(attnd_otlp *x, const attnd_span *spans, int n);

/* The counters, for /metrics. Any thread. */
void attnd_otlp_stats_get(attnd_otlp *x, attnd_otlp_stats *out);

/* The exporter's counters for GET /metrics: attnd_trace_spans_exported_total,
 * _dropped_total, _failed_total, attnd_trace_export_batches_total and the
 * attnd_trace_spans_queued gauge. x NULL (no export configured): all 0. */
void attnd_otlp_metrics(attnd_otlp *x, attnd_sbuf *b);

/* Sends what is queued within shutdown_ms (a POST under way is cut at that
 * deadline), counts the rest as dropped, logs any failures not yet logged,
 * joins the thread and frees. NULL is a no-op. */
void attnd_otlp_free(attnd_otlp *x);

#endif
