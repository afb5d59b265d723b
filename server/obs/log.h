/* log.h - every line attnd writes about itself: start-up, warnings, errors
 * and the access log. Each line carries a UTC timestamp with milliseconds
 * and a level. log_format "text" writes
 *     2026-11-23T18:40:00.123Z info model default: embed_dim=512 ...
 * and "json" writes one object per line, {"ts":...,"level":...,"msg":...},
 * the access log with its fields as keys, as container platforms ingest.
 * Errors go to stderr, everything else to stdout; one write per line.
 * Callers never pass secrets (API keys, bodies) in.
 */
#ifndef ATTND_LOG_H
#define ATTND_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "../../config/enums.h" /* attnd_log_level and the words */

/* Text or JSON lines (a word of attnd_log_formats), the least level
 * written (a word of attnd_log_levels: config/enums.h) and whether the
 * access log is on; a word no row has leaves text, or info. Before the
 * first call: text, info, access log on. Call it before other threads log. */
void attnd_log_setup(const char *format, const char *min_level, int access_log);

void attnd_log(attnd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One request, for the access log line. */
typedef struct {
    const char *method;
    const char *path;     /* control characters already replaced */
    int status;           /* 499: the client left before the answer */
    size_t bytes;         /* body bytes of the answer */
    double ms;            /* first byte to completion */
    int batch;            /* requests in its compute batch, 0 when none */
    const char *id;       /* X-Request-Id */
    const char *end;      /* how it ended: "ok" (whole answer sent), "client_gone",
                             "idle_timeout", "drain_deadline", "error" */
    const char *trace_id; /* its trace (32 hex digits), or NULL: the line has none */
    const char *span_id;  /* its own span in that trace (16 hex digits), or NULL */
} attnd_access;

void attnd_log_access(const attnd_access *a);

#endif
