/* log.c - timestamped, levelled log lines in text or JSON. See log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../base/buffer.h"
#include "../base/utf8.h"

static struct {
    int json;
    int min; /* attnd_log_level */
    int access;
} conf = {0, LOG_INFO, 1};

void attnd_log_setup(const char *format, const char *min_level, int access_log) {
    int f = ATTND_LOG_TEXT, l = LOG_INFO;
    attnd_enum_value(&attnd_log_formats, format, &f);
    attnd_enum_value(&attnd_log_levels, min_level, &l);
    conf.json = f == ATTND_LOG_JSON;
    conf.min = l;
    conf.access = access_log;
}

/* The level's word; every level has a row. */
static const char *level_word(attnd_log_level level) {
    const char *w = attnd_enum_name(&attnd_log_levels, (int)level);
    return w ? w : "error";
}

/* "2026-11-23T18:40:00.123Z" into buf (32 bytes). */
static void timestamp(char *buf) {
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(buf, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, 32 - n, ".%03ldZ", now.tv_nsec / 1000000);
}

/* The line's start: timestamp and level, as text or as the opening of a
 * JSON object (the caller adds its fields and closes it). */
static void line_start(attnd_sbuf *b, attnd_log_level level) {
    char ts[32];
    timestamp(ts);
    if (conf.json)
        attnd_sb_printf(b, "{\"ts\":\"%s\",\"level\":\"%s\"", ts, level_word(level));
    else
        attnd_sb_printf(b, "%s %s ", ts, level_word(level));
}

static void line_end(attnd_sbuf *b, attnd_log_level level) {
    if (conf.json) attnd_sb_putc(b, '}');
    attnd_sb_putc(b, '\n');
    if (b->oom) return;
    FILE *f = level == LOG_ERROR ? stderr : stdout;
    fwrite(b->p, 1, b->len, f);
    fflush(f);
}

void attnd_log(attnd_log_level level, const char *fmt, ...) {
    if ((int)level < conf.min) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    attnd_sbuf b;
    attnd_sb_init(&b);
    line_start(&b, level);
    if (conf.json) {
        attnd_sb_puts(&b, ",\"msg\":");
        attnd_sb_json_str(&b, msg);
    } else {
        attnd_sb_puts(&b, msg);
    }
    line_end(&b, level);
    attnd_sb_free(&b);
}

void attnd_log_access(const attnd_access *a) {
    if (!conf.access || (int)LOG_INFO < conf.min) return;
    attnd_sbuf b;
    attnd_sb_init(&b);
    line_start(&b, LOG_INFO);
    if (conf.json) {
        attnd_sb_puts(&b, ",\"msg\":\"access\",\"method\":");
        attnd_sb_json_str(&b, a->method);
        attnd_sb_puts(&b, ",\"path\":");
        attnd_sb_json_str(&b, a->path);
        attnd_sb_printf(&b,
                        ",\"status\":%d,\"bytes\":%zu,\"ms\":%.3f,\"batch\":%d,\"id\":", a->status,
                        a->bytes, a->ms, a->batch);
        attnd_sb_json_str(&b, a->id);
        if (a->trace_id && a->span_id)
            attnd_sb_printf(&b, ",\"trace_id\":\"%s\",\"span_id\":\"%s\"", a->trace_id, a->span_id);
        attnd_sb_puts(&b, ",\"end\":");
        attnd_sb_json_str(&b, a->end);
    } else {
        attnd_sb_printf(&b, "method=%s path=%s status=%d bytes=%zu ms=%.3f batch=%d id=%s",
                        a->method, a->path, a->status, a->bytes, a->ms, a->batch, a->id);
        if (a->trace_id && a->span_id)
            attnd_sb_printf(&b, " trace_id=%s span_id=%s", a->trace_id, a->span_id);
        attnd_sb_printf(&b, " end=%s", a->end);
    }
    line_end(&b, LOG_INFO);
    attnd_sb_free(&b);
}
