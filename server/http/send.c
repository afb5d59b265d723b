/* send.c - the one function every answer leaves through (send_answer): its
 * status, the headers status.c lists for it, and its body, handed to
 * libmicrohttpd (attnd_http_send), or written straight to the socket for
 * the refusals libmicrohttpd makes itself before any route (the last
 * section says how). Also the one maker of request ids.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "../../config/splitmix.h"
#include "../base/clock.h"
#include "hreq.h"
#include "status.h"

typedef struct MHD_Response *(*create_fn)(size_t, void *, enum MHD_ResponseMemoryMode);
typedef enum MHD_Result (*queue_fn)(struct MHD_Connection *, unsigned int, struct MHD_Response *);

static create_fn real_create;
static queue_fn real_queue;
static pthread_once_t resolved = PTHREAD_ONCE_INIT;
static uint64_t id_seed;
static atomic_ullong id_next;

static void resolve(void) {
    real_create = (create_fn)dlsym(RTLD_NEXT, "MHD_create_response_from_buffer");
    real_queue = (queue_fn)dlsym(RTLD_NEXT, "MHD_queue_response");
    if (getrandom(&id_seed, sizeof(id_seed), 0) != (ssize_t)sizeof(id_seed))
        id_seed = attnd_mono_us();
}

/* ---- request ids ---- */

/* An id to echo: 1 to 128 visible ASCII characters but the quote and the
 * backslash (UUIDs, AWS's Root=...;Parent=..., base64, paths), so that it
 * goes into a header and a log line as it came, with nothing to escape. */
static int sane_id(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= ATTND_REQUEST_ID_MAX - 1) return 0;
        if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\') return 0;
    }
    return n > 0;
}

int attnd_http_request_id(const char *given, char out[ATTND_REQUEST_ID_MAX]) {
    if (given && sane_id(given)) {
        snprintf(out, ATTND_REQUEST_ID_MAX, "%s", given);
        return 1;
    }
    pthread_once(&resolved, resolve);
    uint64_t n = id_seed ^ atomic_fetch_add(&id_next, 1);
    snprintf(out, ATTND_REQUEST_ID_MAX, "%016llx", (unsigned long long)attnd_splitmix64(&n));
    return 0;
}

/* ---- the one road ---- */

/* Writes an answer straight to the socket of c (a new request's first
 * bytes: the send buffer is empty) and reads what the client already
 * sent, so that closing does not reset the connection under the answer. */
static void write_directly(struct MHD_Connection *c, int status, const attnd_header *hd, int nh,
                           const char *body, size_t len) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    int fd = ci->connect_fd;
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_printf(&b, "HTTP/1.1 %d %s\r\n", status, reason && *reason ? reason : "Error");
    for (int i = 0; i < nh; i++)
        attnd_sb_printf(&b, "%s: %s\r\n", hd[i].name, hd[i].value);
    attnd_sb_printf(&b, "Content-Length: %zu\r\n\r\n", len);
    attnd_sb_put(&b, body, len);
    if (!b.oom) (void)send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    attnd_sb_free(&b);
    char sink[16384];
    for (int i = 0; i < 64 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
        ;
    shutdown(fd, SHUT_WR);
}

/* Every answer: status, headers and body (len bytes; freed here unless
 * borrowed) onto c, queued with libmicrohttpd or, direct, written to the
 * socket (then MHD_NO: libmicrohttpd closes the connection). */
static enum MHD_Result send_answer(struct MHD_Connection *c, int direct, int status,
                                   const attnd_answer_meta *m, char *body, size_t len,
                                   int borrowed) {
    attnd_header hd[ATTND_HEADERS_MAX];
    int nh = attnd_answer_headers(m, hd);
    enum MHD_Result ret = MHD_NO;
    if (direct) {
        write_directly(c, status, hd, nh, body, len);
        goto cleanup;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, body, borrowed ? MHD_RESPMEM_PERSISTENT : MHD_RESPMEM_MUST_FREE);
    if (!resp) goto cleanup;
    borrowed = 1; /* the response owns the body now */
    for (int i = 0; i < nh; i++)
        MHD_add_response_header(resp, hd[i].name, hd[i].value);
    ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
cleanup:
    if (!borrowed) free(body);
    return ret;
}

/* The body's type: none for an empty body (204s, 304s),
 * JSON for a refusal, binary after JSON for v2 binary outputs, else what
 * the handler said (JSON unless it said otherwise). */
static const char *content_type(const hreq *h) {
    const attnd_reply *a = &h->r.reply;
    if (!a->len) return NULL;
    if (attnd_kind_is_error(a->kind)) return "application/json";
    if (a->json_len) return "application/octet-stream";
    return h->ctype ? h->ctype : "application/json";
}

/* What h's answer's headers say (status.h); tp is room for its
 * traceparent. */
static attnd_answer_meta meta_of(const hreq *h, char tp[ATTND_TRACEPARENT_LEN + 1]) {
    const attnd_reply *a = &h->r.reply;
    const attnd_req *r = &h->r;
    attnd_traceparent_format(&h->trace, tp);
    unsigned extra = attnd_kind_headers(a->kind);
    int preflight = (extra & ATTND_HDR_PREFLIGHT) != 0;
    int ok = a->kind == AOK || a->kind == AOK_CREATED;
    attnd_answer_meta m = {.extra = extra,
                           .ctype = content_type(h),
                           .request_id = h->id,
                           .traceparent = tp,
                           .cors = h->srv->cfg->n_cors_origins > 0,
                           .origin = h->origin,
                           .allow = h->rm.allow,
                           .retry_after = h->retry_after,
                           .json_len = a->kind == AOK ? a->json_len : 0,
                           .session_id = ok && r->step.id[0] ? r->step.id : NULL,
                           .ui = h->ui};
    if (preflight) return m; /* no times, and the connection stays */
    uint64_t now = attnd_mono_us();
    if (r->t_admit_us)
        m.queue_ms = (double)((r->t_start_us ? r->t_start_us : now) - r->t_admit_us) / 1e3;
    if (r->t_start_us) m.compute_ms = (double)(r->t_end_us - r->t_start_us) / 1e3;
    m.total_ms = (double)(now - h->t_recv_us) / 1e3;
    m.close = atomic_load(&h->srv->state) == S_DRAINING || h->refuse_now;
    return m;
}

enum MHD_Result attnd_http_send(hreq *h) {
    attnd_reply *a = &h->r.reply;
    int status = attnd_kind_status(a->kind), borrowed = a->borrowed;
    size_t len = a->len;
    char tp[ATTND_TRACEPARENT_LEN + 1];
    attnd_answer_meta m = meta_of(h, tp);
    char *body = attnd_reply_take(a);
    if (!body) return MHD_NO; /* out of memory writing it */
    enum MHD_Result ret = send_answer(h->conn, 0, status, &m, body, len, borrowed);
    h->status = status;
    h->sent = a->kind;
    h->sent_bytes = len;
    h->phase = P_SENT;
    return ret;
}

/* ---- libmicrohttpd's own refusals, in attnd's form ---- */

/* Some requests never reach attnd's handler,
 * refused while libmicrohttpd reads the request line, the header lines or
 * a chunked body (a request line or header block over its memory limit, a
 * line that is not HTTP, an unsupported version, a bad chunk size, a
 * Content-Length that is not a number). It answers those itself with a
 * small HTML page, and in 0.9.75 the Content-Length refusals even go out
 * with two status lines. Its API has no option to supply these pages, so
 * attnd catches them where they are made: libmicrohttpd builds each one
 * with MHD_create_response_from_buffer() and queues it with
 * MHD_queue_response(), both exported functions that it calls through the
 * dynamic linker, and an executable's definition of an exported function
 * comes first in symbol lookup. The two definitions below hand every call
 * to the library's own (found with dlsym(RTLD_NEXT)); only a page
 * libmicrohttpd made for an error is replaced: attnd's {"error": "..."}
 * with the same status goes out through send_answer, straight to the
 * socket, and libmicrohttpd is told the queueing failed, which makes it
 * close the connection as it does after any such error. attnd itself
 * never answers with HTML, so a persistent buffer that starts with
 * "<html>" can only be one of those pages. The connection's record (hconn)
 * keeps the answer, for the request's access line and count when it
 * closes (glue.c). tests/blackbox/test_abuse.py sends every such request
 * and checks the answers and lines; docs/api.md lists them.
 */

/* The page libmicrohttpd is building on this thread, and what it means. */
static _Thread_local struct MHD_Response *page;
static _Thread_local const char *page_msg;

/* The sentence for one of libmicrohttpd's pages (0.9.75's texts). */
static const char *page_sentence(const char *html, size_t n) {
    static const struct {
        const char *words, *msg;
    } map[] = {
        {"header was too big",
         "the request line or the header lines are larger than attnd accepts"},
        {"chunked encoding was syntactically", "the chunked body is malformed (a chunk size or "
                                               "separator is not valid)"},
        {"chunk size used", "a chunk of the chunked body is larger than attnd accepts"},
        {"too large value for <b>Content-Length", "Content-Length is too large"},
        {"wrong value for <b>Content-Length", "Content-Length must be a decimal number of bytes"},
        {"HTTP version", "this HTTP version is not supported: attnd speaks HTTP/1.0 and HTTP/1.1"},
        {"Host:", "an HTTP/1.1 request needs a Host header"},
        {"syntactically incorrect", "the request is not well-formed HTTP (its request line or a "
                                    "header line)"},
    };
    for (size_t i = 0; i < countof(map); i++)
        if (memmem(html, n, map[i].words, strlen(map[i].words))) return map[i].msg;
    return "the request is not well-formed HTTP";
}

struct MHD_Response *MHD_create_response_from_buffer(size_t size, void *buffer,
                                                     enum MHD_ResponseMemoryMode mode) {
    pthread_once(&resolved, resolve);
    struct MHD_Response *r = real_create(size, buffer, mode);
    /* only the response made last on this thread can be a page: one that
     * was never queued cannot be mistaken later for another at its address */
    page = NULL;
    if (r && mode == MHD_RESPMEM_PERSISTENT && size >= 6 && memcmp(buffer, "<html>", 6) == 0) {
        page = r;
        page_msg = page_sentence(buffer, size);
    }
    return r;
}

enum MHD_Result MHD_queue_response(struct MHD_Connection *c, unsigned int status,
                                   struct MHD_Response *r) {
    pthread_once(&resolved, resolve);
    if (!r || r != page) return real_queue(c, status, r);
    page = NULL;
    const char *msg = status == 414   ? "the request line is longer than attnd accepts"
                      : status == 431 ? "the header lines are larger than attnd accepts"
                                      : page_msg;
    /* the request's own id once its header lines were in (a bad chunk) */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hconn *hc = ci ? ci->socket_context : NULL;
    char id[ATTND_REQUEST_ID_MAX];
    attnd_http_request_id(hc ? hc->req_id : NULL, id);
    attnd_answer_meta m = {.ctype = "application/json", .request_id = id, .close = 1};
    size_t len = 0;
    char *body = attnd_error_body(msg, &len);
    if (body) send_answer(c, 1, (int)status, &m, body, len, 0);
    if (hc) { /* for its access line and count (glue.c) */
        hc->refused = (int)status;
        hc->refused_bytes = body ? len : 0;
        memcpy(hc->refused_id, id, sizeof(id));
    }
    return MHD_NO; /* libmicrohttpd closes the connection */
}
