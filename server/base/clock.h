/* clock.h - the monotonic clock the server times requests, deadlines and
 * batches with.
 */
#ifndef ATTND_CLOCK_H
#define ATTND_CLOCK_H

#include <stdint.h>

/* Microseconds of CLOCK_MONOTONIC. */
uint64_t attnd_mono_us(void);

#endif
