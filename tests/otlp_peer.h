/* otlp_peer.h - what the OTLP tests need around the exporter: a free port
 * on 127.0.0.1, stderr captured to a file (the exporter logs there), and
 * a small HTTP peer in a thread that reads each POST whole (its body kept)
 * and then answers as told: at once with a status and a body, or not at
 * all until it is stopped (a collector that hangs), and the log captured. Test infrastructure
 * for tests/test_server_otlp*.c; the real collector is tests/otel/.
 */
#ifndef ATTND_TESTS_OTLP_PEER_H
#define ATTND_TESTS_OTLP_PEER_H

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Whether port (0: any) binds on 127.0.0.1 now; *got is the port bound. */
static inline int port_binds(int port, int *got) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (fd < 0) abort();
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &n) == 0;
    close(fd);
    *got = ntohs(a.sin_port);
    return ok;
}

/* A port nothing listens on right now, from below the kernel's ephemeral
 * range (as tests/ports.py: a port bind(0) gives may be any outgoing
 * connection's before the collector binds it); bind(0)'s if none is free. */
static inline int free_port(void) {
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() * 2654435761u;
    int got;
    for (int i = 0; i < 200; i++) {
        seed = seed * 1103515245u + 12345u;
        if (port_binds(20000 + (int)((seed >> 8) % 12000u), &got)) return got;
    }
    if (!port_binds(0, &got)) abort();
    return got;
}

/* The log's lines (attnd_log writes warnings and info to stdout) sent to a
 * file under /tmp from capture_start to capture_end. */
typedef struct {
    char path[64];
    int saved; /* the stdout to restore */
} captured;

/* The capture in progress: a failed check jumps past capture_end, and
 * capture_teardown (each suite's checked teardown) then gives stdout back,
 * or Check's own report would land in the file and the failure go unseen
 * (with CK_FORK=no, as make valgrind and make tsan run). */
static captured capture_open; /* a copy: the test's own is on its stack, gone by then */
static int capture_is_open;

static inline void capture_start(captured *c) {
    snprintf(c->path, sizeof c->path, "/tmp/attnd-otlp-log-XXXXXX");
    int fd = mkstemp(c->path);
    fflush(stdout);
    c->saved = dup(1);
    if (fd < 0 || c->saved < 0 || dup2(fd, 1) < 0) abort();
    close(fd);
    capture_open = *c;
    capture_is_open = 1;
}

static inline void capture_end(captured *c) {
    fflush(stdout);
    dup2(c->saved, 1);
    close(c->saved);
    capture_is_open = 0;
}

/* Checked teardown: ends a capture a failure left open, and prints what
 * the log held by then. */
static inline void capture_teardown(void) {
    if (!capture_is_open) return;
    captured *c = &capture_open;
    capture_end(c);
    FILE *f = fopen(c->path, "r");
    char line[4096];
    fprintf(stderr, "-- the log while the failed test ran (%s):\n", c->path);
    while (f && fgets(line, sizeof line, f))
        fputs(line, stderr);
    if (f) fclose(f);
}

/* Lines of the file at path that contain needle. */
static inline int count_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f) fclose(f);
    return n;
}

/* The value of attribute `key` in an OTLP JSON object's "attributes", or NULL. */
static inline json_t *json_attr(json_t *obj, const char *key) {
    json_t *a;
    size_t i;
    json_array_foreach(json_object_get(obj, "attributes"), i, a) {
        if (strcmp(json_string_value(json_object_get(a, "key")), key) == 0)
            return json_object_get(a, "value");
    }
    return NULL;
}

/* The spans of an ExportTraceServiceRequest's first resource and scope. */
static inline json_t *json_spans(json_t *request) {
    json_t *rs = json_array_get(json_object_get(request, "resourceSpans"), 0);
    return json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans");
}

typedef struct {
    int port;
    _Atomic int status;           /* the answer's status; 0: never answer (hang) */
    _Atomic(const char *) answer; /* the answer's body */
    int listen_fd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t got; /* a whole request was read */
    int requests;       /* whole requests read: under mu */
    char *last_body;    /* the latest request's body, NUL-ended: under mu */
    _Atomic int stop;
} otlp_peer;

/* Reads one request (head, then Content-Length bytes); -1 at EOF or stop. */
static int peer_read(otlp_peer *p, int c, char **body) {
    char buf[1 << 16] = "";
    size_t len = 0;
    long want = -1;
    for (;;) {
        char *end = want < 0 ? strstr(buf, "\r\n\r\n") : NULL;
        if (end) {
            char *cl = strcasestr(buf, "Content-Length:");
            size_t head = (size_t)(end + 4 - buf);
            want = (long)head + (cl ? atol(cl + 15) : 0);
        }
        if (want >= 0 && (long)len >= want) break;
        struct pollfd pf = {c, POLLIN, 0};
        if (p->stop || len >= sizeof buf - 1) return -1;
        if (poll(&pf, 1, 50) <= 0) continue;
        ssize_t got = read(c, buf + len, sizeof buf - 1 - len);
        if (got <= 0) return -1;
        len += (size_t)got;
        buf[len] = '\0';
    }
    *body = strdup(strstr(buf, "\r\n\r\n") + 4);
    return 0;
}

static void *peer_run(void *arg) {
    otlp_peer *p = arg;
    while (!p->stop) {
        struct pollfd pf = {p->listen_fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) continue;
        int c = accept(p->listen_fd, NULL, NULL);
        char *body;
        while (c >= 0 && peer_read(p, c, &body) == 0) {
            pthread_mutex_lock(&p->mu);
            free(p->last_body);
            p->last_body = body;
            p->requests++;
            pthread_cond_broadcast(&p->got);
            pthread_mutex_unlock(&p->mu);
            while (!p->status && !p->stop)
                usleep(10000); /* hang until stopped */
            if (p->stop) break;
            char head[256];
            const char *answer = p->answer;
            int n = snprintf(head, sizeof head,
                             "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                             "Content-Length: %zu\r\n\r\n",
                             (int)p->status, strlen(answer));
            if (write(c, head, (size_t)n) != n ||
                write(c, answer, strlen(answer)) != (ssize_t)strlen(answer))
                break;
        }
        if (c >= 0) close(c);
    }
    return NULL;
}

static inline void peer_start(otlp_peer *p, int status, const char *answer) {
    memset(p, 0, sizeof *p);
    p->status = status;
    p->answer = answer;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->got, NULL);
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(p->listen_fd, 16) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &n) != 0)
        abort();
    p->port = ntohs(a.sin_port);
    pthread_create(&p->thread, NULL, peer_run, p);
}

/* Waits until the peer has read `requests` whole requests. */
static inline void peer_wait(otlp_peer *p, int requests) {
    pthread_mutex_lock(&p->mu);
    while (p->requests < requests)
        pthread_cond_wait(&p->got, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static inline void peer_stop(otlp_peer *p) {
    p->stop = 1;
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
    free(p->last_body);
}

#endif
