/* trace.c - W3C Trace Context: traceparent read and written, tracestate
 * checked and trimmed to the spec's limits, random ids. The grammar is the
 * Level 1 recommendation's (sections 3.2 and 3.3); trace.h says what each
 * function accepts. It knows no HTTP: the caller passes header values in
 * and sends the formatted traceparent back.
 */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "../../config/refuse.h"
#include "../../config/splitmix.h"
#include "trace.h"

/* ---- traceparent ------------------------------------------------------------ */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1; /* uppercase is not HEXDIGLC */
}

/* Reads 2n lowercase hex digits into n bytes; -1 at any other character. */
static int unhex(uint8_t *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int all_zero(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

void attnd_hex(char *out, const uint8_t *bytes, size_t n) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

int attnd_traceparent_parse(const char *s, size_t n, uint8_t trace_id[ATTND_TRACE_ID_BYTES],
                            uint8_t parent_id[ATTND_SPAN_ID_BYTES], uint8_t *flags, char *err,
                            size_t errlen) {
    uint8_t version, fl;
    if (n < 2 || unhex(&version, s, 1) != 0)
        return cfg_fail(err, errlen, "traceparent: version is not two lowercase hex digits.");
    if (version == 0xff) return cfg_fail(err, errlen, "traceparent: version ff is invalid.");
    if (n < ATTND_TRACEPARENT_LEN || (version == 0 && n != ATTND_TRACEPARENT_LEN) ||
        (n > ATTND_TRACEPARENT_LEN && s[ATTND_TRACEPARENT_LEN] != '-'))
        return cfg_fail(err, errlen, "traceparent: %zu characters where version %02x has %s55.", n,
                        version, version == 0 ? "" : "at least ");
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return cfg_fail(err, errlen, "traceparent: fields are not split by '-' at 2, 35 and 52.");
    if (unhex(trace_id, s + 3, ATTND_TRACE_ID_BYTES) != 0)
        return cfg_fail(err, errlen, "traceparent: trace-id is not 32 lowercase hex digits.");
    if (unhex(parent_id, s + 36, ATTND_SPAN_ID_BYTES) != 0)
        return cfg_fail(err, errlen, "traceparent: parent-id is not 16 lowercase hex digits.");
    if (unhex(&fl, s + 53, 1) != 0)
        return cfg_fail(err, errlen, "traceparent: trace-flags is not two lowercase hex digits.");
    if (all_zero(trace_id, ATTND_TRACE_ID_BYTES))
        return cfg_fail(err, errlen, "traceparent: trace-id is all zeros.");
    if (all_zero(parent_id, ATTND_SPAN_ID_BYTES))
        return cfg_fail(err, errlen, "traceparent: parent-id is all zeros.");
    *flags = fl & ATTND_TRACE_SAMPLED;
    return 0;
}

void attnd_traceparent_format(const attnd_trace *t, char out[ATTND_TRACEPARENT_LEN + 1]) {
    memcpy(out, "00-", 3);
    attnd_hex(out + 3, t->trace_id, ATTND_TRACE_ID_BYTES);
    out[35] = '-';
    attnd_hex(out + 36, t->span_id, ATTND_SPAN_ID_BYTES);
    out[52] = '-';
    attnd_hex(out + 53, &t->flags, 1);
}

/* ---- tracestate ------------------------------------------------------------- */

typedef struct {
    const char *p; /* the member, spaces around it trimmed */
    size_t len;
    size_t keylen; /* characters before '=' */
} ts_member;

static int key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' ||
           c == '/';
}

/* simple-key, or tenant-id "@" system-id. */
static int key_ok(const char *k, size_t n) {
    const char *at = memchr(k, '@', n);
    size_t first = at ? (size_t)(at - k) : n;
    int lower = k[0] >= 'a' && k[0] <= 'z', digit = k[0] >= '0' && k[0] <= '9';
    if (first == 0 || !(lower || (at && digit))) return 0;
    if (first > (at ? 241u : 256u)) return 0;
    for (size_t i = 1; i < first; i++)
        if (!key_char(k[i])) return 0;
    if (!at) return 1;
    size_t sys = n - first - 1;
    if (sys == 0 || sys > 14 || !(at[1] >= 'a' && at[1] <= 'z')) return 0;
    for (size_t i = 2; i <= sys; i++)
        if (!key_char(at[i])) return 0;
    return 1;
}

static int value_ok(const char *v, size_t n) {
    if (n == 0 || n > 256 || v[n - 1] == ' ') return 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x20 || v[i] > 0x7e || v[i] == ',' || v[i] == '=') return 0;
    return 1;
}

/* Splits s into its non-empty members; -1 (err filled) when one is bad. */
static int ts_split(const char *s, size_t n, ts_member *m, int *count, char *err, size_t errlen) {
    size_t i = 0;
    *count = 0;
    while (i <= n) {
        size_t end = i;
        while (end < n && s[end] != ',')
            end++;
        size_t a = i, b = end;
        while (a < b && (s[a] == ' ' || s[a] == '\t'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
            b--;
        if (b > a) {
            if (*count == ATTND_TRACESTATE_MEMBERS)
                return cfg_fail(err, errlen, "tracestate: more than %d list-members.",
                                ATTND_TRACESTATE_MEMBERS);
            const char *eq = memchr(s + a, '=', b - a);
            size_t kl = eq ? (size_t)(eq - (s + a)) : 0;
            if (!eq || !key_ok(s + a, kl) || !value_ok(eq + 1, b - a - kl - 1))
                return cfg_fail(err, errlen, "tracestate: list-member %d is not key=value.",
                                *count);
            m[(*count)++] = (ts_member){s + a, b - a, kl};
        }
        i = end + 1;
    }
    return 0;
}

int attnd_tracestate_clean(const char *s, size_t n, char out[ATTND_TRACESTATE_MAX + 1], char *err,
                           size_t errlen) {
    ts_member m[ATTND_TRACESTATE_MEMBERS];
    int count, keep[ATTND_TRACESTATE_MEMBERS];
    out[0] = '\0';
    if (ts_split(s, n, m, &count, err, errlen) != 0) return -1;
    size_t chars = 0; /* of the kept members, commas left out */
    int kept = count;
    for (int i = 0; i < count; i++) {
        for (int j = 0; j < i; j++)
            if (m[j].keylen == m[i].keylen && memcmp(m[j].p, m[i].p, m[i].keylen) == 0)
                return cfg_fail(err, errlen, "tracestate: key \"%.*s\" is given twice.",
                                (int)m[i].keylen, m[i].p);
        keep[i] = 1;
        chars += m[i].len;
    }
    /* Too long: members over 128 characters go first, then from the end. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = pass ? count - 1 : 0; i >= 0 && i < count; i += pass ? -1 : 1) {
            if (kept == 0 || chars + (size_t)(kept - 1) <= ATTND_TRACESTATE_MAX) break;
            if (keep[i] && (pass || m[i].len > 128)) keep[i] = 0, chars -= m[i].len, kept--;
        }
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        if (!keep[i]) continue;
        if (at) out[at++] = ',';
        memcpy(out + at, m[i].p, m[i].len);
        at += m[i].len;
    }
    out[at] = '\0';
    return 0;
}

/* ---- ids and the request's trace -------------------------------------------- */

static _Thread_local uint64_t rng_state;
static _Thread_local int rng_seeded;

void attnd_trace_random_id(uint8_t *id, size_t n) {
    if (!rng_seeded) {
        uint64_t seed = 0;
        ssize_t got;
        do
            got = getrandom(&seed, sizeof seed, 0);
        while (got < 0 && errno == EINTR);
        /* Without getrandom the thread's own address still tells threads apart. */
        rng_state = seed ^ (uint64_t)(uintptr_t)&rng_state;
        rng_seeded = 1;
    }
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = attnd_splitmix64(&rng_state);
            memcpy(id + i, &r, n - i < 8 ? n - i : 8);
        }
    } while (all_zero(id, n));
}

/* n less the spaces and tabs that end s[0..n): a header value's trailing
 * whitespace, which HTTP does not count as the value (RFC 9110, 5.5). */
static size_t trimmed(const char *s, size_t n) {
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    return n;
}

void attnd_trace_start(attnd_trace *t, const char *traceparent, const char *tracestate) {
    memset(t, 0, sizeof *t);
    if (traceparent &&
        attnd_traceparent_parse(traceparent, trimmed(traceparent, strlen(traceparent)), t->trace_id,
                                t->parent_id, &t->flags, NULL, 0) == 0) {
        t->has_parent = 1;
        if (tracestate)
            attnd_tracestate_clean(tracestate, strlen(tracestate), t->tracestate, NULL, 0);
    } else {
        memset(t->parent_id, 0, sizeof t->parent_id);
        attnd_trace_random_id(t->trace_id, ATTND_TRACE_ID_BYTES);
        t->flags = ATTND_TRACE_SAMPLED;
    }
    attnd_trace_random_id(t->span_id, ATTND_SPAN_ID_BYTES);
}
