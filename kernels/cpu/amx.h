/* kvdrift: what the CPU kernels that use AMX-BF16 tiles share (attention.c,
 * linalg.c): whether this CPU and OS let the process use them, the tile
 * instructions, and the tiles' set-up. Included only where
 * KVD_AMX_X86 is defined (an x86-64 GCC or clang build). */
#ifndef KVD_CPU_AMX_H
#define KVD_CPU_AMX_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVD_AMX_X86 1

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* the AMX kernels' code: AVX-512 with VBMI (every CPU with AMX has it) and
 * BF16 for the conversions */
#define KVD_AMX_FN __attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi,avx512bf16")))

/* AMX-BF16 with its tiles' state enabled by the OS (XCR0 bits 17 and 18),
 * AVX512-BF16, and the tiles granted to this process (Linux asks for that
 * first: arch_prctl ARCH_REQ_XCOMP_PERM, which only a caller about to use
 * them should make). leaf1_ecx: CPUID leaf 1's ECX (OSXSAVE is bit 27). */
static inline int kvd_amx_usable(unsigned leaf1_ecx) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1) || !(d >> 24 & 1)) return 0;
    const unsigned max7 = a;
    if (max7 < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) return 0;
    if (!(leaf1_ecx >> 27 & 1)) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo >> 17 & 3) != 3) return 0;
#if defined(__linux__)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

/* the tile instructions, as asm with their memory made known to the
 * compiler (the intrinsics' asm does not say what it reads and writes) */
#define AMX_LOAD(t, p, stride)                                                                     \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(stride)) \
                     : "memory")
#define AMX_STORE(t, p, stride)                                                                    \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"((long)(stride))   \
                     : "memory")
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define AMX_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kvd_amx_config;

/* the tiles set up in this thread (every one 16 x 64 bytes), and given back */
static inline void kvd_amx_begin(void) {
    kvd_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = 16, c.colsb[i] = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
}
static inline void kvd_amx_end(void) {
    __asm__ volatile("tilerelease" ::: "memory");
}

/* the first n of 16 lanes (none for n <= 0, all for n >= 16): a row's
 * tail of n values from where a 16-lane load starts */
static inline __mmask16 kvd_lanes16(int n) {
    return (__mmask16)(n >= 16 ? 0xffffu : n > 0 ? (1u << n) - 1 : 0u);
}

/* 16 floats as BF16 widened back, exactly */
KVD_AMX_FN static inline __m512 kvd_bf16_widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 32 floats (x0: 0-15, x1: 16-31) split into three rows of 32 BF16,
 * out[0], out[1], out[2]: hi, mid and lo, each the rounding of what the ones
 * before left (the float exactly, a denormal rest aside). An infinity's
 * rest is 0, not inf - inf. */
KVD_AMX_FN static inline void kvd_split3(__m512 x0, __m512 x1, uint16_t *const out[3]) {
    const __mmask16 f0 = (__mmask16)~_mm512_fpclass_ps_mask(x0, 0x18),
                    f1 = (__mmask16)~_mm512_fpclass_ps_mask(x1, 0x18);
    for (int k = 0; k < 3; k++) {
        const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        _mm512_storeu_si512(out[k], h);
        x0 = _mm512_maskz_sub_ps(f0, x0, kvd_bf16_widen(_mm512_castsi512_si256(h)));
        x1 = _mm512_maskz_sub_ps(f1, x1, kvd_bf16_widen(_mm512_extracti64x4_epi64(h, 1)));
    }
}

#endif
#endif
