/* httperr.c - libmicrohttpd's own error answers, given attnd's form.
 *
 * Some requests never reach attnd's handler: libmicrohttpd refuses them
 * while it reads the request line, the header lines or a chunked body (a
 * request line or header block over its memory limit, a line that is not
 * HTTP, an unsupported version, a bad chunk size, a Content-Length that is
 * not a number). It answers those itself with a small HTML page, and in
 * 0.9.75 the Content-Length refusals even go out with two status lines.
 * Its API has no option to supply these pages, so attnd catches them where
 * they are made: libmicrohttpd builds each one with
 * MHD_create_response_from_buffer() and queues it with MHD_queue_response(),
 * both exported functions that it calls through the dynamic linker, and an
 * executable's definition of an exported function comes first in symbol
 * lookup. The two definitions below hand every call to the library's own
 * (found with dlsym(RTLD_NEXT)); only a page libmicrohttpd made for an error
 * is replaced: the answer written to the socket is attnd's
 * {"error": "..."} with the same status, and libmicrohttpd is told the
 * queueing failed, which makes it close the connection as it does after any
 * such error. attnd itself never answers with HTML, so a persistent buffer
 * that starts with "<html>" can only be one of those pages.
 * tests/blackbox/test_abuse.py sends every such request and checks the
 * answers; docs/api.md lists them.
 */
#include <dlfcn.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "../base/buffer.h"
#include "../base/clock.h"
#include "../base/reply.h"

typedef struct MHD_Response *(*create_fn)(size_t, void *, enum MHD_ResponseMemoryMode);
typedef enum MHD_Result (*queue_fn)(struct MHD_Connection *, unsigned int, struct MHD_Response *);

static create_fn real_create;
static queue_fn real_queue;
static pthread_once_t resolved = PTHREAD_ONCE_INIT;
static uint64_t id_seed;
static atomic_ullong id_next;

/* The page libmicrohttpd is building on this thread, and what it means. */
static _Thread_local struct MHD_Response *page;
static _Thread_local const char *page_msg;

static void resolve(void) {
    real_create = (create_fn)dlsym(RTLD_NEXT, "MHD_create_response_from_buffer");
    real_queue = (queue_fn)dlsym(RTLD_NEXT, "MHD_queue_response");
    if (getrandom(&id_seed, sizeof(id_seed), 0) != (ssize_t)sizeof(id_seed))
        id_seed = attnd_mono_us();
}

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
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
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

/* Writes the JSON answer straight to the socket (a new request's first
 * bytes: the send buffer is empty) and reads what the client already sent,
 * so that closing does not reset the connection under the answer. */
static void answer_directly(struct MHD_Connection *c, unsigned int status, const char *msg) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    int fd = ci->connect_fd;
    size_t blen = 0;
    char *body = attnd_error_body(msg, &blen);
    if (!body) return;
    const char *reason = MHD_get_reason_phrase_for(status);
    char head[512];
    int hlen =
        snprintf(head, sizeof(head),
                 "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\nCache-Control: no-store\r\nX-Request-Id: %016llx\r\n"
                 "Server-Timing: queue;dur=0.000, compute;dur=0.000, total;dur=0.000\r\n\r\n",
                 status, reason && *reason ? reason : "Error", blen,
                 (unsigned long long)(id_seed ^ atomic_fetch_add(&id_next, 1)));
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_put(&b, head, (size_t)hlen);
    attnd_sb_put(&b, body, blen);
    free(body);
    if (!b.oom) (void)send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    attnd_sb_free(&b);
    char sink[16384];
    for (int i = 0; i < 64 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
        ;
    shutdown(fd, SHUT_WR);
}

enum MHD_Result MHD_queue_response(struct MHD_Connection *c, unsigned int status,
                                   struct MHD_Response *r) {
    pthread_once(&resolved, resolve);
    if (r && r == page) {
        page = NULL;
        const char *msg = status == 414   ? "the request line is longer than attnd accepts"
                          : status == 431 ? "the header lines are larger than attnd accepts"
                                          : page_msg;
        answer_directly(c, status, msg);
        return MHD_NO; /* libmicrohttpd closes the connection */
    }
    return real_queue(c, status, r);
}
