/* test_rand.h - random inputs for the Check suites that draw them from one
 * 64-bit linear congruential stream (Knuth's MMIX constants): frand,
 * rand_floats, and xcalloc, which fails the test when memory runs out.
 * Each test binary has its own stream, seeded with TEST_RAND_SEED (0 unless
 * defined before this header). test_fp32_bits pins the bits of forwards
 * on these inputs: a change here changes its hashes. */
#ifndef ATTND_TESTS_TEST_RAND_H
#define ATTND_TESTS_TEST_RAND_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0
#endif

static uint64_t g_rng = TEST_RAND_SEED;

static inline float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) / 8388608.0) - 1.0f;
}

static inline void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    ck_assert_msg(p != NULL, "out of memory");
    return p;
}

static inline float *rand_floats(size_t n, float scale) {
    float *p = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

#endif
