// kvdrift: the simulator's tensor-core product, kernels/cuda/mma.cuh's
// portable body compiled on its own. The sanitizer build compiles this file
// without AddressSanitizer (tests/CMakeLists.txt): the body reads the lanes'
// registers and the warp gather's table, no memory of a kernel's, and its
// checks there cost more time than every kernel's own accesses.
#include "mma.cuh"

namespace kvd_simt {

void mma_m16n8k16(float c[4], const unsigned a[4], const unsigned b[2], bool f16) {
    if (f16)
        kvd_mma::mma_portable<true>(c, a, b);
    else
        kvd_mma::mma_portable<false>(c, a, b);
}

} // namespace kvd_simt
