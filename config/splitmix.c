/* splitmix.c - splitmix64 with the constants of the reference splitmix64.c
 * (prng.di.unimi.it): a 64-bit state advanced by a fixed odd increment,
 * each output a mix of the new state.
 */
#include "splitmix.h"

uint64_t attnd_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
