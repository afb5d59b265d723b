/* reply.c - answer kinds' names, refusals, and the replies that hold
 * answers until they are sent. See reply.h. */
#include "reply.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "buffer.h"
#include "utf8.h"

/* Each kind's name: the reason a refusal is counted under. */
static const char *const REASONS[ATTND_KINDS] = {
    [AOK] = "none",
    [AOK_CREATED] = "none",
    [AOK_NO_CONTENT] = "none",
    [AOK_PREFLIGHT] = "none",
    [AOK_UNCHANGED] = "none",
    [AERR_BAD_REQUEST] = "bad_request",
    [AERR_UNAUTHORIZED] = "unauthorized",
    [AERR_NOT_FOUND] = "not_found",
    [AERR_METHOD] = "method",
    [AERR_TOO_LARGE] = "too_large",
    [AERR_QUEUE_FULL] = "queue_full",
    [AERR_INTERNAL] = "internal",
    [AERR_UNAVAILABLE] = "unavailable",
    [AERR_TIMEOUT] = "timeout",
    [AERR_CONFLICT] = "conflict",
    [AERR_FORBIDDEN] = "forbidden",
    [AERR_NO_ROOM] = "no_room",
};

/* Anything out of range is an internal failure. */
static attnd_kind known(attnd_kind k) {
    return (unsigned)k < ATTND_KINDS ? k : AERR_INTERNAL;
}

int attnd_kind_is_error(attnd_kind k) {
    return known(k) >= AERR_FIRST;
}

const char *attnd_kind_reason(attnd_kind k) {
    return REASONS[known(k)];
}

int attnd_set_error(attnd_error *e, attnd_kind code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->code = code;
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -1;
}

/* A refusal's body: members (or none) then "error" (reply.h). */
static char *error_body(const char *members, const char *msg, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{");
    if (members && *members) {
        attnd_sb_puts(&b, members);
        attnd_sb_puts(&b, ",");
    }
    attnd_sb_puts(&b, "\"error\":");
    attnd_sb_json_str(&b, msg);
    attnd_sb_puts(&b, "}\n");
    return attnd_sb_take(&b, len);
}

void attnd_reply_error(attnd_reply *a, const attnd_error *e) {
    attnd_reply_error_with(a, e, NULL);
}

void attnd_reply_error_with(attnd_reply *a, const attnd_error *e, const char *members) {
    attnd_reply_free(a);
    a->kind = e->code;
    a->body = error_body(members, e->msg, &a->len);
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
    return error_body(NULL, msg, len);
}
