/* test_server_guard.c - the connection guard on socket pairs: whole-phase
 * header and body deadlines that a trickle does not move, the linger
 * deadline of a refused body (the shorter of its own and the body's), no deadline while
 * a request is busy, and eviction of the connection that has waited
 * longest when a new one would take a reserved slot. */
#include <check.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../server/http/guard.h"
#include "check_run.h"

/* 1 when the server side of the pair was shut down: the client end reads
 * EOF within ms milliseconds. */
static int shut_within(int client, int ms) {
    struct pollfd p = {client, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return 0;
    char c;
    return recv(client, &c, 1, MSG_DONTWAIT) == 0;
}

START_TEST(test_header_deadline_is_whole_phase) {
    char err[128];
    attnd_guard *g = attnd_guard_new(64, 300, 5000, 3000, err, sizeof(err));
    ck_assert_ptr_nonnull(g);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    guard_conn *c = attnd_guard_open(g, sv[0]);
    ck_assert_ptr_nonnull(c);
    /* a byte every 50 ms does not move the deadline */
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(send(sv[1], "x", 1, 0), 1);
        usleep(50000);
    }
    ck_assert_ptr_null(attnd_guard_cut(g, c));
    ck_assert_int_eq(shut_within(sv[1], 2000), 1);
    ck_assert_str_eq(attnd_guard_cut(g, c), "header_timeout");
    attnd_guard_close(g, c);
    close(sv[0]);
    close(sv[1]);
    attnd_guard_free(g);
}
END_TEST

START_TEST(test_body_deadline_and_busy) {
    char err[128];
    attnd_guard *g = attnd_guard_new(64, 5000, 200, 3000, err, sizeof(err));
    int a[2], b[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    guard_conn *ca = attnd_guard_open(g, a[0]);
    guard_conn *cb = attnd_guard_open(g, b[0]);
    attnd_guard_phase(g, ca, GUARD_BODY);
    attnd_guard_phase(g, cb, GUARD_BODY);
    attnd_guard_phase(g, cb, GUARD_BUSY); /* its whole request is in */
    ck_assert_int_eq(shut_within(a[1], 2000), 1);
    ck_assert_str_eq(attnd_guard_cut(g, ca), "body_timeout");
    ck_assert_int_eq(shut_within(b[1], 500), 0);
    ck_assert_ptr_null(attnd_guard_cut(g, cb));
    attnd_guard_close(g, ca);
    attnd_guard_close(g, cb);
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
    attnd_guard_free(g);
}
END_TEST

START_TEST(test_linger_deadline_is_the_shorter) {
    char err[128];
    /* linger 200 ms within a body deadline of 5 s; then linger 5 s within a
     * body deadline of 200 ms: a refused body gets no more than an accepted
     * one */
    for (int k = 0; k < 2; k++) {
        attnd_guard *g =
            attnd_guard_new(64, 60000, k ? 200 : 5000, k ? 5000 : 200, err, sizeof(err));
        ck_assert_ptr_nonnull(g);
        int sv[2];
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        guard_conn *c = attnd_guard_open(g, sv[0]);
        attnd_guard_phase(g, c, GUARD_LINGER);
        ck_assert_int_eq(shut_within(sv[1], 2000), 1);
        ck_assert_str_eq(attnd_guard_cut(g, c), "linger_timeout");
        attnd_guard_close(g, c);
        close(sv[0]);
        close(sv[1]);
        attnd_guard_free(g);
    }
}
END_TEST

START_TEST(test_eviction_takes_the_longest_waiting) {
    enum { MAX = 16, N = 15 }; /* the reserve of 16 slots is 1 */
    char err[128];
    attnd_guard *g = attnd_guard_new(MAX, 60000, 60000, 3000, err, sizeof(err));
    int sv[N + 1][2];
    guard_conn *c[N + 1];
    for (int i = 0; i <= N; i++) {
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        usleep(200); /* distinct start times */
        c[i] = attnd_guard_open(g, sv[i][0]);
        if (i == 0) {
            attnd_guard_phase(g, c[0], GUARD_BUSY); /* complete: never evicted */
        }
    }
    /* the 16th connection took the reserved slot: connection 1, the oldest
     * still waiting for its request, was shut down; 0 was busy */
    ck_assert_ptr_null(attnd_guard_cut(g, c[0]));
    ck_assert_str_eq(attnd_guard_cut(g, c[1]), "evicted");
    for (int i = 2; i <= N; i++)
        ck_assert_ptr_null(attnd_guard_cut(g, c[i]));
    ck_assert_int_eq(shut_within(sv[1][1], 1000), 1);
    for (int i = 0; i <= N; i++) {
        attnd_guard_close(g, c[i]);
        close(sv[i][0]);
        close(sv[i][1]);
    }
    attnd_guard_free(g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_guard");
    TCase *tc = tcase_create("guard");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_header_deadline_is_whole_phase);
    tcase_add_test(tc, test_body_deadline_and_busy);
    tcase_add_test(tc, test_linger_deadline_is_the_shorter);
    tcase_add_test(tc, test_eviction_takes_the_longest_waiting);
    suite_add_tcase(s, tc);
    return check_run(s);
}
