// kvdrift: tensor parallelism's collective on the SIMT simulator: ranks are
// the simulated devices 0 .. n-1, and the sum goes over the ranks in order
// (as the CPU emulation does), after checking that each rank's buffer is
// memory of that rank's device.
#include <cstdio>
#include <cstdlib>

#include "simt.h"

#include "cuda_kernels.h"

struct kvd_comm {
    int n;
};

extern "C" int kvd_cuda_set_device(int dev) {
    return cudaSetDevice(dev) == cudaSuccess ? 0 : -1;
}

extern "C" kvd_comm *kvd_cuda_comm_new(int n, char *err, int len) {
    int have = 0;
    cudaGetDeviceCount(&have);
    if (n < 1 || n > have) {
        std::snprintf(err, (size_t)len, "--gpus %d: %d simulated devices", n, have);
        return nullptr;
    }
    kvd_comm *c = static_cast<kvd_comm *>(std::calloc(1, sizeof *c));
    if (c) c->n = n;
    return c;
}

extern "C" void kvd_cuda_comm_free(kvd_comm *c) {
    std::free(c);
}

extern "C" int kvd_cuda_allreduce_sum(kvd_comm *c, float *const *bufs, size_t count) {
    kvd_simt::land_copies(-1); // the ranks' streams' earlier copies
    int dev = 0;
    cudaGetDevice(&dev);
    for (int r = 0; r < c->n; r++) {
        cudaSetDevice(r);
        bool ok = kvd_simt::device_ptr(bufs[r]) && kvd_simt::device_ptr(bufs[r] + count - 1);
        cudaSetDevice(dev);
        if (!ok) {
            std::fprintf(stderr, "kvd_simt: allreduce: rank %d's buffer is not its device's\n", r);
            return -1;
        }
    }
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < c->n; r++) s += bufs[r][i];
        for (int r = 0; r < c->n; r++) bufs[r][i] = s;
    }
    return 0;
}
