/* Words and word n-gram hashes of a str, for minhash.c (the numbers are defined
 * there; lmdata/dolma/_shingle_py.py computes the same in numpy). */
#ifndef LMDATA_MINHASH_WORDS_H
#define LMDATA_MINHASH_WORDS_H

#define MAX_N 64                         /* the longest n-gram, in words */
#define P_WORD 0x100000001b3ULL          /* a word's polynomial base (odd) */
#define Q_GRAM 0x9e3779b97f4a7c15ULL     /* an n-gram's polynomial base (odd) */
#define K_BAND 0xd6e8feb86659fd93ULL     /* a band key's multiplier (odd) */

static const uint32_t *FOLD = NULL; /* BMP code point -> folded code point, 0: separator */
static Py_buffer FOLD_VIEW;
static int FOLD_HELD = 0;

static inline uint64_t
fmix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

typedef struct {
    uint64_t h;
    Py_ssize_t start, end; /* code points [start, end) of the text */
} Word;

typedef struct {
    Word *w;
    Py_ssize_t n, cap;
} Words;

typedef struct {
    uint64_t *p;
    Py_ssize_t n, cap;
} Grow;

/* Room for `need` items in g (doubling); -1 without memory. */
static int
grow(Grow *g, Py_ssize_t need)
{
    if (need <= g->cap) return 0;
    Py_ssize_t cap = g->cap ? g->cap : 1024;
    while (cap < need) cap *= 2;
    uint64_t *p = PyMem_Realloc(g->p, cap * 8);
    if (!p) return -1;
    g->p = p;
    g->cap = cap;
    return 0;
}

static int
words_room(Words *W)
{
    if (W->n < W->cap) return 0;
    Py_ssize_t cap = W->cap ? W->cap * 2 : 256;
    Word *p = PyMem_Realloc(W->w, cap * sizeof(Word));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    W->w = p;
    W->cap = cap;
    return 0;
}

#define WORDS_LOOP(TYPE)                                                                    \
    do {                                                                                    \
        const TYPE *s = (const TYPE *)data;                                                 \
        for (Py_ssize_t i = 0; i <= len; i++) {                                             \
            uint32_t c = i < len ? (uint32_t)s[i] : 0;                                      \
            uint32_t f = i == len ? 0 : c < 0x10000 ? FOLD[c] : c;                          \
            if (f) {                                                                        \
                if (start < 0) {                                                            \
                    start = i;                                                              \
                    acc = 0;                                                                \
                    pw = 1;                                                                 \
                }                                                                           \
                acc += (uint64_t)f * pw;                                                    \
                pw *= P_WORD;                                                               \
            }                                                                               \
            else if (start >= 0) {                                                          \
                if (words_room(W) < 0) return -1;                                           \
                W->w[W->n].h = fmix64(acc + (uint64_t)(i - start));                         \
                W->w[W->n].start = start;                                                   \
                W->w[W->n].end = i;                                                         \
                W->n++;                                                                     \
                start = -1;                                                                 \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* The words of str `t` into W (emptied first). */
static int
text_words(PyObject *t, Words *W)
{
    W->n = 0;
    int kind = PyUnicode_KIND(t);
    const void *data = PyUnicode_DATA(t);
    Py_ssize_t len = PyUnicode_GET_LENGTH(t), start = -1;
    uint64_t acc = 0, pw = 1;
    if (kind == PyUnicode_1BYTE_KIND) WORDS_LOOP(Py_UCS1);
    else if (kind == PyUnicode_2BYTE_KIND) WORDS_LOOP(Py_UCS2);
    else WORDS_LOOP(Py_UCS4);
    return 0;
}

/* How many n-gram hashes a text of `words` words gives. */
static inline Py_ssize_t
gram_count(Py_ssize_t words, Py_ssize_t n, int shortp)
{
    if (words >= n) return words - n + 1;
    return shortp && words > 0 ? 1 : 0;
}

/* The n-gram hashes of W into out (gram_count of them): fmix64(sum_k w[j+k] Q^k), the sum
 * rolled from one n-gram to the next (drop w[j], divide by Q, add the new word times Q^(n-1):
 * exact mod 2^64, Q being odd). */
static void
gram_hashes(const Words *W, Py_ssize_t n, int shortp, uint64_t *out)
{
    Py_ssize_t m = gram_count(W->n, n, shortp);
    Py_ssize_t width = W->n >= n ? n : W->n;
    if (!m) return;
    uint64_t qinv = Q_GRAM, top = 1, h = 0, q = 1;
    for (int i = 0; i < 6; i++) qinv *= 2 - Q_GRAM * qinv; /* Newton: Q * qinv = 1 mod 2^64 */
    for (Py_ssize_t k = 0; k < width; k++) {
        h += W->w[k].h * q;
        top = q;
        q *= Q_GRAM;
    }
    out[0] = fmix64(h);
    for (Py_ssize_t j = 1; j < m; j++) {
        h = (h - W->w[j - 1].h) * qinv + W->w[j + width - 1].h * top;
        out[j] = fmix64(h);
    }
}

/* A band's key: fmix64 of its values folded in order, seeded by the band's number. */
static inline uint64_t
band_key(const uint64_t *v, Py_ssize_t rows, Py_ssize_t band, uint64_t seed)
{
    uint64_t h = fmix64(seed ^ ((uint64_t)band * K_BAND));
    for (Py_ssize_t r = 0; r < rows; r++) h = (h ^ v[r]) * K_BAND;
    return fmix64(h);
}

#endif
