/* grpc_load.c - the load generator of make bench-grpc, on gRPC's C core
 * (as the daemon) and plain sockets: one thread, one completion queue, so
 * that the client's own CPU a request is as small on gRPC as wrk's on
 * HTTP and the two protocols are compared on the daemon's cost, not on
 * their load generators' (ghz, in Go, spent 8x wrk's CPU a request on the
 * same two cores).
 *
 *   grpc_load unary  PORT MSG -c CALLS -n CONNS -d SECONDS [-w WARMUP]
 *       ModelInfer with the serialized ModelInferRequest in file MSG,
 *       CALLS in flight over CONNS channels for SECONDS after WARMUP;
 *   grpc_load stream PORT MSG -s STEPS [-p WINDOW]
 *       STEPS messages on one ModelStreamInfer stream, at most WINDOW sent
 *       and not yet answered: 1 (the default) sends each once the answer
 *       to the last has come (a decode loop that needs it), more sends
 *       them as they come (the stream keeps their order);
 *   grpc_load http   PORT PATH BODY -s STEPS
 *       STEPS POSTs of the JSON in file BODY to PATH on one kept-alive
 *       HTTP/1.1 connection, one after the other.
 *
 * Prints one line: RESULT <per second> <median ms> <ok> <errors>. Every
 * answer is checked: gRPC status OK, a stream message without
 * error_message, HTTP 200. Bench infrastructure only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CALLS 1024
#define MAX_SAMPLES (1 << 22)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "grpc_load: %s\n", what);
    exit(2);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open a message file");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) die("cannot read a message file");
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* Latencies (ms) of the measured answers; the median is printed. */
static double *samples;
static long n_samples;

static void sample(double ms) {
    if (n_samples < MAX_SAMPLES) samples[n_samples++] = ms;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(void) {
    if (!n_samples) return 0;
    qsort(samples, (size_t)n_samples, sizeof *samples, by_value);
    return samples[n_samples / 2];
}

/* ---- gRPC ---- */

typedef struct {
    grpc_call *call;
    grpc_metadata_array md_in, md_trail;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice details;
    double t0;
} one_call;

static grpc_byte_buffer *message(const char *p, size_t n) {
    grpc_slice s = grpc_slice_from_copied_buffer(p, n);
    grpc_byte_buffer *b = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return b;
}

static grpc_channel *channel(int port, int i) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    /* a distinct argument per channel, so that each has its own connection */
    grpc_arg a = {.type = GRPC_ARG_INTEGER, .key = "attnd.bench.channel", .value.integer = i};
    grpc_channel_args args = {1, &a};
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, cr, &args);
    grpc_channel_credentials_release(cr);
    return ch;
}

static void call_start(one_call *c, grpc_channel *ch, grpc_completion_queue *cq, const char *msg,
                       size_t len) {
    static const char *method = "/inference.GRPCInferenceService/ModelInfer";
    grpc_slice m = grpc_slice_from_static_string(method);
    c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_metadata_array_init(&c->md_in);
    grpc_metadata_array_init(&c->md_trail);
    c->send = message(msg, len);
    c->recv = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_in;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->md_trail;
    ops[5].data.recv_status_on_client.status = &c->status;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    c->t0 = now_s();
    if (grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK) die("start_batch");
}

/* The call is over: 1 when it answered OK with a message. */
static int call_end(one_call *c) {
    int ok = c->status == GRPC_STATUS_OK && c->recv != NULL;
    if (!ok && c->status != GRPC_STATUS_OK) {
        char *d = grpc_slice_to_c_string(c->details);
        fprintf(stderr, "grpc_load: status %d: %s\n", (int)c->status, d);
        gpr_free(d);
    }
    grpc_metadata_array_destroy(&c->md_in);
    grpc_metadata_array_destroy(&c->md_trail);
    grpc_byte_buffer_destroy(c->send);
    if (c->recv) grpc_byte_buffer_destroy(c->recv);
    grpc_slice_unref(c->details);
    grpc_call_unref(c->call);
    return ok;
}

static void unary(int port, const char *msg, size_t len, int calls, int conns, double seconds,
                  double warmup) {
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_channel *ch[64];
    if (conns < 1 || conns > 64 || calls < 1 || calls > MAX_CALLS) die("-c 1..1024, -n 1..64");
    for (int i = 0; i < conns; i++)
        ch[i] = channel(port, i);
    static one_call c[MAX_CALLS];
    for (int i = 0; i < calls; i++)
        call_start(&c[i], ch[i % conns], cq, msg, len);
    double t_begin = now_s(), t_measure = t_begin + warmup, t_end = t_measure + seconds;
    long ok = 0, errors = 0;
    int in_flight = calls;
    while (in_flight) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) die("completion queue");
        one_call *k = ev.tag;
        double t = now_s();
        int good = ev.success && call_end(k);
        if (k->t0 >= t_measure && t <= t_end) {
            ok += good;
            errors += !good;
            if (good) sample((t - k->t0) * 1e3);
        }
        if (t < t_end)
            call_start(k, ch[(k - c) % conns], cq, msg, len);
        else
            in_flight--;
    }
    printf("RESULT %.1f %.3f %ld %ld\n", (double)ok / seconds, median(), ok, errors);
    for (int i = 0; i < conns; i++)
        grpc_channel_destroy(ch[i]);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

/* Runs ops on the stream and waits for them (nothing else is in flight). */
static int stream_ops(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n) {
    if (grpc_call_start_batch(call, ops, n, call, NULL) != GRPC_CALL_OK) die("start_batch");
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* One message op of the stream in flight: a send or a receive. */
typedef struct {
    grpc_byte_buffer *buf;
    int busy;
} stream_op;

static void stream_send(grpc_call *call, stream_op *s, const char *msg, size_t len) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    s->buf = message(msg, len);
    s->busy = 1;
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = s->buf;
    if (grpc_call_start_batch(call, &op, 1, s, NULL) != GRPC_CALL_OK) die("start_batch");
}

static void stream_recv(grpc_call *call, stream_op *r) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    r->buf = NULL;
    r->busy = 1;
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &r->buf;
    if (grpc_call_start_batch(call, &op, 1, r, NULL) != GRPC_CALL_OK) die("start_batch");
}

/* 1 when a stream answer carries an infer_response (field 2), not an
 * error_message (field 1): the first byte of the message. */
static int stream_answer_ok(grpc_byte_buffer *b) {
    if (!b) return 0;
    grpc_slice s = grpc_slice_buffer_take_first(&b->data.raw.slice_buffer);
    int good = GRPC_SLICE_LENGTH(s) > 0 && GRPC_SLICE_START_PTR(s)[0] == 0x12;
    grpc_slice_unref(s);
    return good;
}

/* STEPS messages on one stream, at most WINDOW of them sent and not yet
 * answered: 1 is a decode loop that waits for each answer; more is a
 * client that sends its steps as they come (tritonclient's
 * async_stream_infer), the stream keeping them in order. */
static void stream(int port, const char *msg, size_t len, long steps, int window) {
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_channel *ch = channel(port, 0);
    grpc_slice m =
        grpc_slice_from_static_string("/inference.GRPCInferenceService/ModelStreamInfer");
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_metadata_array md_in, md_trail;
    grpc_metadata_array_init(&md_in);
    grpc_metadata_array_init(&md_trail);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &md_in;
    if (window < 1) die("-p: at least 1");
    double *sent_at = malloc((size_t)steps * sizeof *sent_at);
    if (!sent_at) die("out of memory");
    if (grpc_call_start_batch(call, ops, 2, NULL, NULL) != GRPC_CALL_OK) die("start_batch");
    stream_op snd = {0}, rcv = {0};
    long sent = 0, answered = 0, ok = 0, errors = 0;
    double t_begin = now_s();
    stream_send(call, &snd, msg, len);
    sent_at[sent++] = now_s();
    stream_recv(call, &rcv);
    int opened = 0;
    while (answered < steps) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) die("completion queue");
        if (ev.tag == NULL) { /* the initial metadata both ways */
            if (!ev.success) die("the stream did not open");
            opened = 1;
        } else if (ev.tag == &snd) {
            snd.busy = 0;
            grpc_byte_buffer_destroy(snd.buf);
            if (!ev.success) die("a step could not be sent");
        } else {
            rcv.busy = 0;
            int good = ev.success && stream_answer_ok(rcv.buf);
            if (answered == 0 && !good) die("the first stream answer was an error (try grpcurl)");
            if (rcv.buf) grpc_byte_buffer_destroy(rcv.buf);
            if (!ev.success) die("the stream ended before its last answer");
            sample((now_s() - sent_at[answered]) * 1e3);
            answered++;
            ok += good;
            errors += !good;
            if (answered < steps) stream_recv(call, &rcv);
        }
        if (!snd.busy && sent < steps && sent - answered < window) {
            stream_send(call, &snd, msg, len);
            sent_at[sent++] = now_s();
        }
    }
    double t = now_s() - t_begin;
    if (!opened) { /* its completion may come after the last answer's */
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || ev.tag != NULL) die("completion queue");
    }
    grpc_status_code status;
    grpc_slice details;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[1].data.recv_status_on_client.trailing_metadata = &md_trail;
    ops[1].data.recv_status_on_client.status = &status;
    ops[1].data.recv_status_on_client.status_details = &details;
    stream_ops(call, cq, ops, 2);
    if (status != GRPC_STATUS_OK) errors++;
    printf("RESULT %.1f %.3f %ld %ld\n", (double)ok / t, median(), ok, errors);
    free(sent_at);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md_in);
    grpc_metadata_array_destroy(&md_trail);
    grpc_call_unref(call);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

/* ---- HTTP/1.1 ---- */

static size_t read_some(int fd, char *buf, size_t have, size_t cap) {
    if (have == cap) die("an HTTP answer larger than the buffer");
    ssize_t n = read(fd, buf + have, cap - have);
    if (n <= 0) die("the HTTP connection closed");
    return have + (size_t)n;
}

/* Reads one answer (Content-Length or chunked) from fd; returns its status.
 * buf holds what was read beyond the answer for the next one (none: one
 * request at a time). */
static int http_answer(int fd, char *buf, size_t cap) {
    size_t have = 0;
    char *end;
    while (!(end = memmem(buf, have, "\r\n\r\n", 4)))
        have = read_some(fd, buf, have, cap);
    int status = atoi(buf + 9);
    size_t head = (size_t)(end + 4 - buf);
    char *cl = memmem(buf, head, "Content-Length:", 15);
    if (!cl) cl = memmem(buf, head, "content-length:", 15);
    if (cl) {
        size_t want = head + strtoul(cl + 15, NULL, 10);
        while (have < want)
            have = read_some(fd, buf, have, cap);
        return status;
    }
    /* chunked: read until the last chunk's "0\r\n\r\n" */
    while (have < head + 5 || memcmp(buf + have - 5, "0\r\n\r\n", 5) != 0)
        have = read_some(fd, buf, have, cap);
    return status;
}

static void http_steps(int port, const char *path, const char *body, size_t len, long steps) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("cannot connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t cap = 64 << 20;
    char *buf = malloc(cap), head[512];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      path, len);
    char *req = malloc((size_t)hn + len);
    memcpy(req, head, (size_t)hn);
    memcpy(req + hn, body, len);
    long ok = 0, errors = 0;
    double t_begin = now_s();
    for (long i = 0; i < steps; i++) {
        double t0 = now_s();
        size_t off = 0;
        while (off < (size_t)hn + len) {
            ssize_t n = write(fd, req + off, (size_t)hn + len - off);
            if (n <= 0) die("write");
            off += (size_t)n;
        }
        int status = http_answer(fd, buf, cap);
        if (i == 0 && status != 200) die("the first HTTP answer was not 200 (run it with curl)");
        sample((now_s() - t0) * 1e3);
        ok += status == 200;
        errors += status != 200;
    }
    printf("RESULT %.1f %.3f %ld %ld\n", (double)ok / (now_s() - t_begin), median(), ok, errors);
    close(fd);
    free(buf);
    free(req);
}

static void usage(void) {
    die("usage: grpc_load unary PORT MSG -c CALLS -n CONNS -d SECONDS [-w WARMUP]\n"
        "       grpc_load stream PORT MSG -s STEPS [-p WINDOW]\n"
        "       grpc_load http PORT PATH BODY -s STEPS");
}

int main(int argc, char **argv) {
    if (argc < 4) usage();
    const char *mode = argv[1];
    int port = atoi(argv[2]), calls = 64, conns = 8, first_opt = strcmp(mode, "http") ? 4 : 5;
    double seconds = 10, warmup = 2;
    long steps = 300;
    int window = 1;
    if (argc < first_opt) usage();
    for (int i = first_opt; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-c") == 0)
            calls = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-n") == 0)
            conns = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-d") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "-w") == 0)
            warmup = atof(argv[i + 1]);
        else if (strcmp(argv[i], "-s") == 0)
            steps = atol(argv[i + 1]);
        else if (strcmp(argv[i], "-p") == 0)
            window = atoi(argv[i + 1]);
        else
            usage();
    }
    samples = malloc(MAX_SAMPLES * sizeof *samples);
    size_t len;
    if (strcmp(mode, "http") == 0) {
        char *body = read_file(argv[4], &len);
        http_steps(port, argv[3], body, len, steps);
        return 0;
    }
    char *msg = read_file(argv[3], &len);
    grpc_init();
    if (strcmp(mode, "unary") == 0)
        unary(port, msg, len, calls, conns, seconds, warmup);
    else if (strcmp(mode, "stream") == 0)
        stream(port, msg, len, steps, window);
    else
        usage();
    grpc_shutdown();
    return 0;
}
