/* hints.h - what the register-tile kernels tell the compiler and the CPU,
 * beyond their arithmetic: neither changes a bit of any result.
 */
#ifndef ATTN_KERNELS_HINTS_H
#define ATTN_KERNELS_HINTS_H

#include <stddef.h>

/* Hides v's value from the compiler, so that an accumulator gets its own
 * register from the start. Given an array of accumulators that all start
 * at zero, GCC 12 gives them one register, then keeps them apart by copying
 * each around every instruction that sums into it: in the int8 kernel's
 * 12-row loop (VPDPBUSD, whose sum is its destination) 66 copies and 7
 * spills for 24 products, 70 instructions where 40 do. */
#define ATTN_OWN_REGISTER(v) __asm__("" : "+v"(v))

/* At step s of the loop over K that starts a block of MR rows of C (two
 * panels of 16 columns when two), a hint to fetch one of its rows' lines
 * for writing, one row every fourth step. Their misses then overlap the
 * products rather than stall the stores at the block's end: a store that
 * misses reads its line first (8 GB/s written so on the machine measured,
 * 23.5 with streaming stores), and on outputs larger than L2 the int8
 * kernel spent about half its time on them (docs/performance.md, "Writing
 * the outputs"). The caller's target must include prfchw, or the hint is a
 * fetch for reading. */
static inline __attribute__((always_inline)) void attn_prefetch_out(float *C, size_t ldc, int s,
                                                                    int MR, int two) {
    if ((s & 3) || s >= 4 * MR) return;
    __builtin_prefetch(C + (size_t)(s >> 2) * ldc, 1, 3);
    if (two) __builtin_prefetch(C + (size_t)(s >> 2) * ldc + 16, 1, 3);
}

#endif
