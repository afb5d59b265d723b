/* otlp.c - spans and their OTLP/HTTP JSON encoding: a request's three
 * spans made from its trace and times, and a batch of spans written as an
 * ExportTraceServiceRequest. The JSON follows OTLP's rules for the
 * protobuf JSON mapping: lowerCamelCase field names, trace and span ids as
 * hex (not base64), 64-bit integers (times, intValue) as decimal strings,
 * enums (kind, status code) as numbers. The exporter (otlp_export.c) sends
 * what this writes.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../base/utf8.h"
#include "otlp.h"

static attnd_span_attr *next_attr(attnd_span *s, const char *key) {
    if (s->n_attrs >= ATTND_SPAN_ATTRS) return NULL;
    attnd_span_attr *a = &s->attrs[s->n_attrs++];
    memset(a, 0, sizeof *a);
    a->key = key;
    return a;
}

void attnd_span_str(attnd_span *s, const char *key, const char *value) {
    attnd_span_attr *a = next_attr(s, key);
    if (a) snprintf(a->s, sizeof a->s, "%s", value);
}

void attnd_span_int(attnd_span *s, const char *key, long long value) {
    attnd_span_attr *a = next_attr(s, key);
    if (a) a->is_int = 1, a->i = value;
}

uint64_t attnd_unix_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- a request's spans ------------------------------------------------------ */

static long long us_between(uint64_t a, uint64_t b) {
    return b > a ? (long long)((b - a) / 1000) : 0;
}

/* A child of the request span: INTERNAL, a new span id. */
static void child(attnd_span *c, const attnd_span *parent, const char *name, uint64_t start,
                  uint64_t end) {
    memset(c, 0, sizeof *c);
    memcpy(c->trace_id, parent->trace_id, sizeof c->trace_id);
    memcpy(c->parent_id, parent->span_id, sizeof c->parent_id);
    attnd_trace_random_id(c->span_id, sizeof c->span_id);
    c->trace_flags = parent->trace_flags;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->kind = ATTND_SPAN_INTERNAL;
    c->start_ns = start;
    c->end_ns = end;
}

int attnd_request_spans(const attnd_request_times *r, attnd_span out[3]) {
    const attnd_trace *t = r->trace;
    if (!(t->flags & ATTND_TRACE_SAMPLED)) return 0;
    attnd_span *s = &out[0];
    memset(s, 0, sizeof *s);
    memcpy(s->trace_id, t->trace_id, sizeof s->trace_id);
    memcpy(s->span_id, t->span_id, sizeof s->span_id);
    if (t->has_parent) memcpy(s->parent_id, t->parent_id, sizeof s->parent_id);
    s->parent_remote = t->has_parent;
    s->trace_flags = t->flags;
    const char *route = r->route ? r->route : r->path;
    snprintf(s->name, sizeof s->name, "%s %s", r->method, route);
    s->kind = ATTND_SPAN_SERVER;
    s->start_ns = r->start_ns;
    s->end_ns = r->end_ns;
    long long queue_us = us_between(r->queue_start_ns, r->queue_end_ns);
    long long compute_us = us_between(r->compute_start_ns, r->compute_end_ns);
    attnd_span_str(s, "http.request.method", r->method);
    attnd_span_str(s, "url.path", r->path);
    if (r->route) attnd_span_str(s, "http.route", r->route);
    attnd_span_int(s, "http.response.status_code", r->status);
    if (r->model) attnd_span_str(s, "attnd.model", r->model);
    if (r->batch_size) attnd_span_int(s, "attnd.batch_size", r->batch_size);
    if (r->queue_start_ns) attnd_span_int(s, "attnd.queue_us", queue_us);
    if (r->compute_start_ns) attnd_span_int(s, "attnd.compute_us", compute_us);
    if (r->request_id) attnd_span_str(s, "attnd.request_id", r->request_id);
    if (r->status >= 500) {
        char code[12];
        snprintf(code, sizeof code, "%d", r->status);
        attnd_span_str(s, "error.type", code);
        s->code = ATTND_SPAN_ERROR;
        snprintf(s->message, sizeof s->message, "HTTP %d", r->status);
    }
    int n = 1;
    if (r->queue_start_ns) {
        child(&out[n], s, "queue", r->queue_start_ns, r->queue_end_ns);
        attnd_span_int(&out[n++], "attnd.queue_us", queue_us);
    }
    if (r->compute_start_ns) {
        child(&out[n], s, "compute", r->compute_start_ns, r->compute_end_ns);
        if (r->model) attnd_span_str(&out[n], "attnd.model", r->model);
        attnd_span_int(&out[n], "attnd.batch_size", r->batch_size);
        attnd_span_int(&out[n++], "attnd.compute_us", compute_us);
    }
    return n;
}

/* ---- the JSON --------------------------------------------------------------- */

static void put_hex(attnd_sbuf *b, const char *field, const uint8_t *id, size_t n) {
    char hex[2 * ATTND_TRACE_ID_BYTES + 1];
    attnd_hex(hex, id, n);
    attnd_sb_printf(b, "\"%s\":\"%s\",", field, hex);
}

static void put_string_attr(attnd_sbuf *b, const char *key, const char *value) {
    attnd_sb_puts(b, "{\"key\":");
    attnd_sb_json_str(b, key);
    attnd_sb_puts(b, ",\"value\":{\"stringValue\":");
    attnd_sb_json_str(b, value);
    attnd_sb_puts(b, "}}");
}

static void put_attrs(attnd_sbuf *b, const attnd_span *s) {
    attnd_sb_puts(b, "\"attributes\":[");
    for (int i = 0; i < s->n_attrs; i++) {
        const attnd_span_attr *a = &s->attrs[i];
        if (i) attnd_sb_putc(b, ',');
        if (!a->is_int) {
            put_string_attr(b, a->key, a->s);
            continue;
        }
        attnd_sb_puts(b, "{\"key\":");
        attnd_sb_json_str(b, a->key);
        attnd_sb_printf(b, ",\"value\":{\"intValue\":\"%lld\"}}", a->i);
    }
    attnd_sb_puts(b, "],");
}

/* Span.flags: the W3C flags in bits 0-7, then "whether the parent is
 * remote is known" (0x100) and "it is" (0x200). */
static unsigned span_flags(const attnd_span *s) {
    return s->trace_flags | 0x100u | (s->parent_remote ? 0x200u : 0);
}

static int all_zero(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void put_span(attnd_sbuf *b, const attnd_span *s) {
    attnd_sb_putc(b, '{');
    put_hex(b, "traceId", s->trace_id, sizeof s->trace_id);
    put_hex(b, "spanId", s->span_id, sizeof s->span_id);
    if (!all_zero(s->parent_id, sizeof s->parent_id))
        put_hex(b, "parentSpanId", s->parent_id, sizeof s->parent_id);
    attnd_sb_printf(b, "\"flags\":%u,\"name\":", span_flags(s));
    attnd_sb_json_str(b, s->name);
    attnd_sb_printf(b, ",\"kind\":%d,\"startTimeUnixNano\":\"%llu\",\"endTimeUnixNano\":\"%llu\",",
                    (int)s->kind, (unsigned long long)s->start_ns, (unsigned long long)s->end_ns);
    put_attrs(b, s);
    attnd_sb_printf(b, "\"status\":{\"code\":%d", (int)s->code);
    if (s->message[0]) {
        attnd_sb_puts(b, ",\"message\":");
        attnd_sb_json_str(b, s->message);
    }
    attnd_sb_puts(b, "}}");
}

void attnd_otlp_encode(attnd_sbuf *out, const attnd_span *spans, int n,
                       const char *service_version) {
    attnd_sb_puts(out, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    put_string_attr(out, "service.name", "attnd");
    attnd_sb_putc(out, ',');
    put_string_attr(out, "service.version", service_version);
    attnd_sb_puts(out, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"attnd\",\"version\":");
    attnd_sb_json_str(out, service_version);
    attnd_sb_puts(out, "},\"spans\":[");
    for (int i = 0; i < n; i++) {
        if (i) attnd_sb_putc(out, ',');
        put_span(out, &spans[i]);
    }
    attnd_sb_puts(out, "]}]}]}");
}
