/* areal._ringcopy: the ring writer's copy + XXH3-64 digest in one pass, and the reader's digest.

Purpose: at 8k tokens a ring record is ~106 KB and the writer's budget is ~7 us. In Python the
copy (mmap.write per part) and the digest (the xxhash wheel, SSE2 only) are two passes over the
record; here each 1 KiB block is hashed right after it is copied, while it is still in L1, with
AVX2 (or AVX-512) where the CPU has it.

Functions (all hold the GIL: a few microseconds; releasing it could cost a 5 ms switch interval):
  copy_digest(dest, offset, parts, digest_from, nbytes) -> int | None
      Copy the concatenation of the buffers in ``parts`` (a list or tuple) to dest[offset:],
      zero-pad it to a multiple of 8 bytes, and return XXH3-64 (seed 0, default secret) of
      dest[digest_from : offset + padded]. Returns None, writing nothing, when the parts do not
      hold exactly ``nbytes`` bytes. ValueError if the range does not fit ``dest``; BufferError
      if a part is not C-contiguous or ``dest`` is not writable. Parts must not overlap dest.
  xxh3_64(buffer, start=0, stop=len) -> int
      XXH3-64 (seed 0, default secret) of buffer[start:stop]; equal to xxhash.xxh3_64_intdigest.
  implementations() -> list[str]     kernels this CPU can run ("scalar", "avx2", "avx512")
  use(name) -> str                    select a kernel (tests, benchmarks; None only reports);
                                      returns the previous one. The best one is chosen at import.

Invariants: the digest is bit-identical to XXH3-64 for every length and every kernel (tests
compare against the xxhash package over many lengths, offsets and alignments). Written from the
public specification (Cyan4973/xxHash doc/xxhash_spec.md), not from the reference source.
Little-endian hosts only (the ring itself is x86-only); a big-endian build fails to compile.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

__attribute__((target("avx2"))) static void stripes_avx2(u64 *acc, const u8 *p, size_t stripes,
                                                         const u8 *secret) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    for (size_t s = 0; s < stripes; s++, p += STRIPE, secret += 8) {
        __m256i d0 = _mm256_loadu_si256((const __m256i *)p);
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(p + 32));
        __m256i v0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)secret));
        __m256i v1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(secret + 32)));
        /* low 32 bits times high 32 bits of each lane */
        __m256i m0 = _mm256_mul_epu32(v0, _mm256_srli_epi64(v0, 32));
        __m256i m1 = _mm256_mul_epu32(v1, _mm256_srli_epi64(v1, 32));
        /* acc[i ^ 1] += d[i]: swap the two u64 of each 128-bit half */
        a0 = _mm256_add_epi64(a0, _mm256_add_epi64(m0, _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))));
        a1 = _mm256_add_epi64(a1, _mm256_add_epi64(m1, _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))));
    }
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
        __m256i v0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)secret));
        __m256i v1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(secret + 32)));
        __m256i m0 = _mm256_mul_epu32(v0, _mm256_srli_epi64(v0, 32));
        __m256i m1 = _mm256_mul_epu32(v1, _mm256_srli_epi64(v1, 32));
        a0 = _mm256_add_epi64(a0, _mm256_add_epi64(m0, _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))));
        a1 = _mm256_add_epi64(a1, _mm256_add_epi64(m1, _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))));
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

/* A read position in the list of parts (the payload), for copies that cross part boundaries. */
typedef struct {
    const u8 *const *src;
    const Py_ssize_t *len;
    Py_ssize_t count, i;
    size_t at; /* offset in part i */
} Cursor;

/* Copy the next ``k`` payload bytes to dst (the parts hold at least that many). */
static void cursor_copy(Cursor *c, u8 *dst, size_t k) {
    while (k) {
        size_t avail = (size_t)c->len[c->i] - c->at;
        if (avail == 0) {
            c->i++, c->at = 0;
            continue;
        }
        size_t m = k < avail ? k : avail;
        memcpy(dst, c->src[c->i] + c->at, m);
        dst += m, c->at += m, k -= m;
    }
}

/* The next ``k`` payload bytes as one contiguous source (consumed), or NULL if they span parts
   (nothing consumed). */
static const u8 *cursor_span(Cursor *c, size_t k) {
    while (c->i < c->count && c->at == (size_t)c->len[c->i]) c->i++, c->at = 0;
    if (c->i == c->count || (size_t)c->len[c->i] - c->at < k) return NULL;
    const u8 *p = c->src[c->i] + c->at;
    c->at += k;
    return p;
}

/* ---- Python bindings ---- */

static int get_index(PyObject *o, Py_ssize_t *out, const char *what) {
    Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s=%zd must be >= 0", what, v);
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *py_xxh3_64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "xxh3_64(buffer, start=0, stop=len)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t start = 0, stop = view.len;
    if ((nargs > 1 && get_index(args[1], &start, "start") < 0) ||
        (nargs > 2 && get_index(args[2], &stop, "stop") < 0)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start > stop || stop > view.len) {
        PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside a buffer of %zd bytes", start, stop, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    u64 h = xxh3((const u8 *)view.buf + start, (size_t)(stop - start));
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

#define STACK_PARTS 16

static PyObject *py_copy_digest(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "copy_digest(dest, offset, parts, digest_from, nbytes)");
        return NULL;
    }
    Py_ssize_t offset, digest_from, nbytes;
    if (get_index(args[1], &offset, "offset") < 0 || get_index(args[3], &digest_from, "digest_from") < 0 ||
        get_index(args[4], &nbytes, "nbytes") < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[2], "parts must be a list or tuple of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    /* Every part's buffer is acquired (bytes need none) before any byte is written. */
    Py_buffer stack_views[STACK_PARTS], *views = stack_views;
    const u8 *stack_src[STACK_PARTS], **src = stack_src;
    Py_ssize_t stack_len[STACK_PARTS], *len = stack_len;
    Py_buffer dest = {0};
    PyObject *result = NULL;
    Py_ssize_t held = 0, total = 0;
    if (count > STACK_PARTS) {
        views = PyMem_Malloc(count * sizeof(Py_buffer));
        src = PyMem_Malloc(count * sizeof(u8 *));
        len = PyMem_Malloc(count * sizeof(Py_ssize_t));
        if (views == NULL || src == NULL || len == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *o = items[i];
        if (PyBytes_CheckExact(o)) {
            src[i] = (const u8 *)PyBytes_AS_STRING(o);
            len[i] = PyBytes_GET_SIZE(o);
            views[i].obj = NULL;
        } else {
            if (PyObject_GetBuffer(o, &views[i], PyBUF_SIMPLE) < 0) goto done; /* not contiguous */
            src[i] = views[i].buf;
            len[i] = views[i].len;
        }
        held = i + 1;
        total += len[i];
    }
    if (total != nbytes) { /* the caller's byte count is wrong: write nothing */
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyObject_GetBuffer(args[0], &dest, PyBUF_WRITABLE) < 0) goto done;
    Py_ssize_t padded = (nbytes + 7) & ~(Py_ssize_t)7;
    if (digest_from > offset || offset > dest.len || padded > dest.len - offset) {
        PyErr_Format(PyExc_ValueError, "record [%zd, %zd) (digest from %zd) outside a buffer of %zd bytes",
                     offset, offset + padded, digest_from, dest.len);
        goto done;
    }
    u8 *base = (u8 *)dest.buf + digest_from; /* digest input: base[0 : n] */
    size_t n = (size_t)(offset + padded - digest_from);
    u8 *out = (u8 *)dest.buf + offset;
    u64 h;
    if (n <= 240) {
        for (Py_ssize_t i = 0; i < count; i++) {
            memcpy(out, src[i], (size_t)len[i]);
            out += len[i];
        }
        memset(out, 0, (size_t)(padded - nbytes));
        h = xxh3(base, n);
    } else {
        /* Block by block (1 KiB of digest input): a block that lies inside one part is copied
           and hashed in one pass; any other (frame words, part boundaries) is copied with
           memcpy, then hashed from the destination while it is in L1. The input's last block
           is left to long_finish, which treats it specially. */
        u64 acc[8] __attribute__((aligned(64)));
        long_init(acc);
        Cursor cur = {src, len, count, 0, 0};
        size_t head = (size_t)(offset - digest_from); /* digest bytes before the payload, in dest */
        size_t blocks = (n - 1) / BLOCK, copied = 0;  /* copied: payload bytes written so far */
        memset(out + nbytes, 0, (size_t)(padded - nbytes)); /* the padding lies past the payload */
        for (size_t b = 0; b < blocks; b++) {
            size_t p0 = b * BLOCK, p1 = p0 + BLOCK;
            const u8 *whole = NULL;
            if (kernel->copy_stripes != NULL && p0 >= head && p1 - head <= (size_t)nbytes)
                whole = cursor_span(&cur, BLOCK); /* copied == p0 - head here */
            if (whole != NULL) {
                kernel->copy_stripes(acc, base + p0, whole, STRIPES_PER_BLOCK, SECRET);
                kernel->scramble(acc, SECRET + SECRET_LEN - STRIPE);
                copied += BLOCK;
                continue;
            }
            size_t upto = p1 > head ? p1 - head : 0;
            if (upto > (size_t)nbytes) upto = (size_t)nbytes;
            if (upto > copied) {
                cursor_copy(&cur, out + copied, upto - copied);
                copied = upto;
            }
            long_block(acc, base + p0);
        }
        cursor_copy(&cur, out + copied, (size_t)nbytes - copied);
        h = long_finish(acc, base, n, blocks);
    }
    result = PyLong_FromUnsignedLongLong(h);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        if (views[i].obj != NULL) PyBuffer_Release(&views[i]);
    if (dest.obj != NULL) PyBuffer_Release(&dest);
    if (views != stack_views) {
        PyMem_Free(views);
        PyMem_Free(src);
        PyMem_Free(len);
    }
    Py_DECREF(seq);
    return result;
}

static PyObject *py_implementations(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (size_t k = 0; k < N_KERNELS; k++) {
        if (!kernel_supported(k)) continue;
        PyObject *name = PyUnicode_FromString(KERNELS[k].name);
        if (name == NULL || PyList_Append(out, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(name);
    }
    return out;
}

static PyObject *py_use(PyObject *self, PyObject *arg) {
    const char *previous = kernel->name;
    if (arg != Py_None) {
        const char *want = PyUnicode_AsUTF8(arg);
        if (want == NULL) return NULL;
        size_t k = 0;
        while (k < N_KERNELS && strcmp(KERNELS[k].name, want) != 0) k++;
        if (k == N_KERNELS || !kernel_supported(k)) {
            PyErr_Format(PyExc_ValueError, "kernel %R is not available on this CPU", arg);
            return NULL;
        }
        kernel = &KERNELS[k];
    }
    return PyUnicode_FromString(previous);
}

static PyMethodDef methods[] = {
    {"copy_digest", (PyCFunction)(void (*)(void))py_copy_digest, METH_FASTCALL,
     "copy_digest(dest, offset, parts, digest_from, nbytes) -> int | None: copy parts to dest[offset:], "
     "zero-pad to 8, return XXH3-64 of dest[digest_from:end]; None (nothing written) if the parts "
     "do not hold nbytes bytes."},
    {"xxh3_64", (PyCFunction)(void (*)(void))py_xxh3_64, METH_FASTCALL,
     "xxh3_64(buffer, start=0, stop=len) -> int: XXH3-64 (seed 0) of buffer[start:stop]."},
    {"implementations", py_implementations, METH_NOARGS, "Kernels this CPU can run."},
    {"use", py_use, METH_O, "use(name or None) -> previous kernel name; None only reports."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_ringcopy", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ringcopy(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
#endif
    /* avx2 where the CPU has it: on Zen 4 the avx512 kernel is no faster at hashing and slower
       at copying (a record's 64-byte stores start 8 bytes into a line, so every one splits). */
    for (size_t k = 0; k < N_KERNELS; k++)
        if (kernel_supported(k) && strcmp(KERNELS[k].name, "avx512") != 0) kernel = &KERNELS[k];
    return PyModule_Create(&module);
}
