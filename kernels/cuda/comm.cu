// kvdrift: tensor parallelism's one collective, the sum of a buffer over the
// ranks (one device each, one process), through NCCL. libnccl is opened at
// run time, so builds and one-rank runs need no NCCL at all.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_kernels.h"

namespace {
struct nccl_api {
    void *lib = nullptr;
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *) = nullptr;
    ncclResult_t (*destroy)(ncclComm_t) = nullptr;
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*group_start)() = nullptr;
    ncclResult_t (*group_end)() = nullptr;
    const char *(*error_string)(ncclResult_t) = nullptr;
};

bool load(nccl_api &a, char *err, int len) {
    if (a.lib) return true;
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    for (const char *n : names)
        if ((a.lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!a.lib) {
        std::snprintf(err, (size_t)len, "tensor parallelism needs NCCL: %s", dlerror());
        return false;
    }
    a.init_all = (decltype(a.init_all))dlsym(a.lib, "ncclCommInitAll");
    a.destroy = (decltype(a.destroy))dlsym(a.lib, "ncclCommDestroy");
    a.all_reduce = (decltype(a.all_reduce))dlsym(a.lib, "ncclAllReduce");
    a.group_start = (decltype(a.group_start))dlsym(a.lib, "ncclGroupStart");
    a.group_end = (decltype(a.group_end))dlsym(a.lib, "ncclGroupEnd");
    a.error_string = (decltype(a.error_string))dlsym(a.lib, "ncclGetErrorString");
    if (!a.init_all || !a.destroy || !a.all_reduce || !a.group_start || !a.group_end ||
        !a.error_string) {
        std::snprintf(err, (size_t)len, "tensor parallelism: libnccl lacks the collectives");
        dlclose(a.lib);
        a.lib = nullptr;
        return false;
    }
    return true;
}

nccl_api api;
} // namespace

struct kvd_comm {
    int n;
    ncclComm_t c[KVD_MAX_RANKS];
};

extern "C" int kvd_cuda_set_device(int dev) {
    return cudaSetDevice(dev) == cudaSuccess ? 0 : -1;
}

extern "C" kvd_comm *kvd_cuda_comm_new(int n, char *err, int len) {
    int have = 0;
    if (n < 1 || n > KVD_MAX_RANKS) {
        std::snprintf(err, (size_t)len, "--gpus: expected 1 to %d, got %d", KVD_MAX_RANKS, n);
        return nullptr;
    }
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < n) {
        std::snprintf(err, (size_t)len, "--gpus %d: %d CUDA devices visible", n, have);
        return nullptr;
    }
    kvd_comm *c = (kvd_comm *)std::calloc(1, sizeof *c);
    if (!c) return nullptr;
    c->n = n;
    if (n == 1) return c; // one rank: the sum is the buffer itself
    if (!load(api, err, len)) {
        std::free(c);
        return nullptr;
    }
    int devs[KVD_MAX_RANKS];
    for (int i = 0; i < n; i++) devs[i] = i;
    ncclResult_t r = api.init_all(c->c, n, devs);
    if (r != ncclSuccess) {
        std::snprintf(err, (size_t)len, "tensor parallelism: ncclCommInitAll: %s",
                      api.error_string(r));
        std::free(c);
        return nullptr;
    }
    return c;
}

extern "C" void kvd_cuda_comm_free(kvd_comm *c) {
    if (!c) return;
    for (int i = 0; i < c->n && c->n > 1; i++) api.destroy(c->c[i]);
    std::free(c);
}

extern "C" int kvd_cuda_allreduce_sum(kvd_comm *c, float *const *bufs, size_t count) {
    if (c->n == 1) return 0;
    ncclResult_t r = api.group_start();
    for (int i = 0; i < c->n && r == ncclSuccess; i++)
        r = api.all_reduce(bufs[i], bufs[i], count, ncclFloat32, ncclSum, c->c[i], 0);
    ncclResult_t e = api.group_end();
    return r == ncclSuccess && e == ncclSuccess ? 0 : -1;
}
