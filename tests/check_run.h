/* check_run.h - runs a Check suite and turns its failures into the test
 * binary's exit code (0: every test passed), for each tests/test_*.c main.
 * A run in which no test ran fails too: CK_RUN_CASE or CK_RUN_SUITE (make
 * valgrind and make tsan pick cases by name) naming nothing of the suite,
 * say a case renamed, would otherwise pass having checked nothing. */
#ifndef ATTND_TESTS_CHECK_RUN_H
#define ATTND_TESTS_CHECK_RUN_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

static inline int check_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int ran = srunner_ntests_run(sr), failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (ran == 0) {
        const char *c = getenv("CK_RUN_CASE"), *su = getenv("CK_RUN_SUITE");
        fprintf(stderr, "no test ran: CK_RUN_CASE=%s CK_RUN_SUITE=%s name none of this suite's\n",
                c ? c : "(unset)", su ? su : "(unset)");
        return 1;
    }
    return failed ? 1 : 0;
}

#endif
