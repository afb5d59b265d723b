/* ui.c - the viewer's files, embedded from server/ui/ with .incbin (as
 * openapi.c embeds openapi.json), and the headers they are answered with.
 * See ui.h; the page itself is described in docs/ui.md.
 */
#include "ui.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Embeds a file as the bytes sym[] .. sym_end[] in read-only data. */
#define UI_EMBED(sym, path)                                                                        \
    __asm__(".section .rodata\n"                                                                   \
            ".global " #sym "\n"                                                                   \
            ".hidden " #sym "\n"                                                                   \
            ".balign 16\n" #sym ":\n"                                                              \
            ".incbin \"" path "\"\n"                                                               \
            ".global " #sym "_end\n"                                                               \
            ".hidden " #sym "_end\n" #sym "_end:\n"                                                \
            ".byte 0\n"                                                                            \
            ".previous\n");                                                                        \
    extern const char sym[], sym##_end[]

UI_EMBED(attnd_ui_index_html, "server/ui/index.html");
UI_EMBED(attnd_ui_app_js, "server/ui/app.js");
UI_EMBED(attnd_ui_style_css, "server/ui/style.css");

/* Every file may be cached, and is checked with its ETag before each use
 * (no-cache), so a new binary's page is seen at once. The policy lets the
 * page load its own script and style and call its own origin, and nothing
 * else: no inline script, no other host, no plugin, no framing. Its icon is
 * a data: image, so that no request for /favicon.ico is made. */
#define UI_CSP                                                                                     \
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "               \
    "form-action 'none'; frame-ancestors 'none'"

// clang-format off
static const char *const HEADERS[][2] = {
    {"Cache-Control",           "no-cache"},
    {"Content-Security-Policy", UI_CSP},
    {"X-Content-Type-Options",  "nosniff"},
    {"Referrer-Policy",         "no-referrer"},
    {"Cross-Origin-Opener-Policy", "same-origin"},
};
// clang-format on
#define N_HEADERS (int)(sizeof HEADERS / sizeof HEADERS[0])

static attnd_ui_file files[] = {
    {"", "text/html; charset=utf-8", attnd_ui_index_html, 0, ""},
    {"app.js", "text/javascript; charset=utf-8", attnd_ui_app_js, 0, ""},
    {"style.css", "text/css; charset=utf-8", attnd_ui_style_css, 0, ""},
};
#define N_FILES (int)(sizeof files / sizeof files[0])

static pthread_once_t measured = PTHREAD_ONCE_INIT;

/* Each file's length and ETag (FNV-1a 64 of its bytes), once. */
static void measure(void) {
    const char *ends[N_FILES] = {attnd_ui_index_html_end, attnd_ui_app_js_end,
                                 attnd_ui_style_css_end};
    for (int i = 0; i < N_FILES; i++) {
        files[i].len = (size_t)(ends[i] - files[i].data);
        uint64_t h = 1469598103934665603ULL;
        for (size_t k = 0; k < files[i].len; k++)
            h = (h ^ (unsigned char)files[i].data[k]) * 1099511628211ULL;
        snprintf(files[i].etag, sizeof files[i].etag, "\"%016llx\"", (unsigned long long)h);
    }
}

const attnd_ui_file *attnd_ui_find(const char *name) {
    pthread_once(&measured, measure);
    for (int i = 0; i < N_FILES; i++)
        if (strcmp(files[i].name, name) == 0) return &files[i];
    return NULL;
}

int attnd_ui_fresh(const attnd_ui_file *f, const char *if_none_match) {
    if (!if_none_match) return 0;
    const char *s = if_none_match + strspn(if_none_match, " \t");
    if (s[0] == '*' && s[1 + strspn(s + 1, " \t")] == '\0') return 1;
    /* a list of quoted tags, weak (W/"...") or not: the quotes delimit ours */
    return strstr(s, f->etag) != NULL;
}

int attnd_ui_header(const attnd_ui_file *f, int i, const char **name, const char **value) {
    if (i < 0 || i > N_HEADERS) return 0;
    if (i == N_HEADERS) {
        *name = "ETag";
        *value = f->etag;
    } else {
        *name = HEADERS[i][0];
        *value = HEADERS[i][1];
    }
    return 1;
}
