/* errors.c - answer kinds to statuses, reasons and headers, and the bodies
 * of refusals. See errors.h. */
#include "reply.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "buffer.h"
#include "utf8.h"

/* One line per kind: everything an answer of that kind says besides its
 * body. */
// clang-format off
static const struct {
    int status;
    const char *reason;
    unsigned headers;
} KINDS[ATTND_KINDS] = {
    [AOK]               = {200, "none",         0},
    [AOK_CREATED]       = {201, "none",         0},
    [AOK_NO_CONTENT]    = {204, "none",         ATTND_HDR_ALLOW},
    [AOK_PREFLIGHT]     = {204, "none",         ATTND_HDR_ALLOW | ATTND_HDR_PREFLIGHT},
    [AOK_UNCHANGED]     = {304, "none",         0},
    [AERR_BAD_REQUEST]  = {400, "bad_request",  0},
    [AERR_UNAUTHORIZED] = {401, "unauthorized", ATTND_HDR_AUTHENTICATE},
    [AERR_NOT_FOUND]    = {404, "not_found",    0},
    [AERR_METHOD]       = {405, "method",       ATTND_HDR_ALLOW},
    [AERR_TOO_LARGE]    = {413, "too_large",    0},
    [AERR_QUEUE_FULL]   = {429, "queue_full",   ATTND_HDR_RETRY_AFTER},
    [AERR_INTERNAL]     = {500, "internal",     0},
    [AERR_UNAVAILABLE]  = {503, "unavailable",  ATTND_HDR_RETRY_AFTER},
    [AERR_TIMEOUT]      = {504, "timeout",      0},
    [AERR_CONFLICT]     = {409, "conflict",     0},
};
// clang-format on

/* Anything out of range is an internal failure. */
static attnd_kind known(attnd_kind k) {
    return (unsigned)k < ATTND_KINDS ? k : AERR_INTERNAL;
}

int attnd_kind_status(attnd_kind k) {
    return KINDS[known(k)].status;
}

int attnd_kind_is_error(attnd_kind k) {
    return known(k) >= AERR_FIRST;
}

const char *attnd_kind_reason(attnd_kind k) {
    return KINDS[known(k)].reason;
}

unsigned attnd_kind_headers(attnd_kind k) {
    return KINDS[known(k)].headers;
}

int attnd_set_error(attnd_error *e, attnd_kind code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->code = code;
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -1;
}

void attnd_reply_error(attnd_reply *a, const attnd_error *e) {
    attnd_reply_free(a);
    a->kind = e->code;
    a->body = attnd_error_body(e->msg, &a->len);
}

void attnd_reply_set(attnd_reply *a, attnd_kind k, char *body, size_t len, size_t json_len) {
    attnd_reply_free(a);
    a->kind = k;
    a->body = body;
    a->len = len;
    a->json_len = json_len;
}

void attnd_reply_borrow(attnd_reply *a, attnd_kind k, const char *body, size_t len) {
    attnd_reply_free(a);
    a->kind = k;
    a->body = (char *)body;
    a->len = len;
    a->borrowed = 1;
}

char *attnd_reply_take(attnd_reply *a) {
    char *body = a->body;
    a->body = NULL;
    return body;
}

void attnd_reply_free(attnd_reply *a) {
    if (!a->borrowed) free(a->body);
    *a = (attnd_reply){.kind = AOK};
}

char *attnd_error_body(const char *msg, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"error\":");
    attnd_sb_json_str(&b, msg);
    attnd_sb_puts(&b, "}\n");
    return attnd_sb_take(&b, len);
}
