/* clock.h - the monotonic clock the server times requests, deadlines,
 * batches and sessions with.
 */
#ifndef ATTND_CLOCK_H
#define ATTND_CLOCK_H

#include <stdint.h>

/* Microseconds of CLOCK_MONOTONIC. */
uint64_t attnd_mono_us(void);
/* The same in seconds: the session table's clock. */
double attnd_mono_s(void);

#endif
