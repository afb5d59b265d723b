/* splitmix.h - splitmix64, the one small PRNG of attnd: the embedded
 * default model draws its weights from it (default_model.c), and anything
 * else that needs well-mixed 64-bit values from a counter may call it.
 * Not for secrets.
 */
#ifndef ATTND_CONFIG_SPLITMIX_H
#define ATTND_CONFIG_SPLITMIX_H

#include <stdint.h>

/* One splitmix64 step: advances *state by the golden-ratio increment and
 * returns the next 64 random bits. The output of a state s is a bijective
 * hash of s + 0x9E3779B97F4A7C15, so `uint64_t s = x; attnd_splitmix64(&s)`
 * also hashes x. */
uint64_t attnd_splitmix64(uint64_t *state);

#endif
