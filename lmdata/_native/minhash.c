/* Near-duplicate and contamination kernels (lmdata/dolma/_shingle.py): words, word n-gram
 * hashes, MinHash signatures and LSH band keys, exact Jaccard of n-gram sets, and n-gram
 * matching against an evaluation set, each a whole batch of documents per call.
 *
 * Text is read where Python holds it (a str's 1, 2 or 4-byte code points: no encode). A code
 * point below U+10000 is folded through a table Python builds once (unicodedata: letters,
 * marks and digits lower-cased, anything else 0, a separator); one above is a word character
 * as it is. A word is a run of word characters; its hash is fmix64(sum f_i P^i + length)
 * over its folded code points f_i; an n-gram's is fmix64(sum w_k Q^k) over its n word hashes
 * (all mod 2^64). _shingle_py.py computes the same numbers in numpy where no compiler built
 * this module, and the tests compare the two. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "minhash_words.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define X86_DISPATCH 1
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

/* sig[i] = min(sig[i], a[i] * x + b[i]) over the n-grams x (mod 2^64), for the widest vector
 * unit this CPU has: SIG_BLOCK hash functions at a time held in registers while every n-gram
 * passes (the loop over n-grams then only broadcasts x), the rest one at a time. */
#define SIG_BLOCK 16
INLINE void
sig_body(uint64_t *restrict sig, const uint64_t *restrict a, const uint64_t *restrict b,
         Py_ssize_t k, const uint64_t *restrict grams, Py_ssize_t m)
{
    Py_ssize_t i0 = 0;
    for (; i0 + SIG_BLOCK <= k; i0 += SIG_BLOCK) {
        uint64_t A[SIG_BLOCK], B[SIG_BLOCK], S[SIG_BLOCK];
        for (int i = 0; i < SIG_BLOCK; i++) {
            A[i] = a[i0 + i];
            B[i] = b[i0 + i];
            S[i] = sig[i0 + i];
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            uint64_t x = grams[j];
            for (int i = 0; i < SIG_BLOCK; i++) {
                uint64_t v = A[i] * x + B[i];
                S[i] = v < S[i] ? v : S[i];
            }
        }
        for (int i = 0; i < SIG_BLOCK; i++) sig[i0 + i] = S[i];
    }
    for (Py_ssize_t j = 0; j < m && i0 < k; j++) {
        uint64_t x = grams[j];
        for (Py_ssize_t i = i0; i < k; i++) {
            uint64_t v = a[i] * x + b[i];
            sig[i] = v < sig[i] ? v : sig[i];
        }
    }
}

typedef void (*SigFn)(uint64_t *, const uint64_t *, const uint64_t *, Py_ssize_t,
                      const uint64_t *, Py_ssize_t);

static void
sig_default(uint64_t *sig, const uint64_t *a, const uint64_t *b, Py_ssize_t k,
            const uint64_t *grams, Py_ssize_t m)
{
    sig_body(sig, a, b, k, grams, m);
}

#ifdef X86_DISPATCH
/* the same loop compiled for AVX2 and for AVX-512 (64-bit multiplies in one instruction),
 * picked once at import by what this CPU supports */
__attribute__((target("avx2"))) static void
sig_avx2(uint64_t *sig, const uint64_t *a, const uint64_t *b, Py_ssize_t k,
         const uint64_t *grams, Py_ssize_t m)
{
    sig_body(sig, a, b, k, grams, m);
}

__attribute__((target("avx512f,avx512dq,avx512vl"))) static void
sig_avx512(uint64_t *sig, const uint64_t *a, const uint64_t *b, Py_ssize_t k,
           const uint64_t *grams, Py_ssize_t m)
{
    sig_body(sig, a, b, k, grams, m);
}
#endif

static SigFn sig_update = sig_default;

/* A C-contiguous buffer of `count` items of `itemsize` bytes (count < 0: any count). */
static int
get_array(PyObject *obj, Py_buffer *v, Py_ssize_t itemsize, Py_ssize_t count, int writable,
          const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) return -1;
    if (v->len % itemsize || (count >= 0 && v->len != count * itemsize) ||
        ((uintptr_t)v->buf % (uintptr_t)itemsize)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd aligned %zd-byte items",
                     what, v->len, count < 0 ? v->len / itemsize : count, itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *
as_bytes(const void *p, Py_ssize_t n)
{
    return PyBytes_FromStringAndSize((const char *)p, n);
}

/* set_fold(table): the BMP fold table (65536 uint32), kept for every later call. */
static PyObject *
py_set_fold(PyObject *self, PyObject *arg)
{
    Py_buffer v;
    if (get_array(arg, &v, 4, 0x10000, 0, "fold table") < 0) return NULL;
    if (FOLD_HELD) PyBuffer_Release(&FOLD_VIEW);
    FOLD_VIEW = v;
    FOLD = (const uint32_t *)v.buf;
    FOLD_HELD = 1;
    Py_RETURN_NONE;
}

static int
check_fold(void)
{
    if (!FOLD) {
        PyErr_SetString(PyExc_RuntimeError, "set_fold was not called");
        return -1;
    }
    return 0;
}

static int
check_n(Py_ssize_t n)
{
    if (n < 1 || n > MAX_N) {
        PyErr_Format(PyExc_ValueError, "n-gram size %zd is not in 1..%d", n, MAX_N);
        return -1;
    }
    return 0;
}

/* grams(texts, n, short) -> (counts int64[docs] bytes, hashes uint64[] bytes): every n-gram
 * hash of every text in order (repeats kept); with `short`, a text of 1..n-1 words gives one
 * hash of all its words. */
static PyObject *
py_grams(PyObject *self, PyObject *args)
{
    PyObject *texts;
    Py_ssize_t n;
    int shortp;
    if (!PyArg_ParseTuple(args, "O!np", &PyList_Type, &texts, &n, &shortp)) return NULL;
    if (check_fold() < 0 || check_n(n) < 0) return NULL;
    Py_ssize_t docs = PyList_GET_SIZE(texts);
    Words W = {0};
    Grow G = {0};
    int64_t *counts = PyMem_Malloc((docs ? docs : 1) * sizeof(int64_t));
    PyObject *out = NULL;
    if (!counts) goto fail_mem;
    for (Py_ssize_t d = 0; d < docs; d++) {
        PyObject *t = PyList_GET_ITEM(texts, d);
        if (!PyUnicode_Check(t)) {
            PyErr_Format(PyExc_TypeError, "text %zd is not a str", d);
            goto fail;
        }
        if (text_words(t, &W) < 0) goto fail;
        Py_ssize_t m = gram_count(W.n, n, shortp);
        if (grow(&G, G.n + m) < 0) goto fail_mem;
        gram_hashes(&W, n, shortp, G.p + G.n);
        G.n += m;
        counts[d] = m;
    }
    out = Py_BuildValue("(NN)", as_bytes(counts, docs * 8), as_bytes(G.p, G.n * 8));
    goto done;
fail_mem:
    PyErr_NoMemory();
fail:
done:
    PyMem_Free(counts);
    PyMem_Free(W.w);
    PyMem_Free(G.p);
    return out;
}

/* spans(text, n) -> (hashes uint64[], starts int64[], ends int64[]) as bytes: each full
 * n-gram of one text with the code point range it covers (its first word's start to its last
 * word's end). */
static PyObject *
py_spans(PyObject *self, PyObject *args)
{
    PyObject *t;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Un", &t, &n)) return NULL;
    if (check_fold() < 0 || check_n(n) < 0) return NULL;
    Words W = {0};
    if (text_words(t, &W) < 0) return NULL;
    Py_ssize_t m = gram_count(W.n, n, 0);
    uint64_t *h = PyMem_Malloc((m ? m : 1) * 8);
    int64_t *s = PyMem_Malloc((m ? m : 1) * 8), *e = PyMem_Malloc((m ? m : 1) * 8);
    PyObject *out = NULL;
    if (!h || !s || !e) {
        PyErr_NoMemory();
    }
    else {
        gram_hashes(&W, n, 0, h);
        for (Py_ssize_t j = 0; j < m; j++) {
            s[j] = W.w[j].start;
            e[j] = W.w[j + n - 1].end;
        }
        out = Py_BuildValue("(NNN)", as_bytes(h, m * 8), as_bytes(s, m * 8), as_bytes(e, m * 8));
    }
    PyMem_Free(h);
    PyMem_Free(s);
    PyMem_Free(e);
    PyMem_Free(W.w);
    return out;
}

/* sign(texts, n, a, b, rows, key_seed, keep) -> (keys uint64[docs * bands], counts
 * int64[docs], hashes uint64[] or None): each text's MinHash signature over its n-gram hashes
 * (short texts as in grams), min over a[i] x + b[i] mod 2^64, top 32 bits kept, cut into
 * bands of `rows` values, each band's key fmix64 of its values (see band_key); a text without
 * words has count 0 and keys 0. With `keep`, the n-gram hashes too (as grams gives them). */
static PyObject *
py_sign(PyObject *self, PyObject *args)
{
    PyObject *texts, *ao, *bo;
    Py_ssize_t n, rows;
    unsigned long long key_seed;
    int keep;
    if (!PyArg_ParseTuple(args, "O!nOOnKp", &PyList_Type, &texts, &n, &ao, &bo, &rows,
                          &key_seed, &keep))
        return NULL;
    if (check_fold() < 0 || check_n(n) < 0) return NULL;
    Py_buffer av, bv;
    if (get_array(ao, &av, 8, -1, 0, "a") < 0) return NULL;
    if (get_array(bo, &bv, 8, av.len / 8, 0, "b") < 0) {
        PyBuffer_Release(&av);
        return NULL;
    }
    Py_ssize_t k = av.len / 8;
    PyObject *out = NULL;
    Words W = {0};
    Grow G = {0}, one = {0};
    Py_ssize_t docs = PyList_GET_SIZE(texts);
    uint64_t *keys = NULL, *sig = NULL;
    int64_t *counts = NULL;
    if (rows < 1 || k < rows || k % rows) {
        PyErr_Format(PyExc_ValueError, "%zd hash functions are not bands of %zd rows", k, rows);
        goto done;
    }
    Py_ssize_t bands = k / rows;
    keys = PyMem_Calloc((docs ? docs : 1) * bands, 8);
    counts = PyMem_Malloc((docs ? docs : 1) * 8);
    sig = PyMem_Malloc(k * 8);
    if (!keys || !counts || !sig) {
        PyErr_NoMemory();
        goto done;
    }
    const uint64_t *a = av.buf, *b = bv.buf;
    for (Py_ssize_t d = 0; d < docs; d++) {
        PyObject *t = PyList_GET_ITEM(texts, d);
        if (!PyUnicode_Check(t)) {
            PyErr_Format(PyExc_TypeError, "text %zd is not a str", d);
            goto done;
        }
        if (text_words(t, &W) < 0) goto done;
        Py_ssize_t m = gram_count(W.n, n, 1);
        Grow *into = keep ? &G : &one;
        Py_ssize_t at = keep ? G.n : 0;
        if (grow(into, at + m) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        uint64_t *g = into->p + at;
        gram_hashes(&W, n, 1, g);
        if (keep) G.n += m;
        counts[d] = m;
        if (!m) continue;
        for (Py_ssize_t i = 0; i < k; i++) sig[i] = UINT64_MAX;
        sig_update(sig, a, b, k, g, m);
        for (Py_ssize_t i = 0; i < k; i++) sig[i] >>= 32;
        for (Py_ssize_t j = 0; j < bands; j++)
            keys[d * bands + j] = band_key(sig + j * rows, rows, j, key_seed);
    }
    out = Py_BuildValue("(NNN)", as_bytes(keys, docs * bands * 8), as_bytes(counts, docs * 8),
                        keep ? as_bytes(G.p, G.n * 8) : Py_NewRef(Py_None));
done:
    PyBuffer_Release(&av);
    PyBuffer_Release(&bv);
    PyMem_Free(keys);
    PyMem_Free(counts);
    PyMem_Free(sig);
    PyMem_Free(W.w);
    PyMem_Free(G.p);
    PyMem_Free(one.p);
    return out;
}

/* Sort x[0:n] ascending: insertion sort when short, else LSD radix sort by bytes through
 * tmp (n items), skipping a byte all keys share. */
static void
sort_u64(uint64_t *x, uint64_t *tmp, Py_ssize_t n)
{
    if (n < 48) {
        for (Py_ssize_t i = 1; i < n; i++) {
            uint64_t v = x[i];
            Py_ssize_t j = i;
            for (; j > 0 && x[j - 1] > v; j--) x[j] = x[j - 1];
            x[j] = v;
        }
        return;
    }
    uint64_t *src = x, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        Py_ssize_t count[257] = {0};
        for (Py_ssize_t i = 0; i < n; i++) count[((src[i] >> shift) & 0xFF) + 1]++;
        if (count[((src[0] >> shift) & 0xFF) + 1] == n) continue; /* one value: in order */
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (Py_ssize_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & 0xFF]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != x) memcpy(x, src, n * 8);
}

/* jaccard(hashes, starts, ia, ib) -> (inter int64[pairs], union int64[pairs]) as bytes: the
 * sizes of the intersection and union of the n-gram sets of docs ia[p] and ib[p], doc d being
 * hashes[starts[d]:starts[d+1]] (a writable uint64 buffer: each doc's hashes are sorted in
 * place first). */
static PyObject *
py_jaccard(PyObject *self, PyObject *args)
{
    PyObject *ho, *so, *iao, *ibo;
    if (!PyArg_ParseTuple(args, "OOOO", &ho, &so, &iao, &ibo)) return NULL;
    Py_buffer hv, sv, av, bv;
    PyObject *out = NULL;
    if (get_array(ho, &hv, 8, -1, 1, "hashes") < 0) return NULL;
    if (get_array(so, &sv, 8, -1, 0, "starts") < 0) goto r1;
    if (get_array(iao, &av, 8, -1, 0, "ia") < 0) goto r2;
    if (get_array(ibo, &bv, 8, av.len / 8, 0, "ib") < 0) goto r3;
    uint64_t *h = hv.buf;
    const int64_t *st = sv.buf, *ia = av.buf, *ib = bv.buf;
    Py_ssize_t docs = sv.len / 8 - 1, pairs = av.len / 8, total = hv.len / 8;
    int64_t *uniq = NULL, *inter = NULL, *uni = NULL;
    uint64_t *tmp = NULL;
    if (docs < 0) {
        PyErr_SetString(PyExc_ValueError, "starts is empty");
        goto r4;
    }
    for (Py_ssize_t d = 0; d < docs; d++) {
        if (st[d] < 0 || st[d] > st[d + 1] || st[d + 1] > total) {
            PyErr_Format(PyExc_ValueError, "starts[%zd] is outside the hashes", d);
            goto r4;
        }
    }
    for (Py_ssize_t p = 0; p < pairs; p++) {
        if (ia[p] < 0 || ia[p] >= docs || ib[p] < 0 || ib[p] >= docs) {
            PyErr_Format(PyExc_ValueError, "pair %zd names a doc outside 0..%zd", p, docs);
            goto r4;
        }
    }
    Py_ssize_t longest = 1;
    for (Py_ssize_t d = 0; d < docs; d++)
        if (st[d + 1] - st[d] > longest) longest = st[d + 1] - st[d];
    uniq = PyMem_Malloc((docs ? docs : 1) * 8);
    inter = PyMem_Malloc((pairs ? pairs : 1) * 8);
    uni = PyMem_Malloc((pairs ? pairs : 1) * 8);
    tmp = PyMem_Malloc(longest * 8);
    if (!uniq || !inter || !uni || !tmp) {
        PyErr_NoMemory();
        goto r4;
    }
    for (Py_ssize_t d = 0; d < docs; d++) {
        uint64_t *x = h + st[d];
        Py_ssize_t m = st[d + 1] - st[d], u = 0;
        sort_u64(x, tmp, m);
        for (Py_ssize_t j = 0; j < m; j++)
            if (!u || x[j] != x[u - 1]) x[u++] = x[j];
        uniq[d] = u; /* the set is the first u hashes (the rest is left as it was) */
    }
    for (Py_ssize_t p = 0; p < pairs; p++) {
        const uint64_t *x = h + st[ia[p]], *y = h + st[ib[p]];
        Py_ssize_t nx = uniq[ia[p]], ny = uniq[ib[p]], i = 0, j = 0, c = 0;
        while (i < nx && j < ny) {
            if (x[i] < y[j]) i++;
            else if (x[i] > y[j]) j++;
            else {
                c++;
                i++;
                j++;
            }
        }
        inter[p] = c;
        uni[p] = nx + ny - c;
    }
    out = Py_BuildValue("(NN)", as_bytes(inter, pairs * 8), as_bytes(uni, pairs * 8));
r4:
    PyMem_Free(tmp);
    PyMem_Free(uniq);
    PyMem_Free(inter);
    PyMem_Free(uni);
    PyBuffer_Release(&bv);
r3:
    PyBuffer_Release(&av);
r2:
    PyBuffer_Release(&sv);
r1:
    PyBuffer_Release(&hv);
    return out;
}

/* An evaluation set's n-gram hashes: sorted (unique), a directory of where each top-`dbits`
 * prefix starts, and a bit per top-`fbits` prefix present (most n-grams of a document miss
 * there, in cache). */
typedef struct {
    const uint64_t *keys;
    const int64_t *dir;
    const uint64_t *bits;
    int dbits, fbits;
} Table;

static inline int
table_has(const Table *T, uint64_t h)
{
    uint64_t f = T->fbits ? h >> (64 - T->fbits) : 0;
    if (!((T->bits[f >> 6] >> (f & 63)) & 1)) return 0;
    uint64_t p = T->dbits ? h >> (64 - T->dbits) : 0;
    for (int64_t i = T->dir[p]; i < T->dir[p + 1]; i++) {
        if (T->keys[i] == h) return 1;
        if (T->keys[i] > h) return 0;
    }
    return 0;
}

/* match(texts, n, keys, dir, dbits, bits, fbits) -> (doc, start, end) int64 bytes: the code
 * point spans of each text covered by n-grams found in the table, overlapping or touching
 * ones merged, in order. */
static PyObject *
py_match(PyObject *self, PyObject *args)
{
    PyObject *texts, *ko, *dobj, *bo;
    Py_ssize_t n;
    int dbits, fbits;
    if (!PyArg_ParseTuple(args, "O!nOOiOi", &PyList_Type, &texts, &n, &ko, &dobj, &dbits, &bo,
                          &fbits))
        return NULL;
    if (check_fold() < 0 || check_n(n) < 0) return NULL;
    if (dbits < 0 || dbits > 32 || fbits < 0 || fbits > 40) {
        PyErr_SetString(PyExc_ValueError, "bad table bits");
        return NULL;
    }
    Py_buffer kv, dv, bv;
    PyObject *out = NULL;
    Words W = {0};
    Grow D = {0}, S = {0}, E = {0};
    uint64_t *g = NULL;
    Py_ssize_t gcap = 0;
    if (get_array(ko, &kv, 8, -1, 0, "keys") < 0) return NULL;
    if (get_array(dobj, &dv, 8, ((Py_ssize_t)1 << dbits) + 1, 0, "dir") < 0) goto r1;
    if (get_array(bo, &bv, 8, fbits >= 6 ? ((Py_ssize_t)1 << (fbits - 6)) : 1, 0, "bits") < 0)
        goto r2;
    Table T = {kv.buf, dv.buf, bv.buf, dbits, fbits};
    Py_ssize_t nkeys = kv.len / 8, ndir = ((Py_ssize_t)1 << dbits);
    for (Py_ssize_t i = 0; i <= ndir; i++) {
        if (T.dir[i] < 0 || T.dir[i] > nkeys || (i && T.dir[i] < T.dir[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "the table's directory is not ascending");
            goto r3;
        }
    }
    for (Py_ssize_t d = 0; d < PyList_GET_SIZE(texts); d++) {
        PyObject *t = PyList_GET_ITEM(texts, d);
        if (!PyUnicode_Check(t)) {
            PyErr_Format(PyExc_TypeError, "text %zd is not a str", d);
            goto r4;
        }
        if (text_words(t, &W) < 0) goto r4;
        Py_ssize_t m = gram_count(W.n, n, 0);
        if (m > gcap) {
            PyMem_Free(g);
            gcap = m * 2;
            g = PyMem_Malloc(gcap * 8);
            if (!g) {
                PyErr_NoMemory();
                goto r4;
            }
        }
        gram_hashes(&W, n, 0, g);
        int64_t cs = -1, ce = -1;
        for (Py_ssize_t j = 0; j <= m; j++) {
            int hit = j < m && table_has(&T, g[j]);
            int64_t s = hit ? W.w[j].start : 0, e = hit ? W.w[j + n - 1].end : 0;
            if (hit && cs >= 0 && s <= ce) {
                if (e > ce) ce = e;
                continue;
            }
            if ((hit || j == m) && cs >= 0) {
                if (grow(&D, D.n + 1) < 0 || grow(&S, S.n + 1) < 0 || grow(&E, E.n + 1) < 0) {
                    PyErr_NoMemory();
                    goto r4;
                }
                D.p[D.n++] = (uint64_t)d;
                S.p[S.n++] = (uint64_t)cs;
                E.p[E.n++] = (uint64_t)ce;
                cs = -1;
            }
            if (hit) {
                cs = s;
                ce = e;
            }
        }
    }
    out = Py_BuildValue("(NNN)", as_bytes(D.p, D.n * 8), as_bytes(S.p, S.n * 8),
                        as_bytes(E.p, E.n * 8));
r4:
    PyMem_Free(W.w);
    PyMem_Free(g);
    PyMem_Free(D.p);
    PyMem_Free(S.p);
    PyMem_Free(E.p);
r3:
    PyBuffer_Release(&bv);
r2:
    PyBuffer_Release(&dv);
r1:
    PyBuffer_Release(&kv);
    return out;
}

static PyMethodDef methods[] = {
    {"set_fold", py_set_fold, METH_O, "set_fold(table): the BMP fold table (65536 uint32)."},
    {"grams", py_grams, METH_VARARGS, "grams(texts, n, short) -> (counts, hashes) bytes."},
    {"spans", py_spans, METH_VARARGS, "spans(text, n) -> (hashes, starts, ends) bytes."},
    {"sign", py_sign, METH_VARARGS,
     "sign(texts, n, a, b, rows, key_seed, keep) -> (keys, counts, hashes or None)."},
    {"jaccard", py_jaccard, METH_VARARGS,
     "jaccard(hashes, starts, ia, ib) -> (inter, union) bytes."},
    {"match", py_match, METH_VARARGS,
     "match(texts, n, keys, dir, dbits, bits, fbits) -> (doc, start, end) bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "lmdata._native.minhash",
                                    "Near-duplicate and contamination kernels.", -1, methods};

PyMODINIT_FUNC
PyInit_minhash(void)
{
#ifdef X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        sig_update = sig_avx512;
    else if (__builtin_cpu_supports("avx2"))
        sig_update = sig_avx2;
#endif
    return native_module(&module);
}
