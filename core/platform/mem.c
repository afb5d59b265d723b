/* mem.c - the one allocator of the core's large, long-lived buffers: packed
 * weights and a context's scratch. It does not know what they hold.
 *
 * A buffer of ATTN_HUGE_MIN bytes or more is 2 MiB aligned, its size rounded
 * up to whole 2 MiB pages, and advised to use transparent huge pages: on a
 * virtual machine an idle process's page-table entries are evicted by other
 * work, and the first forward after a pause then pays a page walk from
 * memory for every 4 KiB page it reads (docs/performance.md, "A lone
 * request after a pause", has the measurements). Smaller buffers are
 * 64-byte aligned.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "mem.h"

enum { HUGE_PAGE = 2u << 20 };

static size_t align_of(size_t bytes) {
    return bytes >= ATTN_HUGE_MIN ? HUGE_PAGE : 64;
}

size_t attn_alloc_bytes(size_t bytes) {
    size_t align = align_of(bytes);
    return (bytes ? bytes + align - 1 : align) / align * align;
}

void *attn_alloc_big(size_t bytes) {
    size_t align = align_of(bytes), size = attn_alloc_bytes(bytes);
    void *p = NULL;
    if (posix_memalign(&p, align, size) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == HUGE_PAGE) madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}
