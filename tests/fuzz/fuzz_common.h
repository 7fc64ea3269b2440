/* kvdrift fuzzing: every parser takes a path, so an input goes to a memfd
 * and the parser opens /proc/self/fd/N: the real open/mmap/read path. */
#ifndef KVD_FUZZ_COMMON_H
#define KVD_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static inline int fuzz_file(const uint8_t *data, size_t size, char *path, size_t n) {
    int fd = memfd_create("kvd-fuzz", 0);
    if (fd < 0) return -1;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return -1;
    }
    snprintf(path, n, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
