/* mem.h - the one allocator of the core's large, long-lived buffers
 * (mem.c): packed weights and a context's scratch.
 */
#ifndef ATTN_PLATFORM_MEM_H
#define ATTN_PLATFORM_MEM_H

#include <stddef.h>

enum { ATTN_HUGE_MIN = 256u << 10 }; /* bytes from which a buffer gets huge pages */
/* A buffer for packed weights or scratch: 64-byte aligned, and from
 * ATTN_HUGE_MIN bytes 2 MiB aligned on huge pages (mem.c says why); free()
 * releases it. NULL when out of memory. */
void *attn_alloc_big(size_t bytes);
/* The bytes attn_alloc_big(bytes) takes: bytes rounded up to its alignment
 * (whole 2 MiB pages from ATTN_HUGE_MIN), which is what the process's
 * memory grows by once the buffer is touched. */
size_t attn_alloc_bytes(size_t bytes);

#endif
