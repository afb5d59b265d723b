/* errors.c - error kinds to status codes and bodies. See errors.h. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

#include "buffer.h"
#include "utf8.h"

int attnd_err_status(attnd_err e) {
    switch (e) {
    case AERR_NONE:
        return 200;
    case AERR_BAD_REQUEST:
        return 400;
    case AERR_UNAUTHORIZED:
        return 401;
    case AERR_NOT_FOUND:
        return 404;
    case AERR_METHOD:
        return 405;
    case AERR_TOO_LARGE:
        return 413;
    case AERR_QUEUE_FULL:
        return 429;
    case AERR_UNAVAILABLE:
        return 503;
    case AERR_TIMEOUT:
        return 504;
    case AERR_CONFLICT:
        return 409;
    case AERR_INTERNAL:
    case AERR_COUNT:
        break;
    }
    return 500;
}

const char *attnd_err_reason(attnd_err e) {
    switch (e) {
    case AERR_NONE:
        return "none";
    case AERR_BAD_REQUEST:
        return "bad_request";
    case AERR_UNAUTHORIZED:
        return "unauthorized";
    case AERR_NOT_FOUND:
        return "not_found";
    case AERR_METHOD:
        return "method";
    case AERR_TOO_LARGE:
        return "too_large";
    case AERR_QUEUE_FULL:
        return "queue_full";
    case AERR_UNAVAILABLE:
        return "unavailable";
    case AERR_TIMEOUT:
        return "timeout";
    case AERR_CONFLICT:
        return "conflict";
    case AERR_INTERNAL:
    case AERR_COUNT:
        break;
    }
    return "internal";
}

int attnd_set_error(attnd_error *e, attnd_err code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->code = code;
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -1;
}

char *attnd_error_body(const char *msg, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"error\":");
    attnd_sb_json_str(&b, msg);
    attnd_sb_puts(&b, "}\n");
    return attnd_sb_take(&b, len);
}
