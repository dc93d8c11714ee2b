/* The per-row loops of kernel.c (included there, once): the packed row for int32 and
 * int64 outputs (plain, SSE2, AVX2 chosen at run time), the AVX2 eos row, the unpacked row, and
 * `packed_row`, which picks among them. Every pointer handed to them was checked by the caller
 * against (rows, length): the loops themselves check nothing. */

/* One row of the packed layout, for T = int32_t or int64_t. enc may be the memory of
 * targets or of positions: each item is read before the same item of an output is written,
 * and the input at k comes from `prev`, never from memory. (Blocks of 16 values written as
 * vectors measured no faster: the pass is bound by the four output arrays' memory traffic.) */
#define PACKED_ROW(T)                                                                         \
    static void packed_row_##T(const uint32_t *enc, T *in, T *tg, int32_t *seg, int32_t *pos, \
                               Py_ssize_t length, T bos)                                      \
    {                                                                                         \
        Py_ssize_t s = 0, p = 0;                                                              \
        T prev = 0;                                                                           \
        for (Py_ssize_t k = 0; k < length; k++) {                                             \
            uint32_t x = enc[k];                                                              \
            int start = k == 0 || (x & 1u);                                                   \
            T t = (T)(x >> 1);                                                                \
            s += start;                                                                       \
            p = start ? 0 : p + 1;                                                            \
            in[k] = start ? bos : prev;                                                       \
            tg[k] = t;                                                                        \
            seg[k] = (int32_t)s;                                                              \
            pos[k] = (int32_t)p;                                                              \
            prev = t;                                                                         \
        }                                                                                     \
    }

PACKED_ROW(int64_t)

#ifdef __SSE2__
/* The int32 row four values at a time: a group of four without a start bit (nearly all:
 * documents run for hundreds of tokens) is one load and four vector stores; a group with a
 * start goes value by value. Loads come before the stores of the same items (enc may be the
 * memory of targets or positions); the first input of a group comes from `prev`. */
static void
packed_row_int32_t(const uint32_t *enc, int32_t *in, int32_t *tg, int32_t *seg, int32_t *pos,
                   Py_ssize_t length, int32_t bos)
{
    Py_ssize_t s = 0, p = 0;
    int32_t prev = 0;
    const __m128i step = _mm_set_epi32(4, 3, 2, 1);
    Py_ssize_t k = 0;
    while (k < length) {
        if (k > 0 && k + 4 <= length) {
            __m128i x = _mm_loadu_si128((const __m128i *)(enc + k));
            if (!_mm_movemask_ps(_mm_castsi128_ps(_mm_slli_epi32(x, 31)))) {
                __m128i t = _mm_srli_epi32(x, 1);
                __m128i i = _mm_or_si128(_mm_slli_si128(t, 4), _mm_cvtsi32_si128(prev));
                _mm_storeu_si128((__m128i *)(in + k), i);
                _mm_storeu_si128((__m128i *)(tg + k), t);
                _mm_storeu_si128((__m128i *)(seg + k), _mm_set1_epi32((int32_t)s));
                _mm_storeu_si128((__m128i *)(pos + k),
                                 _mm_add_epi32(_mm_set1_epi32((int32_t)p), step));
                prev = _mm_cvtsi128_si32(_mm_srli_si128(t, 12));
                p += 4;
                k += 4;
                continue;
            }
        }
        Py_ssize_t end = k + 4 < length ? k + 4 : length;
        for (; k < end; k++) {
            uint32_t x = enc[k];
            int start = k == 0 || (x & 1u);
            int32_t t = (int32_t)(x >> 1);
            s += start;
            p = start ? 0 : p + 1;
            in[k] = start ? bos : prev;
            tg[k] = t;
            seg[k] = (int32_t)s;
            pos[k] = (int32_t)p;
            prev = t;
        }
    }
}
#else
PACKED_ROW(int32_t)
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_AVX2_ROW 1
#include <immintrin.h>
/* The int32 row eight values at a time where the CPU has AVX2 (chosen at run time): half the
 * stores of the SSE2 row, which measured ~1.4x faster on a whole batch (the pass is bound by
 * stores). Same rules: a group's loads come before its stores, a group with a start bit goes
 * value by value, the first input of a group comes from `prev`. `next` (or NULL) is the row
 * laid out after this one: its lines are prefetched meanwhile, a line per 16 values (rows of
 * a random batch lie in memory the caches have not seen: 39 -> 33 us a 32x2048 batch). */
__attribute__((target("avx2"))) static void
packed_row_int32_avx2(const uint32_t *enc, int32_t *in, int32_t *tg, int32_t *seg, int32_t *pos,
                      Py_ssize_t length, int32_t bos, const uint32_t *next)
{
    Py_ssize_t s = 0, p = 0;
    int32_t prev = 0;
    const __m256i step = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8);
    const __m256i back = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6); /* lane i takes i - 1 */
    Py_ssize_t k = 0;
    while (k < length) {
        if (next != NULL && !(k & 15)) /* the next row's line at k, as a hint (never read) */
            _mm_prefetch((const char *)(next + k), _MM_HINT_T0);
        if (k > 0 && k + 8 <= length) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(enc + k));
            if (!_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 31)))) {
                __m256i t = _mm256_srli_epi32(x, 1);
                __m256i i = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(t, back),
                                               _mm256_set1_epi32(prev), 1);
                _mm256_storeu_si256((__m256i *)(in + k), i);
                _mm256_storeu_si256((__m256i *)(tg + k), t);
                _mm256_storeu_si256((__m256i *)(seg + k), _mm256_set1_epi32((int32_t)s));
                _mm256_storeu_si256((__m256i *)(pos + k),
                                    _mm256_add_epi32(_mm256_set1_epi32((int32_t)p), step));
                prev = _mm256_extract_epi32(t, 7);
                p += 8;
                k += 8;
                continue;
            }
        }
        Py_ssize_t end = k + 8 < length ? k + 8 : length;
        for (; k < end; k++) {
            uint32_t x = enc[k];
            int start = k == 0 || (x & 1u);
            int32_t t = (int32_t)(x >> 1);
            s += start;
            p = start ? 0 : p + 1;
            in[k] = start ? bos : prev;
            tg[k] = t;
            seg[k] = (int32_t)s;
            pos[k] = (int32_t)p;
            prev = t;
        }
    }
}

/* The int64 packed row the same way: the group's int32 values widened to two vectors of four
 * int64 for inputs and targets (values are below 2^31: a stored value shifted right by one);
 * bos, which may not fit int32, only ever goes through the value-by-value path. */
__attribute__((target("avx2"))) static void
packed_row_int64_avx2(const uint32_t *enc, int64_t *in, int64_t *tg, int32_t *seg, int32_t *pos,
                      Py_ssize_t length, int64_t bos, const uint32_t *next)
{
    Py_ssize_t s = 0, p = 0;
    int64_t prev = 0;
    const __m256i step = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8);
    const __m256i back = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
    Py_ssize_t k = 0;
    while (k < length) {
        if (next != NULL && !(k & 15)) _mm_prefetch((const char *)(next + k), _MM_HINT_T0);
        if (k > 0 && k + 8 <= length) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(enc + k));
            if (!_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 31)))) {
                __m256i t = _mm256_srli_epi32(x, 1);
                __m256i i = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(t, back),
                                               _mm256_set1_epi32((int32_t)prev), 1);
                _mm256_storeu_si256((__m256i *)(in + k),
                                    _mm256_cvtepu32_epi64(_mm256_castsi256_si128(i)));
                _mm256_storeu_si256((__m256i *)(in + k + 4),
                                    _mm256_cvtepu32_epi64(_mm256_extracti128_si256(i, 1)));
                _mm256_storeu_si256((__m256i *)(tg + k),
                                    _mm256_cvtepu32_epi64(_mm256_castsi256_si128(t)));
                _mm256_storeu_si256((__m256i *)(tg + k + 4),
                                    _mm256_cvtepu32_epi64(_mm256_extracti128_si256(t, 1)));
                _mm256_storeu_si256((__m256i *)(seg + k), _mm256_set1_epi32((int32_t)s));
                _mm256_storeu_si256((__m256i *)(pos + k),
                                    _mm256_add_epi32(_mm256_set1_epi32((int32_t)p), step));
                prev = (int64_t)(uint32_t)_mm256_extract_epi32(t, 7);
                p += 8;
                k += 8;
                continue;
            }
        }
        Py_ssize_t end = k + 8 < length ? k + 8 : length;
        for (; k < end; k++) {
            uint32_t x = enc[k];
            int start = k == 0 || (x & 1u);
            int64_t t = (int64_t)(x >> 1);
            s += start;
            p = start ? 0 : p + 1;
            in[k] = start ? bos : prev;
            tg[k] = t;
            seg[k] = (int32_t)s;
            pos[k] = (int32_t)p;
            prev = t;
        }
    }
}

/* The int32 eos row eight values at a time (its first values up to a multiple of 8; the
 * rest are the caller's), prefetching `next` as the packed row does. A window holds
 * length + 1 values: the load at j + 1 stays inside it. Returns the values done. */
__attribute__((target("avx2"))) static Py_ssize_t
eos_row_int32_avx2(const uint32_t *e, int32_t *in, int32_t *tg, Py_ssize_t length,
                   const uint32_t *next)
{
    Py_ssize_t j = 0;
    for (; j + 8 <= length; j += 8) {
        if (next != NULL && !(j & 15)) _mm_prefetch((const char *)(next + j), _MM_HINT_T0);
        __m256i a = _mm256_loadu_si256((const __m256i *)(e + j));
        __m256i b = _mm256_loadu_si256((const __m256i *)(e + j + 1));
        _mm256_storeu_si256((__m256i *)(in + j), _mm256_srli_epi32(a, 1));
        _mm256_storeu_si256((__m256i *)(tg + j), _mm256_srli_epi32(b, 1));
    }
    return j;
}

static int max_simd = 2; /* simd(): 1 keeps to SSE2, for the tests of that row */

static int
has_avx2(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
}
#endif

static void
packed_row(const uint32_t *enc, Py_buffer *v, Py_ssize_t b, Py_ssize_t length, long long bos,
           int wide, const uint32_t *next)
{
    int32_t *seg = (int32_t *)v[3].buf + b, *pos = (int32_t *)v[4].buf + b;
#ifdef HAVE_AVX2_ROW
    if (wide && max_simd >= 2 && has_avx2())
        packed_row_int64_avx2(enc, (int64_t *)v[1].buf + b, (int64_t *)v[2].buf + b, seg, pos,
                              length, (int64_t)bos, next);
    else
#endif
    if (wide)
        packed_row_int64_t(enc, (int64_t *)v[1].buf + b, (int64_t *)v[2].buf + b, seg, pos,
                           length, (int64_t)bos);
#ifdef HAVE_AVX2_ROW
    else if (max_simd >= 2 && has_avx2())
        packed_row_int32_avx2(enc, (int32_t *)v[1].buf + b, (int32_t *)v[2].buf + b, seg, pos,
                              length, (int32_t)bos, next);
#endif
    else
        packed_row_int32_t(enc, (int32_t *)v[1].buf + b, (int32_t *)v[2].buf + b, seg, pos,
                           length, (int32_t)bos);
}

/* One unpacked row, for T = int32_t or int64_t: the piece (k values of src, decoded by
 * `shift`), then padding; plain loops the compiler vectorises. */
#define UNPACKED_ROW(T, NAME, ATTR)                                                           \
    ATTR static void NAME(const uint32_t *src, Py_ssize_t k, T *in, T *tg, int32_t *seg,      \
                          int32_t *pos, uint8_t *mask, Py_ssize_t length, T bos, T pad,       \
                          int shift)                                                          \
    {                                                                                         \
        if (k > 0) in[0] = bos;                                                               \
        for (Py_ssize_t j = 1; j < k; j++) in[j] = (T)(src[j - 1] >> shift);                  \
        for (Py_ssize_t j = 0; j < k; j++) tg[j] = (T)(src[j] >> shift);                      \
        for (Py_ssize_t j = 0; j < k; j++) pos[j] = (int32_t)j;                               \
        for (Py_ssize_t j = 0; j < k; j++) seg[j] = 1;                                        \
        memset(mask, 1, (size_t)k);                                                           \
        for (Py_ssize_t j = k; j < length; j++) in[j] = pad;                                  \
        for (Py_ssize_t j = k; j < length; j++) tg[j] = pad;                                  \
        memset(seg + k, 0, (size_t)(length - k) * 4);                                        \
        memset(pos + k, 0, (size_t)(length - k) * 4);                                         \
        memset(mask + k, 0, (size_t)(length - k));                                            \
    }

UNPACKED_ROW(int32_t, unpacked_row_int32_t, )
UNPACKED_ROW(int64_t, unpacked_row_int64_t, )
#ifdef HAVE_AVX2_ROW
/* the same loops, vectorised by the compiler for AVX2 (chosen at run time) */
UNPACKED_ROW(int32_t, unpacked_row_int32_avx2, __attribute__((target("avx2"))))
#endif
