/* check_run.h - runs a Check suite and turns its failures into the test
 * binary's exit code (0: every test passed), for each tests/test_*.c main. */
#ifndef ATTND_TESTS_CHECK_RUN_H
#define ATTND_TESTS_CHECK_RUN_H

#include <check.h>

static inline int check_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
