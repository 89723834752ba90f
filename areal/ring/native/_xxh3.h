/* areal/_xxh3.h: XXH3-64 (seed 0, default secret) with SIMD kernels that can copy as they hash.

Included once, by areal/_ringcopy.c (the ring's C extension; its header comment has the API).
Written from the public specification (Cyan4973/xxHash doc/xxhash_spec.md), not from the
reference source. Besides ``xxh3(p, n)`` it exposes the long-input pieces (``long_init``,
``long_block``, ``long_finish``) and each kernel's ``copy_stripes`` so that a caller can copy a
record and hash it in one pass, block by block. ``kernel`` is the selected kernel (scalar, avx2,
avx512); the extension's ``use()`` changes it. Little-endian hosts only.
*/
#ifndef AREAL_XXH3_H
#define AREAL_XXH3_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "areal._ringcopy assumes a little-endian host"
#endif

typedef uint64_t u64;
typedef uint32_t u32;
typedef uint8_t u8;

#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define PMX_1 0x165667919E3779F9ULL
#define PMX_2 0x9FB21C651E98DF25ULL

#define SECRET_LEN 192
#define STRIPE 64
#define STRIPES_PER_BLOCK ((SECRET_LEN - STRIPE) / 8) /* 16 */
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)             /* 1024 bytes */

static const u8 SECRET[SECRET_LEN] __attribute__((aligned(64))) = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline u64 rd64(const u8 *p) { u64 v; memcpy(&v, p, 8); return v; }
static inline u32 rd32(const u8 *p) { u32 v; memcpy(&v, p, 4); return v; }
static inline u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }

static inline u64 mul128_fold(u64 a, u64 b) {
    __uint128_t m = (__uint128_t)a * b;
    return (u64)m ^ (u64)(m >> 64);
}

static inline u64 avalanche(u64 x) {
    x ^= x >> 37;
    x *= PMX_1;
    return x ^ (x >> 32);
}

static inline u64 avalanche_xxh64(u64 x) {
    x ^= x >> 33;
    x *= P64_2;
    x ^= x >> 29;
    x *= P64_3;
    return x ^ (x >> 32);
}

/* ---- inputs of 0-240 bytes (spec: small and medium inputs; seed 0) ---- */

static u64 hash_0to16(const u8 *p, size_t n) {
    if (n > 8) {
        u64 lo = (rd64(SECRET + 24) ^ rd64(SECRET + 32)) ^ rd64(p);
        u64 hi = (rd64(SECRET + 40) ^ rd64(SECRET + 48)) ^ rd64(p + n - 8);
        return avalanche(n + __builtin_bswap64(lo) + hi + mul128_fold(lo, hi));
    }
    if (n >= 4) {
        u64 combined = (u64)rd32(p + n - 4) | ((u64)rd32(p) << 32);
        u64 v = (rd64(SECRET + 8) ^ rd64(SECRET + 16)) ^ combined;  /* modified seed is 0 */
        v ^= rotl64(v, 49) ^ rotl64(v, 24);
        v *= PMX_2;
        v ^= (v >> 35) + n;
        v *= PMX_2;
        return v ^ (v >> 28);
    }
    if (n > 0) {
        u32 combined = (u32)p[n - 1] | ((u32)n << 8) | ((u32)p[0] << 16) | ((u32)p[n >> 1] << 24);
        return avalanche_xxh64((u64)(rd32(SECRET) ^ rd32(SECRET + 4)) ^ (u64)combined);
    }
    return avalanche_xxh64(rd64(SECRET + 56) ^ rd64(SECRET + 64));
}

static inline u64 mix16(const u8 *p, const u8 *s) {
    return mul128_fold(rd64(p) ^ rd64(s), rd64(p + 8) ^ rd64(s + 8));
}

static u64 hash_17to240(const u8 *p, size_t n) {
    u64 acc = n * P64_1;
    if (n <= 128) {
        for (ptrdiff_t i = (ptrdiff_t)((n - 1) >> 5); i >= 0; i--) {
            acc += mix16(p + i * 16, SECRET + i * 32);
            acc += mix16(p + n - i * 16 - 16, SECRET + i * 32 + 16);
        }
        return avalanche(acc);
    }
    size_t chunks = n >> 4;
    for (size_t i = 0; i < 8; i++) acc += mix16(p + i * 16, SECRET + i * 16);
    acc = avalanche(acc);
    for (size_t i = 8; i < chunks; i++) acc += mix16(p + i * 16, SECRET + (i - 8) * 16 + 3);
    acc += mix16(p + n - 16, SECRET + 119);
    return avalanche(acc);
}

/* ---- inputs over 240 bytes: 8 accumulators, 1 KiB blocks of 16 stripes ---- */

typedef void (*stripes_fn)(u64 *acc, const u8 *p, size_t stripes, const u8 *secret);
typedef void (*scramble_fn)(u64 *acc, const u8 *secret);
/* Copy ``stripes`` stripes from src to dst and accumulate them from the registers they were
   loaded into: one pass, so the hash's ALU work overlaps the stores' cache misses. */
typedef void (*copy_stripes_fn)(u64 *acc, u8 *dst, const u8 *src, size_t stripes, const u8 *secret);

/* accumulate(stripe, secret) of the spec, for ``stripes`` consecutive stripes with the secret
   advancing 8 bytes per stripe. */
static void stripes_scalar(u64 *acc, const u8 *p, size_t stripes, const u8 *secret) {
    for (size_t s = 0; s < stripes; s++, p += STRIPE, secret += 8) {
        for (int i = 0; i < 8; i++) {
            u64 d = rd64(p + 8 * i), v = d ^ rd64(secret + 8 * i);
            acc[i ^ 1] += d;
            acc[i] += (v & 0xFFFFFFFFULL) * (v >> 32);
        }
    }
}

static void scramble_scalar(u64 *acc, const u8 *secret) {
    for (int i = 0; i < 8; i++) {
        u64 a = acc[i];
        a ^= a >> 47;
        a ^= rd64(secret + 8 * i);
        acc[i] = a * P32_1;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1

/* One stripe (d0, d1: its two halves) into the accumulators a0, a1 (acc[0..3], acc[4..7]). */
__attribute__((target("avx2"))) static inline void accumulate_avx2(__m256i *a0, __m256i *a1, __m256i d0, __m256i d1,
                                                                   const u8 *secret) {
    __m256i v0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)secret));
    __m256i v1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(secret + 32)));
    /* low 32 bits times high 32 bits of each lane */
    __m256i m0 = _mm256_mul_epu32(v0, _mm256_srli_epi64(v0, 32));
    __m256i m1 = _mm256_mul_epu32(v1, _mm256_srli_epi64(v1, 32));
    /* acc[i ^ 1] += d[i]: swap the two u64 of each 128-bit half */
    *a0 = _mm256_add_epi64(*a0, _mm256_add_epi64(m0, _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))));
    *a1 = _mm256_add_epi64(*a1, _mm256_add_epi64(m1, _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))));
}

__attribute__((target("avx2"))) static void stripes_avx2(u64 *acc, const u8 *p, size_t stripes,
                                                         const u8 *secret) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    for (size_t s = 0; s < stripes; s++, p += STRIPE, secret += 8)
        accumulate_avx2(&a0, &a1, _mm256_loadu_si256((const __m256i *)p),
                        _mm256_loadu_si256((const __m256i *)(p + 32)), secret);
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}

__attribute__((target("avx2"))) static void scramble_avx2(u64 *acc, const u8 *secret) {
    const __m256i prime = _mm256_set1_epi32((int)P32_1);
    for (int h = 0; h < 2; h++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(acc + 4 * h));
        a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(secret + 32 * h)));
        /* 64-bit times 32-bit prime: low product + (high product << 32) */
        __m256i lo = _mm256_mul_epu32(a, prime);
        __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
        _mm256_storeu_si256((__m256i *)(acc + 4 * h), _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32)));
    }
}

__attribute__((target("avx2"))) static void copy_stripes_avx2(u64 *acc, u8 *dst, const u8 *src, size_t stripes,
                                                              const u8 *secret) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    for (size_t s = 0; s < stripes; s++, src += STRIPE, dst += STRIPE, secret += 8) {
        __m256i d0 = _mm256_loadu_si256((const __m256i *)src);
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(src + 32));
        _mm256_storeu_si256((__m256i *)dst, d0);
        _mm256_storeu_si256((__m256i *)(dst + 32), d1);
        accumulate_avx2(&a0, &a1, d0, d1, secret);
    }
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}

__attribute__((target("avx512f"))) static void stripes_avx512(u64 *acc, const u8 *p, size_t stripes,
                                                              const u8 *secret) {
    __m512i a = _mm512_loadu_si512((const void *)acc);
    for (size_t s = 0; s < stripes; s++, p += STRIPE, secret += 8) {
        __m512i d = _mm512_loadu_si512((const void *)p);
        __m512i v = _mm512_xor_si512(d, _mm512_loadu_si512((const void *)secret));
        __m512i m = _mm512_mul_epu32(v, _mm512_srli_epi64(v, 32));
        a = _mm512_add_epi64(a, _mm512_add_epi64(m, _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2))));
    }
    _mm512_storeu_si512((void *)acc, a);
}

__attribute__((target("avx512f"))) static void scramble_avx512(u64 *acc, const u8 *secret) {
    const __m512i prime = _mm512_set1_epi32((int)P32_1);
    __m512i a = _mm512_loadu_si512((const void *)acc);
    a = _mm512_xor_si512(a, _mm512_srli_epi64(a, 47));
    a = _mm512_xor_si512(a, _mm512_loadu_si512((const void *)secret));
    __m512i lo = _mm512_mul_epu32(a, prime);
    __m512i hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
    _mm512_storeu_si512((void *)acc, _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32)));
}
__attribute__((target("avx512f"))) static void copy_stripes_avx512(u64 *acc, u8 *dst, const u8 *src,
                                                                   size_t stripes, const u8 *secret) {
    __m512i a = _mm512_loadu_si512((const void *)acc);
    for (size_t s = 0; s < stripes; s++, src += STRIPE, dst += STRIPE, secret += 8) {
        __m512i d = _mm512_loadu_si512((const void *)src);
        _mm512_storeu_si512((void *)dst, d);
        __m512i v = _mm512_xor_si512(d, _mm512_loadu_si512((const void *)secret));
        __m512i m = _mm512_mul_epu32(v, _mm512_srli_epi64(v, 32));
        a = _mm512_add_epi64(a, _mm512_add_epi64(m, _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2))));
    }
    _mm512_storeu_si512((void *)acc, a);
}
#endif

typedef struct {
    const char *name;
    stripes_fn stripes;
    scramble_fn scramble;
    copy_stripes_fn copy_stripes; /* NULL: memcpy, then hash from the destination */
} Kernel;

static const Kernel KERNELS[] = {
    {"scalar", stripes_scalar, scramble_scalar, NULL},
#ifdef HAVE_X86
    {"avx2", stripes_avx2, scramble_avx2, copy_stripes_avx2},
    {"avx512", stripes_avx512, scramble_avx512, copy_stripes_avx512},
#endif
};
#define N_KERNELS (sizeof(KERNELS) / sizeof(KERNELS[0]))

static int kernel_supported(size_t k) {
#ifdef HAVE_X86
    if (strcmp(KERNELS[k].name, "avx2") == 0) return __builtin_cpu_supports("avx2");
    if (strcmp(KERNELS[k].name, "avx512") == 0) return __builtin_cpu_supports("avx512f");
#endif
    return k == 0;
}

static const Kernel *kernel = &KERNELS[0];

static inline void long_init(u64 *acc) {
    acc[0] = P32_3; acc[1] = P64_1; acc[2] = P64_2; acc[3] = P64_3;
    acc[4] = P64_4; acc[5] = P32_2; acc[6] = P64_5; acc[7] = P32_1;
}

/* One full block that is not the input's last (the spec's round: 16 stripes, then scramble). */
static inline void long_block(u64 *acc, const u8 *block) {
    kernel->stripes(acc, block, STRIPES_PER_BLOCK, SECRET);
    kernel->scramble(acc, SECRET + SECRET_LEN - STRIPE);
}

/* Everything after the first ``blocks_done`` blocks (which must be all but the last block's
   worth): the remaining full blocks, the last block's stripes, the last 64 bytes, the merge. */
static u64 long_finish(u64 *acc, const u8 *p, size_t n, size_t blocks_done) {
    size_t blocks = (n - 1) / BLOCK;
    for (size_t b = blocks_done; b < blocks; b++) long_block(acc, p + b * BLOCK);
    size_t tail = n - blocks * BLOCK; /* 1..BLOCK */
    kernel->stripes(acc, p + blocks * BLOCK, (tail - 1) / STRIPE, SECRET);
    kernel->stripes(acc, p + n - STRIPE, 1, SECRET + SECRET_LEN - STRIPE - 7);
    u64 r = n * P64_1;
    for (int i = 0; i < 4; i++)
        r += mul128_fold(acc[2 * i] ^ rd64(SECRET + 11 + 16 * i), acc[2 * i + 1] ^ rd64(SECRET + 19 + 16 * i));
    return avalanche(r);
}

static u64 xxh3(const u8 *p, size_t n) {
    if (n <= 16) return hash_0to16(p, n);
    if (n <= 240) return hash_17to240(p, n);
    u64 acc[8] __attribute__((aligned(64)));
    long_init(acc);
    return long_finish(acc, p, n, 0);
}


#endif /* AREAL_XXH3_H */
