/* The Loader's row layouts (lmdata/loader/packing.py) in one pass each, with the GIL released,
 * the flat-tokens reader's row gather (copy_rows) and best-fit packing (kernel_bestfit.h).
 * packed_at and eos_at also look their rows up (a batch in one call); the lookups and the
 * shuffle are in kernel_index.h.
 *
 * Each function takes the stored values of a batch's rows (uint32: one C-order array, or each
 * row where it lies in a mapped chunk, see rows_get) and writes its output arrays in place
 * (inputs/targets int32 or int64, segment_ids/positions int32, loss_mask uint8). Every buffer
 * and row is checked against (rows, length) before the loop, so the loop reads and writes
 * nothing outside them; packing.py runs the same layouts in numpy where no compiler built
 * this module, and the tests compare the two. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native.h"
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* A buffer's items must be `itemsize` bytes, aligned to it: the loops read and write them as
 * such (a view of other items, or unaligned memory, is refused rather than misread). */
static int
check_items(const Py_buffer *v, Py_ssize_t itemsize, int k)
{
    if (v->itemsize != itemsize || ((uintptr_t)v->buf % (uintptr_t)itemsize)) {
        PyErr_Format(PyExc_ValueError,
                     "buffer %d has %zd-byte items, expected %zd-byte items aligned to %zd", k,
                     v->itemsize, itemsize, itemsize);
        return -1;
    }
    return 0;
}

/* Get the buffers of `objs` (writable ones for the outputs), check their byte lengths and
 * item sizes; on failure release what was got and set an error. */
static int
get_buffers(PyObject **objs, Py_buffer *views, const Py_ssize_t *sizes,
            const Py_ssize_t *itemsizes, const int *writable, int count)
{
    for (int k = 0; k < count; k++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable[k] ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[k], &views[k], flags) < 0) {
            for (int j = 0; j < k; j++) PyBuffer_Release(&views[j]);
            return -1;
        }
        if (views[k].len != sizes[k]) {
            PyErr_Format(PyExc_ValueError, "buffer %d has %zd bytes, expected %zd", k,
                         views[k].len, sizes[k]);
            for (int j = 0; j <= k; j++) PyBuffer_Release(&views[j]);
            return -1;
        }
        if (check_items(&views[k], itemsizes[k], k) < 0) {
            for (int j = 0; j <= k; j++) PyBuffer_Release(&views[j]);
            return -1;
        }
    }
    return 0;
}

static void
release(Py_buffer *views, int count)
{
    for (int k = 0; k < count; k++) PyBuffer_Release(&views[k]);
}

/* rows * length * 8 and rows * 8 (the int64 offsets of unpacked) must not wrap. */
static int
check_shape(Py_ssize_t rows, Py_ssize_t length)
{
    if (rows < 0 || length < 0 || rows > PY_SSIZE_T_MAX / 8 ||
        (length > 0 && rows > PY_SSIZE_T_MAX / 8 / length)) {
        PyErr_SetString(PyExc_ValueError, "bad shape");
        return -1;
    }
    return 0;
}

/* The rows a layout reads: `enc` is either one C-contiguous buffer of rows * width uint32
 * values, or a pair of lists (bases, offsets): row r is the `width` values at byte offsets[r]
 * of the buffer bases[r] (rows read where they lie, in mapped chunks: no gather copy). Every
 * row is checked to lie inside its buffer, aligned to 4; the buffers are held until
 * rows_release, so the rows can be read with the GIL released. One buffer needs no
 * per-row memory (row r is base + r * width): however many rows, nothing is allocated for
 * them beyond what the lists themselves hold. */
typedef struct {
    const uint32_t **row; /* the pair of lists: each row's start */
    const uint32_t *base; /* one buffer */
    Py_ssize_t width;
    Py_buffer *held;
    Py_ssize_t nheld;
} Rows;

static inline const uint32_t *
row_at(const Rows *R, Py_ssize_t r)
{
    return R->row ? R->row[r] : R->base + r * R->width;
}

static void
rows_release(Rows *R)
{
    for (Py_ssize_t k = 0; k < R->nheld; k++) PyBuffer_Release(&R->held[k]);
    PyMem_Free(R->held);
    PyMem_Free((void *)R->row);
    R->held = NULL;
    R->row = NULL;
    R->nheld = 0;
}

/* Room for n items of `size` bytes, uninitialised (only the first R->nheld buffers and, once
 * filled, the rows are ever read: zeroing a batch's 32 Py_buffers cost more than the lookup of
 * a row); NULL on overflow or without memory. */
static void *
alloc_items(Py_ssize_t n, size_t size)
{
    if (n < 1) n = 1;
    if ((size_t)n > (size_t)PY_SSIZE_T_MAX / size) return NULL;
    return PyMem_Malloc((size_t)n * size);
}

static int
rows_get(PyObject *enc, Py_ssize_t rows, Py_ssize_t width, Rows *R)
{
    R->nheld = 0;
    R->row = NULL;
    R->base = NULL;
    R->width = width;
    R->held = PyMem_Calloc(1, sizeof(Py_buffer));
    if (R->held == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!PyTuple_Check(enc)) {
        Py_ssize_t size = rows * width * 4;
        int bad = PyObject_GetBuffer(enc, &R->held[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0;
        if (!bad) {
            R->nheld = 1;
            if (R->held[0].len != size) {
                PyErr_Format(PyExc_ValueError, "buffer 0 has %zd bytes, expected %zd",
                             R->held[0].len, size);
                bad = 1;
            } else
                bad = check_items(&R->held[0], 4, 0) < 0;
        }
        if (bad) {
            rows_release(R);
            return -1;
        }
        R->base = (const uint32_t *)R->held[0].buf;
        return 0;
    }
    PyObject *bl, *ol;
    if (!PyArg_ParseTuple(enc, "O!O!", &PyList_Type, &bl, &PyList_Type, &ol)) {
        rows_release(R);
        return -1;
    }
    /* tuples of the items: a buffer export may run code that changes the lists, not these */
    PyObject *bases = PySequence_Tuple(bl), *offsets = bases ? PySequence_Tuple(ol) : NULL;
    if (offsets == NULL) {
        Py_XDECREF(bases);
        rows_release(R);
        return -1;
    }
    int bad = PyTuple_GET_SIZE(bases) != rows || PyTuple_GET_SIZE(offsets) != rows;
    if (bad)
        PyErr_SetString(PyExc_ValueError, "one base and one offset per row");
    else { /* (rows is now bounded by the lists' lengths) */
        PyMem_Free(R->held);
        R->held = alloc_items(rows, sizeof(Py_buffer));
        R->row = alloc_items(rows, sizeof(uint32_t *));
        if (R->held == NULL || R->row == NULL) {
            PyErr_NoMemory();
            bad = 1;
        }
    }
    for (Py_ssize_t r = 0; r < rows && !bad; r++) {
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, r));
        Py_buffer *b = &R->held[R->nheld];
        if ((off == -1 && PyErr_Occurred()) ||
            PyObject_GetBuffer(PyTuple_GET_ITEM(bases, r), b, PyBUF_SIMPLE) < 0) {
            bad = 1;
            break;
        }
        R->nheld++;
        if (off < 0 || off > b->len || width * 4 > b->len - off ||
            (((uintptr_t)b->buf + (uintptr_t)off) & 3u)) {
            PyErr_Format(PyExc_ValueError,
                         "row %zd: %zd bytes at offset %zd are outside its %zd-byte buffer "
                         "or not aligned to 4",
                         r, width * 4, off, b->len);
            bad = 1;
            break;
        }
        R->row[r] = (const uint32_t *)((const char *)b->buf + off);
    }
    Py_DECREF(bases);
    Py_DECREF(offsets);
    if (bad) {
        rows_release(R);
        return -1;
    }
    return 0;
}

/* The per-row loops (packed, eos, unpacked; SSE2/AVX2 where the CPU has them). */
#include "kernel_rows.h"

/* The shuffle and the lookups of where windows lie (unit_windows, rows_lookup). */
#include "kernel_index.h"

/* A value written into int32 outputs (wide false) must fit them: refused, never truncated. */
static int
check_value(long long x, int wide, const char *what)
{
    if (!wide && (x < INT32_MIN || x > INT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "%s %lld does not fit int32 outputs", what, x);
        return -1;
    }
    return 0;
}

/* Best-fit packing and the layout of rows made of segments (the Loader's bestfit mode). */
#include "kernel_bestfit.h"

/* The packed layout of R's rows into the outputs v[1..4] (checked against rows x length). */
static void
run_packed(const Rows *R, Py_buffer *v, Py_ssize_t rows, Py_ssize_t length, long long bos,
           int wide)
{
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < (length ? rows : 0); r++) /* (empty rows: nothing to do) */
        packed_row(row_at(R, r), v, r * length, length, bos, wide,
                   r + 1 < rows ? row_at(R, r + 1) : NULL);
    Py_END_ALLOW_THREADS
}

/* The eos layout of R's rows (length + 1 values each) into the outputs v[0..1]. */
static void
run_eos(const Rows *R, Py_buffer *v, Py_ssize_t rows, Py_ssize_t length, int wide)
{
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < (length ? rows : 0); r++) {
        const uint32_t *e = row_at(R, r);
        if (wide) {
            int64_t *in = (int64_t *)v[0].buf + r * length, *tg = (int64_t *)v[1].buf + r * length;
            for (Py_ssize_t j = 0; j < length; j++) {
                in[j] = (int64_t)(e[j] >> 1);
                tg[j] = (int64_t)(e[j + 1] >> 1);
            }
        } else {
            int32_t *in = (int32_t *)v[0].buf + r * length, *tg = (int32_t *)v[1].buf + r * length;
            Py_ssize_t j = 0;
#ifdef HAVE_AVX2_ROW
            if (max_simd >= 2 && has_avx2())
                j = eos_row_int32_avx2(e, in, tg, length, r + 1 < rows ? row_at(R, r + 1) : NULL);
#endif
            for (; j < length; j++) {
                in[j] = (int32_t)(e[j] >> 1);
                tg[j] = (int32_t)(e[j + 1] >> 1);
            }
        }
    }
    Py_END_ALLOW_THREADS
}

/* packed(enc, inputs, targets, segment_ids, positions, rows, length, bos, wide): the packed
 * layout of rows of `length` stored values (see rows_get). */
static PyObject *
packed(PyObject *self, PyObject *args)
{
    PyObject *enc, *objs[4];
    Py_ssize_t rows, length;
    long long bos;
    int wide;
    if (!PyArg_ParseTuple(args, "OOOOOnnLp", &enc, &objs[0], &objs[1], &objs[2], &objs[3],
                          &rows, &length, &bos, &wide))
        return NULL;
    if (check_shape(rows, length) < 0 || check_value(bos, wide, "bos") < 0) return NULL;
    Py_ssize_t n = rows * length, w = wide ? 8 : 4;
    Py_ssize_t sizes[5] = {0, n * w, n * w, n * 4, n * 4}, items[5] = {0, w, w, 4, 4};
    int writable[5] = {0, 1, 1, 1, 1};
    Py_buffer v[5]; /* v[0] unused: packed_row takes the outputs as v[1..4] */
    Rows R;
    if (get_buffers(objs, v + 1, sizes + 1, items + 1, writable + 1, 4) < 0) return NULL;
    if (rows_get(enc, rows, length, &R) < 0) {
        release(v + 1, 4);
        return NULL;
    }
    run_packed(&R, v, rows, length, bos, wide);
    rows_release(&R);
    release(v + 1, 4);
    Py_RETURN_NONE;
}

/* eos(enc, inputs, targets, rows, length, wide): rows of length + 1 stored values (see
 * rows_get); inputs = w[:-1] >> 1, targets = w[1:] >> 1. */
static PyObject *
eos(PyObject *self, PyObject *args)
{
    PyObject *enc, *objs[2];
    Py_ssize_t rows, length;
    int wide;
    if (!PyArg_ParseTuple(args, "OOOnnp", &enc, &objs[0], &objs[1], &rows, &length, &wide))
        return NULL;
    if (length < 0 || length == PY_SSIZE_T_MAX || check_shape(rows, length + 1) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad shape");
        return NULL;
    }
    Py_ssize_t n = rows * length, w = wide ? 8 : 4;
    Py_ssize_t sizes[2] = {n * w, n * w}, items[2] = {w, w};
    int writable[2] = {1, 1};
    Py_buffer v[2];
    Rows R;
    if (get_buffers(objs, v, sizes, items, writable, 2) < 0) return NULL;
    if (rows_get(enc, rows, length + 1, &R) < 0) {
        release(v, 2);
        return NULL;
    }
    run_eos(&R, v, rows, length, wide);
    rows_release(&R);
    release(v, 2);
    Py_RETURN_NONE;
}

/* The rows of a layout looked up by the layout itself (packed_at, eos_at): one call per batch
 * from row numbers, no lists of where rows lie. `objs` are the nout outputs (4: packed, rows x
 * width; 2: eos, rows x (width - 1)). True when laid out; False (outputs untouched) where
 * unit_windows declines; the list of missing units where it asks for them. */
static PyObject *
lay_out_at(PyObject *views, Py_ssize_t unit, PyObject *starts, Py_ssize_t width,
           Py_ssize_t total, Py_ssize_t scale, PyObject **objs, int nout, long long bos,
           int wide)
{
    if (!lookup_ok(unit, width, total, scale)) Py_RETURN_FALSE;
    if (nout == 4 && check_value(bos, wide, "bos") < 0) return NULL;
    Py_buffer sv;
    if (get_starts(starts, &sv) < 0) return NULL;
    Py_ssize_t rows = sv.len / 8, length = nout == 4 ? width : width - 1;
    if (check_shape(rows, width) < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    Py_ssize_t n = rows * length, w = wide ? 8 : 4;
    Py_ssize_t sizes[5] = {0, n * w, n * w, n * 4, n * 4}, items[5] = {0, w, w, 4, 4};
    int writable[5] = {0, 1, 1, 1, 1};
    Py_buffer v[5]; /* packed_row takes the outputs as v[1..4], run_eos as v[0..1] */
    Py_buffer *out = nout == 4 ? v + 1 : v;
    if (get_buffers(objs, out, sizes + 1, items + 1, writable + 1, nout) < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    Rows R;
    PyObject *missing;
    int got = rows_lookup(views, unit, &sv, width, total, scale, &R, &missing);
    PyObject *result = NULL;
    if (got == 0) {
        if (nout == 4)
            run_packed(&R, v, rows, length, bos, wide);
        else
            run_eos(&R, v, rows, length, wide);
        rows_release(&R);
        result = Py_NewRef(Py_True);
    } else if (got == 1)
        result = Py_NewRef(Py_False);
    else if (got == 2)
        result = missing;
    release(out, nout);
    PyBuffer_Release(&sv);
    return result;
}

/* packed_at(views, unit, starts, width, total, scale, inputs, targets, segment_ids, positions,
 * bos, wide): the packed layout (rows of `width` values) of the windows unit_windows finds. */
static PyObject *
packed_at(PyObject *self, PyObject *args)
{
    PyObject *views, *starts, *objs[4];
    Py_ssize_t unit, width, total, scale;
    long long bos;
    int wide;
    if (!PyArg_ParseTuple(args, "O!nOnnnOOOOLp", &PyDict_Type, &views, &unit, &starts, &width,
                          &total, &scale, &objs[0], &objs[1], &objs[2], &objs[3], &bos, &wide))
        return NULL;
    return lay_out_at(views, unit, starts, width, total, scale, objs, 4, bos, wide);
}

/* eos_at(views, unit, starts, width, total, scale, inputs, targets, wide): the eos layout
 * (windows of `width` = length + 1 values) of the windows unit_windows finds. */
static PyObject *
eos_at(PyObject *self, PyObject *args)
{
    PyObject *views, *starts, *objs[2];
    Py_ssize_t unit, width, total, scale;
    int wide;
    if (!PyArg_ParseTuple(args, "O!nOnnnOOp", &PyDict_Type, &views, &unit, &starts, &width,
                          &total, &scale, &objs[0], &objs[1], &wide))
        return NULL;
    return lay_out_at(views, unit, starts, width, total, scale, objs, 2, 0, wide);
}

/* unpacked(enc, offsets, lengths, inputs, targets, segment_ids, positions, loss_mask, rows,
 * length, bos, pad, shift, wide): rows of `length` values (see rows_get); row i's piece is
 * row[i][off[i] : off[i] + len[i]] >> shift (int64 offsets and lengths, checked to lie inside
 * the row), right-padded with pad. */
static PyObject *
unpacked(PyObject *self, PyObject *args)
{
    PyObject *enc, *objs[7];
    Py_ssize_t rows, length;
    long long bos, pad;
    int shift, wide;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnnLLip", &enc, &objs[0], &objs[1], &objs[2],
                          &objs[3], &objs[4], &objs[5], &objs[6], &rows, &length, &bos, &pad,
                          &shift, &wide))
        return NULL;
    if (check_shape(rows, length) < 0 || check_value(bos, wide, "bos") < 0 ||
        check_value(pad, wide, "pad") < 0)
        return NULL;
    if (shift < 0 || shift > 31) {
        PyErr_SetString(PyExc_ValueError, "shift must be in 0..31");
        return NULL;
    }
    Py_ssize_t n = rows * length, w = wide ? 8 : 4;
    Py_ssize_t sizes[7] = {rows * 8, rows * 8, n * w, n * w, n * 4, n * 4, n};
    Py_ssize_t items[7] = {8, 8, w, w, 4, 4, 1};
    int writable[7] = {0, 0, 1, 1, 1, 1, 1};
    Py_buffer v[7];
    Rows R;
    if (get_buffers(objs, v, sizes, items, writable, 7) < 0) return NULL;
    /* the pieces are checked in a copy, and only the copy is used: the loop runs without the
     * GIL, and the offsets/lengths memory may be written meanwhile (even by the loop itself) */
    Py_ssize_t *piece = PyMem_Malloc((size_t)(rows ? rows : 1) * 2 * sizeof(Py_ssize_t));
    if (piece == NULL) {
        release(v, 7);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t o = ((const int64_t *)v[0].buf)[r], k = ((const int64_t *)v[1].buf)[r];
        if (o < 0 || k < 0 || o > length || k > length - o) {
            release(v, 7);
            PyMem_Free(piece);
            PyErr_Format(PyExc_ValueError, "row %zd: piece %lld+%lld outside its %zd values", r,
                         (long long)o, (long long)k, length);
            return NULL;
        }
        piece[2 * r] = (Py_ssize_t)o;
        piece[2 * r + 1] = (Py_ssize_t)k;
    }
    if (rows_get(enc, rows, length, &R) < 0) {
        release(v, 7);
        PyMem_Free(piece);
        return NULL;
    }
    int32_t *seg = (int32_t *)v[4].buf, *pos = (int32_t *)v[5].buf;
    uint8_t *mask = (uint8_t *)v[6].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t b = r * length;
        const uint32_t *src = row_at(&R, r) + piece[2 * r];
        Py_ssize_t k = piece[2 * r + 1];
        if (wide)
            unpacked_row_int64_t(src, k, (int64_t *)v[2].buf + b, (int64_t *)v[3].buf + b,
                                 seg + b, pos + b, mask + b, length, bos, pad, shift);
#ifdef HAVE_AVX2_ROW
        else if (max_simd >= 2 && has_avx2())
            unpacked_row_int32_avx2(src, k, (int32_t *)v[2].buf + b, (int32_t *)v[3].buf + b,
                                    seg + b, pos + b, mask + b, length, (int32_t)bos,
                                    (int32_t)pad, shift);
#endif
        else
            unpacked_row_int32_t(src, k, (int32_t *)v[2].buf + b, (int32_t *)v[3].buf + b,
                                 seg + b, pos + b, mask + b, length, (int32_t)bos,
                                 (int32_t)pad, shift);
    }
    Py_END_ALLOW_THREADS
    rows_release(&R);
    release(v, 7);
    PyMem_Free(piece);
    Py_RETURN_NONE;
}

/* copy_rows(enc, out, rows, width): the rows (see rows_get) copied into `out`, a C-contiguous
 * array of rows * width uint32 values: a gather from mapped chunks with the GIL released. */
static PyObject *
copy_rows(PyObject *self, PyObject *args)
{
    PyObject *enc, *obj;
    Py_ssize_t rows, width;
    if (!PyArg_ParseTuple(args, "OOnn", &enc, &obj, &rows, &width)) return NULL;
    if (check_shape(rows, width) < 0) return NULL;
    Py_ssize_t size = rows * width * 4, item = 4;
    int writable = 1;
    Py_buffer v;
    Rows R;
    if (get_buffers(&obj, &v, &size, &item, &writable, 1) < 0) return NULL;
    if (rows_get(enc, rows, width, &R) < 0) {
        release(&v, 1);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < (width ? rows : 0); r++)
        memcpy((uint32_t *)v.buf + r * width, row_at(&R, r), (size_t)width * 4);
    Py_END_ALLOW_THREADS
    rows_release(&R);
    release(&v, 1);
    Py_RETURN_NONE;
}

/* simd(level): the widest vector rows used from now on (2: AVX2 where the CPU has it, 1: SSE2);
 * returns the level used before. For the tests, which compare every row with numpy. */
static PyObject *
simd(PyObject *self, PyObject *args)
{
    int level;
    if (!PyArg_ParseTuple(args, "i", &level)) return NULL;
#ifdef HAVE_AVX2_ROW
    int before = max_simd >= 2 && has_avx2() ? 2 : 1;
    max_simd = level;
#else
    int before = 1;
#endif
    return PyLong_FromLong(before);
}

static PyMethodDef methods[] = {
    {"simd", simd, METH_VARARGS,
     "simd(level): the widest vector row used (2: AVX2 where present, 1: SSE2); returns the "
     "level before."},
    {"unit_windows", unit_windows, METH_VARARGS,
     "unit_windows(views, unit, starts, width, total[, scale]): (bases, offsets) of windows "
     "at starts * scale of a unit-stored array, or the missing units, or False."},
    {"feistel", feistel, METH_VARARGS,
     "feistel(indices, out, n, half, keys): shuffle.Permutation of int64 indices into out; "
     "False for indices outside [0, n)."},
    {"packed_at", packed_at, METH_VARARGS,
     "packed_at(views, unit, starts, width, total, scale, inputs, targets, segment_ids, "
     "positions, bos, wide): packed of the windows unit_windows finds; True, False or the "
     "missing units."},
    {"eos_at", eos_at, METH_VARARGS,
     "eos_at(views, unit, starts, width, total, scale, inputs, targets, wide): eos of the "
     "windows unit_windows finds; True, False or the missing units."},
    {"best_fit", best_fit, METH_VARARGS,
     "best_fit(sizes, capacity, max_bins, bins): best-fit decreasing of int64 sizes into at "
     "most max_bins rows; bins[i] (int32) the row of item i or -1; returns the rows opened."},
    {"segments_at", segments_at, METH_VARARGS,
     "segments_at(views, unit, starts, width, total, scale, offsets, lengths, seg_rows, inputs, "
     "targets, segment_ids, positions, loss_mask, rows, length, bos, pad, wide): segments of "
     "the windows unit_windows finds; True, False or the missing units."},
    {"segments", segments, METH_VARARGS,
     "segments(enc, width, offsets, lengths, seg_rows, inputs, targets, segment_ids, "
     "positions, loss_mask, rows, length, bos, pad, shift, wide): rows of segments laid end "
     "to end, right-padded."},
    {"copy_rows", copy_rows, METH_VARARGS,
     "copy_rows(enc, out, rows, width): rows of width uint32 values copied into out."},
    {"packed", packed, METH_VARARGS,
     "packed(enc, inputs, targets, segment_ids, positions, rows, length, bos, wide): the "
     "packed layout of stored values enc (id*2 + start bit)."},
    {"eos", eos, METH_VARARGS,
     "eos(enc, inputs, targets, rows, length, wide): inputs/targets of windows of length + 1 "
     "stored values."},
    {"unpacked", unpacked, METH_VARARGS,
     "unpacked(ids, offsets, lengths, inputs, targets, segment_ids, positions, loss_mask, rows, "
     "length, bos, pad, shift, wide): one piece per row, right-padded."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "lmdata._native.kernel",
                                    "The Loader's row layouts in C.", -1, methods};

PyMODINIT_FUNC
PyInit_kernel(void)
{
    return native_module(&module);
}
