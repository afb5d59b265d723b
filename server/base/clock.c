/* clock.c - the monotonic clock the server times requests with (see
 * clock.h). */
#include "clock.h"

#include <time.h>

uint64_t attnd_mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

double attnd_mono_s(void) {
    return (double)attnd_mono_us() / 1e6;
}
