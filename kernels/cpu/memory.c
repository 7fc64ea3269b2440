/* kvdrift: large buffers (KV cache pools) on 2 MiB pages where the kernel
 * allows it: a paged cache scatters a sequence's blocks over the pool, and
 * with 4 KiB pages every block jump is a TLB miss. */
#include "../kernels.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_ALIGN ((size_t)2 << 20)

void *kvd_alloc_pool(size_t bytes) {
    void *p = NULL;
    size_t n = (bytes + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN;
    if (n == 0 || posix_memalign(&p, HUGE_ALIGN, n) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP it is plain memory */
#endif
    memset(p, 0, n);
    return p;
}

void kvd_free_pool(void *p) {
    free(p);
}
