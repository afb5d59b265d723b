/* trace.h - W3C Trace Context (https://www.w3.org/TR/trace-context/, Level
 * 1) for every route: the caller's `traceparent` read (or a new trace
 * started when it is absent or malformed), its `tracestate` kept within the
 * spec's limits, random trace and span ids made, and the answer's
 * `traceparent` written with the request's own span id.
 *
 * Pure functions over strings and byte arrays: no HTTP, no allocation, no
 * global state but each thread's id generator. Ids are raw bytes here
 * (16 for a trace, 8 for a span); on the wire they are lowercase hex.
 */
#ifndef ATTND_OBS_TRACE_H
#define ATTND_OBS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define ATTND_TRACE_ID_BYTES 16
#define ATTND_SPAN_ID_BYTES 8
#define ATTND_TRACEPARENT_LEN 55 /* "00-" trace "-" span "-" flags, version 00 */
#define ATTND_TRACE_SAMPLED 0x01 /* the only flag of Level 1 */
/* tracestate kept: at most this many characters (the spec asks for at least
 * 512 to be propagated) in at most ATTND_TRACESTATE_MEMBERS list-members. */
#define ATTND_TRACESTATE_MAX 512
#define ATTND_TRACESTATE_MEMBERS 32

/* One request's place in a trace. */
typedef struct {
    uint8_t trace_id[ATTND_TRACE_ID_BYTES]; /* never all zero */
    uint8_t parent_id[ATTND_SPAN_ID_BYTES]; /* the caller's span; all zero when has_parent == 0 */
    uint8_t span_id[ATTND_SPAN_ID_BYTES];   /* the request's own span, never all zero */
    uint8_t flags;                          /* ATTND_TRACE_SAMPLED or 0 */
    int has_parent;                         /* 1: continued from a valid traceparent */
    char tracestate[ATTND_TRACESTATE_MAX + 1]; /* the caller's, cleaned; "" when none */
} attnd_trace;

/* Reads a traceparent value of n bytes. Version 00 is exactly
 * "00-<32 hex>-<16 hex>-<2 hex>"; a higher version (not "ff") is read as
 * the spec says: at least 55 characters whose first 55 read as version 00,
 * followed by the end or a '-' (what follows is ignored), and only its
 * sampled flag kept. Hex is lowercase; an all-zero trace or parent id is
 * invalid. Returns 0 and fills the ids and flags (Level 1 flags only: bits
 * other than sampled are cleared), or -1 with a sentence in err. */
int attnd_traceparent_parse(const char *s, size_t n, uint8_t trace_id[ATTND_TRACE_ID_BYTES],
                            uint8_t parent_id[ATTND_SPAN_ID_BYTES], uint8_t *flags, char *err,
                            size_t errlen);

/* Reads a tracestate value of n bytes: list-members "key=value" split by
 * commas with optional spaces and tabs around them, empty members allowed.
 * A key is a simple key (a lowercase letter, then up to 255 of a-z 0-9 _ -
 * * /) or tenant@system (1 to 241, then 1 to 14 characters); a value is 1
 * to 256 printable ASCII characters but ',' and '=', not ending in a space.
 * More than 32 members, a malformed member or a key given twice make the
 * whole value invalid: -1 with a sentence in err and out = "". Otherwise 0
 * and out holds the members joined by ',' (spaces dropped); when that is
 * longer than ATTND_TRACESTATE_MAX, members over 128 characters are left
 * out first, then members from the end, as the spec asks. */
int attnd_tracestate_clean(const char *s, size_t n, char out[ATTND_TRACESTATE_MAX + 1], char *err,
                           size_t errlen);

/* Starts a request's trace: continues the caller's when traceparent (NUL
 * ended, or NULL when absent) is valid, keeping its sampled flag and its
 * tracestate (NULL when absent; ignored with an invalid traceparent, as the
 * spec says); otherwise a new trace id, sampled. Always makes a new span
 * id. A request that carries the header more than once passes NULL (the
 * spec makes it invalid). Never fails. */
void attnd_trace_start(attnd_trace *t, const char *traceparent, const char *tracestate);

/* Fills n bytes with random bits, never all zero: from a per-thread
 * generator (splitmix64) seeded from getrandom() on the thread's first
 * call. For trace and span ids, not for secrets. */
void attnd_trace_random_id(uint8_t *id, size_t n);

/* The answer's traceparent: "00-<trace id>-<span id>-<flags>" with the
 * request's own span id; out has room for ATTND_TRACEPARENT_LEN + 1. */
void attnd_traceparent_format(const attnd_trace *t, char out[ATTND_TRACEPARENT_LEN + 1]);

/* Writes n bytes as 2n lowercase hex digits and a NUL into out. */
void attnd_hex(char *out, const uint8_t *bytes, size_t n);

#endif
