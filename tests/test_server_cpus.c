/* test_server_cpus.c - Check suite for server/base/cpus.c: how many CPUs the
 * process may use and the thread counts that default from them.
 *
 *   parse     cpu.max and cfs quota/period texts to CPUs, rounded up;
 *   cgroup    fixture trees under tests/data/cgroup/ (a /proc/self/cgroup
 *             and the cgroup files it leads to): v2 with the limit on a
 *             parent, v2 in a cgroup namespace, v1 as Docker mounts it,
 *             nested v1 limits, no limit, hybrid v1 + v2, nothing at all;
 *   affinity  in a child process pinned to one CPU, the count is 1;
 *   resolve   auto thread counts, explicit ones, and the obsolete
 *             workers.blas_threads.
 * Run from the repository's root (make test-unit does).
 */
#include "../server/base/cpus.h"

#include "check_run.h"
#include <check.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FIXTURES "tests/data/cgroup/"

START_TEST(test_parse_v2) {
    ck_assert_int_eq(attnd_cgroup_v2_cpus("max 100000\n"), 0);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("max"), 0);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("400000 100000\n"), 4);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("150000 100000"), 2); /* --cpus 1.5: rounded up */
    ck_assert_int_eq(attnd_cgroup_v2_cpus("50000 100000"), 1);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("100000 100000"), 1);
    ck_assert_int_eq(attnd_cgroup_v2_cpus(""), -1);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("fast"), -1);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("100000"), -1);
    ck_assert_int_eq(attnd_cgroup_v2_cpus("0 100000"), -1);
}
END_TEST

START_TEST(test_parse_v1) {
    ck_assert_int_eq(attnd_cgroup_v1_cpus("-1\n", "100000\n"), 0);
    ck_assert_int_eq(attnd_cgroup_v1_cpus("400000\n", "100000\n"), 4);
    ck_assert_int_eq(attnd_cgroup_v1_cpus("250000", "100000"), 3);
    ck_assert_int_eq(attnd_cgroup_v1_cpus("20000", "100000"), 1);
    ck_assert_int_eq(attnd_cgroup_v1_cpus("x", "100000"), -1);
    ck_assert_int_eq(attnd_cgroup_v1_cpus("400000", "0"), -1);
}
END_TEST

static const struct {
    const char *dir;
    int want;
} CASES[] = {
    {"v2_parent_limit", 3}, /* the pod's 2.5 CPUs, the container itself unlimited */
    {"v2_namespace", 4},    /* "0::/": the container's own cgroup at the mount's root */
    {"v2_no_limit", 0},
    {"v1_docker", 2}, /* /docker/<id> is not under the mount: its root is the container's */
    {"v1_no_limit", 0},
    {"v1_nested", 2},      /* /a allows 2, /a/b 6: the tighter wins */
    {"hybrid", 3},         /* v1 cpu controller with a quota, v2 without */
    {"does_not_exist", 0}, /* nothing readable limits nothing */
};

START_TEST(test_cgroup_fixture) {
    char root[256];
    snprintf(root, sizeof root, FIXTURES "%s", CASES[_i].dir);
    int got = attnd_cgroup_quota_cpus(root);
    ck_assert_msg(got == CASES[_i].want, "%s: %d CPUs, expected %d", CASES[_i].dir, got,
                  CASES[_i].want);
}
END_TEST

/* Pinned to one CPU (as taskset -c 0 does), the process counts 1. */
START_TEST(test_affinity_one_cpu) {
    attnd_cpus all;
    attnd_cpus_count(&all);
    ck_assert_int_ge(all.n, 1);
    ck_assert_int_ge(all.affinity, all.n);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        sched_getaffinity(0, sizeof one, &one);
        int first = 0;
        while (first < CPU_SETSIZE && !CPU_ISSET(first, &one))
            first++;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(3);
        attnd_cpus c;
        attnd_cpus_count(&c);
        _exit(c.affinity == 1 && c.n == 1 ? 0 : 1);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pinned child counted more than one CPU");
}
END_TEST

START_TEST(test_resolve) {
    attnd_cpus cpus = {.n = 3, .affinity = 8, .quota = 3};
    char note[320];
    attnd_config c;
    ck_assert_int_eq(attnd_config_defaults(&c), 0);
    attnd_threads_resolve(&c, &cpus, note, sizeof note);
    ck_assert_int_eq(c.compute_threads, 3);
    ck_assert_int_eq(c.http_pollers, 3);
    ck_assert_int_eq(c.worker_threads, 0); /* the keys keep what was read: auto */
    ck_assert_int_eq(c.http_threads, 0);
    ck_assert_str_eq(note, "");
    attnd_config_free(&c);

    ck_assert_int_eq(attnd_config_defaults(&c), 0);
    c.worker_threads = 5;
    c.http_threads = 2;
    attnd_threads_resolve(&c, &cpus, note, sizeof note);
    ck_assert_int_eq(c.compute_threads, 5); /* explicit values stay */
    ck_assert_int_eq(c.http_pollers, 2);
    attnd_config_free(&c);

    ck_assert_int_eq(attnd_config_defaults(&c), 0); /* an old config's pair */
    c.worker_threads = 2;
    c.blas_threads = 4;
    attnd_threads_resolve(&c, &cpus, note, sizeof note);
    ck_assert_int_eq(c.compute_threads, 8);
    ck_assert_int_eq(c.worker_threads, 2);
    ck_assert_msg(strstr(note, "workers.blas_threads is obsolete") && strstr(note, "8 threads"),
                  "%s", note);
    attnd_config_free(&c);

    ck_assert_int_eq(attnd_config_defaults(&c), 0);
    c.blas_threads = 2; /* alone: workers.threads counts as 1 */
    attnd_threads_resolve(&c, &cpus, note, sizeof note);
    ck_assert_int_eq(c.compute_threads, 2);
    attnd_config_free(&c);

    attnd_cpus big = {.n = 200, .affinity = 200, .quota = 0};
    ck_assert_int_eq(attnd_config_defaults(&c), 0);
    attnd_threads_resolve(&c, &big, note, sizeof note);
    ck_assert_int_eq(c.compute_threads, 200);
    ck_assert_int_eq(c.http_pollers, 64); /* capped */
    attnd_config_free(&c);
}
END_TEST

static Suite *cpus_suite(void) {
    Suite *s = suite_create("cpus");
    TCase *t = tcase_create("cpus");
    tcase_add_test(t, test_parse_v2);
    tcase_add_test(t, test_parse_v1);
    tcase_add_loop_test(t, test_cgroup_fixture, 0, (int)(sizeof CASES / sizeof CASES[0]));
    tcase_add_test(t, test_affinity_one_cpu);
    tcase_add_test(t, test_resolve);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(cpus_suite());
}
