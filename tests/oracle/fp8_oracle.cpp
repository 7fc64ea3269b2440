// kvdrift: holds kernels/cpu/fp8.c bit for bit to CUDA 13's own host-side
// conversions from cuda_fp8.h / cuda_bf16.h, compiled here with g++.
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fp8.h"

static uint32_t f2u(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
static float u2f(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

static long checked = 0, failed = 0;

static void fail(const char *what, float x, unsigned got, unsigned want) {
    if (failed++ < 20)
        std::fprintf(stderr, "MISMATCH %s x=%a (0x%08x): kvd=0x%x cuda=0x%x\n", what, x, f2u(x),
                     got, want);
}

static unsigned cuda_enc(float x, int sat, __nv_fp8_interpretation_t fmt) {
    return __nv_cvt_float_to_fp8(x, sat ? __NV_SATFINITE : __NV_NOSAT, fmt);
}

static void check_encode(float x) {
    for (int sat = 0; sat <= 1; sat++) {
        unsigned a = kvd_f32_to_e4m3(x, sat), b = cuda_enc(x, sat, __NV_E4M3);
        if (a != b) fail(sat ? "e4m3 satfinite" : "e4m3 nosat", x, a, b);
        a = kvd_f32_to_e5m2(x, sat);
        b = cuda_enc(x, sat, __NV_E5M2);
        if (a != b) fail(sat ? "e5m2 satfinite" : "e5m2 nosat", x, a, b);
        checked += 2;
    }
    __nv_bfloat16 h = __float2bfloat16_rn(x);
    unsigned want;
    std::memcpy(&want, &h, 2);
    want &= 0xffffu;
    unsigned got = kvd_f32_to_bf16(x);
    if (got != want) fail("bf16", x, got, want);
    unsigned e2 = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    got = kvd_f32_to_e2m1(x);
    if (got != e2) fail("e2m1", x, got, e2);
    checked += 2;
}

// NVFP4 rows (fp8.h's rule) built from CUDA's own conversions: the group's
// E4M3 block scale, then each value's E2M1 code, two to a byte, low first.
static void check_nvfp4(const std::vector<float> &xs, float scale) {
    const size_t n = xs.size() / 16 * 16;
    std::vector<uint8_t> got(kvd_nvfp4_row_bytes(n)), want(got.size());
    kvd_quant_nvfp4(xs.data(), got.data(), n, scale, nullptr);
    for (size_t g = 0; g < n / 16; g++) {
        float a = 0.0f;
        for (int i = 0; i < 16; i++) a = std::fmax(a, std::fabs(xs[g * 16 + i]));
        unsigned sf = cuda_enc((a / 6.0f) / scale, 1, __NV_E4M3);
        __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)sf, __NV_E4M3);
        float d = __half2float(__half(hr)) * scale;
        want[n / 2 + g] = (uint8_t)sf;
        for (int i = 0; i < 16; i += 2) {
            float2 y;
            y.x = d > 0.0f ? xs[g * 16 + i] / d : xs[g * 16 + i] * 0.0f;
            y.y = d > 0.0f ? xs[g * 16 + i + 1] / d : xs[g * 16 + i + 1] * 0.0f;
            want[(g * 16 + i) / 2] =
                (uint8_t)__nv_cvt_float2_to_fp4x2(y, __NV_E2M1, cudaRoundNearest);
        }
    }
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != want[i])
            fail(i < n / 2 ? "nvfp4 codes" : "nvfp4 block scale", scale, got[i], want[i]);
    checked += (long)got.size();
}

static void check_vector(const std::vector<float> &xs) {
    // The vector codecs must agree with the scalar ones (scale 1).
    size_t n = xs.size();
    std::vector<uint8_t> q(n);
    std::vector<uint16_t> h(n);
    for (int sat = 0; sat <= 1; sat++) {
        kvd_quant_e4m3(xs.data(), q.data(), n, 1.0f, sat, nullptr);
        for (size_t i = 0; i < n; i++)
            if (q[i] != cuda_enc(xs[i], sat, __NV_E4M3)) fail("vector e4m3", xs[i], q[i], 0);
        kvd_quant_e5m2(xs.data(), q.data(), n, 1.0f, sat, nullptr);
        for (size_t i = 0; i < n; i++)
            if (q[i] != cuda_enc(xs[i], sat, __NV_E5M2)) fail("vector e5m2", xs[i], q[i], 0);
        checked += 2 * (long)n;
    }
    kvd_quant_bf16(xs.data(), h.data(), n);
    for (size_t i = 0; i < n; i++)
        if (h[i] != kvd_f32_to_bf16(xs[i])) fail("vector bf16", xs[i], h[i], 0);
}

static bool same_float(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || f2u(a) == f2u(b);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64() {
    // splitmix64
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int main() {
    // 1. every code decodes to what CUDA decodes it to
    for (unsigned c = 0; c < 256; c++) {
        __half_raw r4 = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
        __half_raw r5 = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E5M2);
        float w4 = __half2float(__half(r4)), w5 = __half2float(__half(r5));
        if (!same_float(kvd_e4m3_to_f32((uint8_t)c), w4)) fail("e4m3 decode", w4, c, 0);
        if (!same_float(kvd_e5m2_to_f32((uint8_t)c), w5)) fail("e5m2 decode", w5, c, 0);
        checked += 2;
    }
    // the 4-bit checkpoints' scale and element formats
    for (unsigned c = 0; c < 256; c++) {
        float w = __bfloat162float(__nv_bfloat16(__nv_cvt_e8m0_to_bf16raw((__nv_fp8_storage_t)c)));
        if (!same_float(kvd_e8m0_to_f32((uint8_t)c), w)) fail("e8m0 decode", w, c, 0);
        checked++;
    }
    for (unsigned c = 0; c < 16; c++) {
        __half_raw r = __nv_cvt_fp4_to_halfraw((__nv_fp4_storage_t)c, __NV_E2M1);
        float w = __half2float(__half(r));
        if (!same_float(kvd_e2m1_to_f32((uint8_t)c), w)) fail("e2m1 decode", w, c, 0);
        checked++;
    }
    for (unsigned c = 0; c < 65536; c++) {
        __nv_bfloat16_raw r;
        r.x = (unsigned short)c;
        float w = __bfloat162float(__nv_bfloat16(r));
        if (!same_float(kvd_bf16_to_f32((uint16_t)c), w)) fail("bf16 decode", w, c, 0);
        checked++;
    }

    // 2. edge cases: zeros, infinities, NaNs, each format's maximum and the
    // overflow threshold around it, the subnormal range and its lower edge
    std::vector<float> edge = {0.0f,
                               -0.0f,
                               INFINITY,
                               -INFINITY,
                               NAN,
                               -NAN,
                               u2f(0x7f800001u),
                               u2f(0xffc00000u),
                               u2f(0x7fffffffu),
                               448.0f,
                               449.0f,
                               464.0f,
                               465.0f,
                               480.0f,
                               57344.0f,
                               61439.0f,
                               61440.0f,
                               65504.0f,
                               1e30f,
                               3.4028235e38f,
                               1e-45f,
                               1.17549435e-38f,
                               0x1p-6f,
                               0x1p-7f,
                               0x1p-9f,
                               0x1p-10f,
                               0x1.8p-10f,
                               0x1p-11f,
                               0x1p-14f,
                               0x1p-16f,
                               0x1p-17f,
                               0x1.8p-17f,
                               0x1p-18f,
                               0x1.fffffep-1f};
    // 3. every code's value, the midpoint between neighbours (ties), and
    // the floats one and two ulps either side of each
    for (unsigned c = 0; c < 127; c++) {
        float lo4 = kvd_e4m3_to_f32((uint8_t)c), hi4 = kvd_e4m3_to_f32((uint8_t)(c + 1));
        float lo5 = kvd_e5m2_to_f32((uint8_t)c), hi5 = kvd_e5m2_to_f32((uint8_t)(c + 1));
        float pts[4] = {lo4, 0.5f * (lo4 + hi4), lo5, 0.5f * (lo5 + hi5)};
        for (float p : pts) {
            if (!std::isfinite(p)) continue;
            for (int d = -2; d <= 2; d++) {
                float v = u2f(f2u(p) + (uint32_t)d);
                if (p == 0.0f && d < 0) continue;
                edge.push_back(v);
            }
        }
    }
    for (unsigned c = 0; c < 7; c++) { // E2M1's grid, its midpoints and their neighbours
        float lo = kvd_e2m1_to_f32((uint8_t)c), hi = kvd_e2m1_to_f32((uint8_t)(c + 1));
        for (float p : {lo, 0.5f * (lo + hi), 7.0f, 0.25f})
            for (int d = -2; d <= 2; d++)
                if (!(p == 0.0f && d < 0)) edge.push_back(u2f(f2u(p) + (uint32_t)d));
    }
    for (uint32_t c = 0; c < 65536; c++) { // bf16 ties: the half-way float above each code
        uint32_t base = c << 16;
        edge.push_back(u2f(base | 0x8000u));
        edge.push_back(u2f(base | 0x7fffu));
        edge.push_back(u2f(base | 0x8001u));
    }
    size_t nedge = edge.size();
    for (size_t i = 0; i < nedge; i++) edge.push_back(-edge[i]);
    for (float x : edge) check_encode(x);
    check_vector(edge);

    // 4. random floats: 8M uniform bit patterns (every exponent, NaN and Inf
    // included) and 8M with exponents inside and around the FP8 ranges
    std::vector<float> rnd;
    rnd.reserve(1 << 20);
    for (int round = 0; round < 16; round++) {
        rnd.clear();
        for (int i = 0; i < (1 << 20); i++) {
            uint64_t r = next_u64();
            uint32_t bits = (uint32_t)r;
            if (round & 1) { // exponent in [-30, 20] around E4M3/E5M2
                uint32_t e = (uint32_t)(127 - 30 + (r >> 32) % 51);
                bits = (bits & 0x807fffffu) | (e << 23);
            }
            rnd.push_back(u2f(bits));
        }
        for (float x : rnd) check_encode(x);
        check_vector(rnd);
        if (round & 1) { // finite values only: NVFP4 rows of the same draws
            std::vector<float> fin;
            for (float x : rnd)
                if (std::isfinite(x) && std::fabs(x) < 1e6f) fin.push_back(x);
            for (float scale : {1.0f, 0.0123f, 7.5f}) check_nvfp4(fin, scale);
        }
    }
    // groups whose largest value lands the block scale in E4M3's subnormals,
    // at zero, and past 448 (saturated)
    for (float a : {0.0f, 1e-3f, 5e-3f, 0.006f, 0.0585f, 0.1f, 3000.0f, 1e5f}) {
        std::vector<float> g;
        for (int i = 0; i < 64; i++) g.push_back(a * (float)((i * 37) % 17 - 8) / 8.0f);
        check_nvfp4(g, 1.0f);
        check_nvfp4(g, 0.01f);
    }

    std::printf("fp8 oracle: %ld conversions checked against cuda_fp8.h/cuda_fp4.h/cuda_bf16.h, "
                "%ld mismatches\n",
                checked, failed);
    return failed ? 1 : 0;
}
