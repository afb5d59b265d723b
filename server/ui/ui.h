/* ui.h - the attention viewer (GET /ui, SPEC section 9, docs/ui.md): the
 * page, its script and its style sheet, plain files in server/ui/ embedded
 * in the binary at build time, and what each is answered with besides its
 * bytes: its Content-Type, an ETag, and the caching and security headers
 * (a Content-Security-Policy that lets the page load and call nothing but
 * its own origin). The files hold no data; the page asks the API for it.
 * Nothing here knows libmicrohttpd: server/http/handlers.c answers the two
 * routes.
 */
#ifndef ATTND_UI_H
#define ATTND_UI_H

#include <stddef.h>

typedef struct {
    const char *name; /* "" for the page itself (GET /ui), else its name under /ui/ */
    const char *type; /* Content-Type */
    const char *data; /* the file's bytes, in the binary's read-only data */
    size_t len;       /* bytes of data */
    char etag[24];    /* "\"<16 hex digits>\"": a hash of the bytes, set on first lookup */
} attnd_ui_file;

/* The file GET /ui/<name> answers ("" for GET /ui itself), or NULL when
 * there is none. Thread-safe; the result lives as long as the process. */
const attnd_ui_file *attnd_ui_find(const char *name);

/* 1 when an If-None-Match header value (NULL: none) names f's ETag or is
 * "*": the client's copy is current and the answer is 304 with no body. */
int attnd_ui_fresh(const attnd_ui_file *f, const char *if_none_match);

/* The i-th header (from 0) that an answer of f carries besides Content-Type:
 * Cache-Control, ETag, Content-Security-Policy and the other browser
 * protections. Sets *name and *value and returns 1, or returns 0 past the
 * last one. */
int attnd_ui_header(const attnd_ui_file *f, int i, const char **name, const char **value);

#endif
