/* fuzz_check.h - the fuzz targets' assertion: a broken check prints what
 * failed and aborts, which libFuzzer reports as a finding. */
#ifndef ATTND_FUZZ_CHECK_H
#define ATTND_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
