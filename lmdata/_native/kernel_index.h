/* Where a batch's rows are, for kernel.c (included there, once): the loader's shuffle
 * (a Feistel permutation, lmdata/loader/shuffle.py) and the lookup of windows in an array
 * stored in units (flat-tokens chunks), either as lists (unit_windows) or straight into a Rows
 * (rows_lookup, for the layouts that look their rows up themselves: one call per batch). */

/* splitmix64's finaliser, as shuffle.py's _mix on uint64 arrays (wrapping arithmetic). */
static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* One pass of the Feistel network over the domain of 2 * half bits (x inside it). */
static inline uint64_t
feistel_once(uint64_t x, Py_ssize_t half, uint64_t mask, const uint64_t *keys, Py_ssize_t rounds)
{
    uint64_t left = x >> half, right = x & mask;
    for (Py_ssize_t k = 0; k < rounds; k++) {
        uint64_t t = right;
        right = left ^ (mix64(right ^ keys[k]) & mask);
        left = t;
    }
    return (left << half) | right;
}

/* feistel(indices, out, n, half, keys): out[i] = the permutation of [0, n) over the domain of
 * 2 * half bits with round keys `keys` (uint64) of indices[i] (int64), cycle walking back into
 * [0, n): exactly shuffle.Permutation. False (nothing written) when an index is outside
 * [0, n) or n < 2: the caller's numpy path. A walk starts only from a value below n, so it
 * ends (the permutation's cycle through it returns to it), even if the indices are written
 * while the loop runs without the GIL. */
static PyObject *
feistel(PyObject *self, PyObject *args)
{
    PyObject *objs[3];
    Py_ssize_t n, half;
    if (!PyArg_ParseTuple(args, "OOnnO", &objs[0], &objs[1], &n, &half, &objs[2])) return NULL;
    if (n < 2 || half < 1 || half > 32 || (half < 32 && (uint64_t)n > (1ULL << (2 * half))))
        Py_RETURN_FALSE;
    Py_buffer v[3];
    for (int k = 0; k < 3; k++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (k == 1 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[k], &v[k], flags) < 0) {
            release(v, k);
            return NULL;
        }
        if (check_items(&v[k], 8, k) < 0) {
            release(v, k + 1);
            return NULL;
        }
    }
    Py_ssize_t count = v[0].len / 8, rounds = v[2].len / 8;
    if (v[1].len != v[0].len) {
        release(v, 3);
        PyErr_SetString(PyExc_ValueError, "out must have one item per index");
        return NULL;
    }
    const int64_t *in = (const int64_t *)v[0].buf;
    for (Py_ssize_t i = 0; i < count; i++)
        if (in[i] < 0 || in[i] >= n) {
            release(v, 3);
            Py_RETURN_FALSE;
        }
    int64_t *out = (int64_t *)v[1].buf;
    const uint64_t *keys = (const uint64_t *)v[2].buf;
    const uint64_t mask = half == 32 ? 0xFFFFFFFFULL : (1ULL << half) - 1, un = (uint64_t)n;
    Py_BEGIN_ALLOW_THREADS
    /* a block of values at a time, in a local array, each pass one step of the walk for all
     * still outside [0, n): independent values, so the CPU overlaps their multiplies (one
     * walk at a time, a chain of them, measured 1.4x slower) */
    uint64_t x[64];
    for (Py_ssize_t i0 = 0; i0 < count; i0 += 64) {
        Py_ssize_t m = count - i0 < 64 ? count - i0 : 64;
        for (Py_ssize_t i = 0; i < m; i++) {
            x[i] = (uint64_t)in[i0 + i];
            if (x[i] >= un) x[i] = 0; /* (changed meanwhile: a value below n keeps it finite) */
        }
        for (Py_ssize_t i = 0; i < m; i++) x[i] = feistel_once(x[i], half, mask, keys, rounds);
        for (int todo = 1; todo;) {
            todo = 0;
            for (Py_ssize_t i = 0; i < m; i++)
                if (x[i] >= un) {
                    x[i] = feistel_once(x[i], half, mask, keys, rounds);
                    todo = 1;
                }
        }
        for (Py_ssize_t i = 0; i < m; i++) out[i0 + i] = (int64_t)x[i];
    }
    Py_END_ALLOW_THREADS
    release(v, 3);
    Py_RETURN_TRUE;
}

/* Where window s * scale .. + width of an array stored in units of `unit` 4-byte items lies:
 * 0 (found: *vp a new reference to its unit's buffer object from `views`, *b that buffer, to
 * release, *off the window's byte offset in it), 1 (declined: outside 0 .. total, straddling
 * two units, past the end of a short unit: the caller's general path), 2 (the unit is not in
 * `views`: *missing its number) or -1 (an error set). The caller checked 0 < width <= unit,
 * width <= total, unit <= PY_SSIZE_T_MAX / 4 and scale > 0. */
static int
window_at(PyObject *views, Py_ssize_t unit, int64_t s, Py_ssize_t width, Py_ssize_t total,
          Py_ssize_t scale, PyObject **vp, Py_buffer *b, Py_ssize_t *off, Py_ssize_t *missing)
{
    /* (0 < width <= total: no wrap; s <= (total - width) / scale: the product neither) */
    if (s < 0 || s > (total - width) / scale) return 1;
    Py_ssize_t at = (Py_ssize_t)s * scale;
    Py_ssize_t u = at / unit, o = at % unit;
    if (o + width > unit) return 1; /* (both <= unit <= PY_SSIZE_T_MAX / 4: no wrap) */
    PyObject *key = PyLong_FromSsize_t(u);
    if (key == NULL) return -1;
    PyObject *v = PyDict_GetItemWithError(views, key); /* borrowed: held below */
    Py_DECREF(key);
    if (v == NULL) {
        if (PyErr_Occurred()) return -1;
        *missing = u;
        return 2;
    }
    Py_INCREF(v); /* exporting a buffer may run code that changes `views` */
    if (PyObject_GetBuffer(v, b, PyBUF_SIMPLE) < 0) {
        Py_DECREF(v);
        return -1;
    }
    if ((o + width) * 4 > b->len || (((uintptr_t)b->buf) & 3u)) { /* a short unit */
        PyBuffer_Release(b);
        Py_DECREF(v);
        return 1;
    }
    *vp = v;
    *off = o * 4;
    return 0;
}

/* The checks every lookup makes before window_at: False (the general path) when they fail. */
static int
lookup_ok(Py_ssize_t unit, Py_ssize_t width, Py_ssize_t total, Py_ssize_t scale)
{
    return unit > 0 && unit <= PY_SSIZE_T_MAX / 4 && width > 0 && width <= unit &&
           width <= total && scale > 0;
}

/* The int64 starts of a lookup (the caller releases sv). */
static int
get_starts(PyObject *obj, Py_buffer *sv)
{
    if (PyObject_GetBuffer(obj, sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (sv->itemsize != 8 || ((uintptr_t)sv->buf & 7u)) {
        PyBuffer_Release(sv);
        PyErr_SetString(PyExc_ValueError, "starts must be int64");
        return -1;
    }
    return 0;
}

/* unit_windows(views, unit, starts, width, total[, scale]): where items s .. s + width of an
 * array stored in units of `unit` items lie, for each s = start * scale, start in `starts`
 * (int64: row numbers when scale is the row length; each window must lie in 0 .. total, else
 * False): (bases, offsets) as rows_get takes them, from `views`, which maps a unit's number to
 * a buffer of its bytes (4-byte items). Returns a list of the unit numbers missing from
 * `views` instead (the caller adds them and calls again), or False when a window straddles
 * two units or a unit is short (the caller's general path). The per-window lookup in C:
 * Python arithmetic per window costs more than copying it. */
static PyObject *
unit_windows(PyObject *self, PyObject *args)
{
    PyObject *views, *obj;
    Py_ssize_t unit, width, total, scale = 1;
    if (!PyArg_ParseTuple(args, "O!nOnn|n", &PyDict_Type, &views, &unit, &obj, &width, &total,
                          &scale))
        return NULL;
    if (!lookup_ok(unit, width, total, scale)) Py_RETURN_FALSE;
    Py_buffer sv;
    if (get_starts(obj, &sv) < 0) return NULL;
    Py_ssize_t rows = sv.len / 8;
    const int64_t *st = (const int64_t *)sv.buf;
    PyObject *result = NULL, *missing = NULL, *bases = PyList_New(rows),
             *offsets = PyList_New(rows);
    if (bases == NULL || offsets == NULL) goto done;
    for (Py_ssize_t r = 0; r < rows; r++) {
        PyObject *v;
        Py_buffer b;
        Py_ssize_t off, u;
        int got = window_at(views, unit, st[r], width, total, scale, &v, &b, &off, &u);
        if (got < 0) goto done;
        if (got == 1) {
            result = Py_NewRef(Py_False);
            goto done;
        }
        if (got == 2) {
            PyObject *key = PyLong_FromSsize_t(u);
            int bad = key == NULL ||
                      (missing == NULL && (missing = PyList_New(0)) == NULL) ||
                      PyList_Append(missing, key) < 0;
            Py_XDECREF(key);
            if (bad) goto done;
            v = Py_NewRef(Py_None);
            off = 0;
        } else
            PyBuffer_Release(&b);
        PyObject *ob = PyLong_FromSsize_t(off);
        if (ob == NULL) {
            Py_DECREF(v);
            goto done;
        }
        PyList_SET_ITEM(bases, r, v); /* (steals the reference held) */
        PyList_SET_ITEM(offsets, r, ob);
    }
    result = missing != NULL ? Py_NewRef(missing) : PyTuple_Pack(2, bases, offsets);
done:
    Py_XDECREF(missing);
    Py_XDECREF(bases);
    Py_XDECREF(offsets);
    PyBuffer_Release(&sv);
    return result;
}

/* rows_lookup: unit_windows straight into R (as rows_get fills it; each row's unit buffer
 * held): 0 (R filled), 1 (declined, R empty), 2 (units missing: *missing a new list of their
 * numbers, R empty) or -1 (an error set, R empty). */
static int
rows_lookup(PyObject *views, Py_ssize_t unit, const Py_buffer *sv, Py_ssize_t width,
            Py_ssize_t total, Py_ssize_t scale, Rows *R, PyObject **missing)
{
    Py_ssize_t rows = sv->len / 8;
    const int64_t *st = (const int64_t *)sv->buf;
    R->base = NULL;
    R->width = width;
    R->nheld = 0;
    R->held = alloc_items(rows, sizeof(Py_buffer));
    R->row = alloc_items(rows, sizeof(uint32_t *));
    *missing = NULL;
    if (R->held == NULL || R->row == NULL) {
        rows_release(R);
        PyErr_NoMemory();
        return -1;
    }
    int status = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        PyObject *v;
        Py_ssize_t off, u;
        int got = window_at(views, unit, st[r], width, total, scale, &v, &R->held[R->nheld],
                            &off, &u);
        if (got == 0) {
            Py_DECREF(v); /* (the held buffer keeps its exporter alive) */
            R->row[r] = (const uint32_t *)((const char *)R->held[R->nheld].buf + off);
            R->nheld++;
            continue;
        }
        if (got == 2) { /* every missing unit, then ask for them at once */
            PyObject *key = PyLong_FromSsize_t(u);
            int bad = key == NULL ||
                      (*missing == NULL && (*missing = PyList_New(0)) == NULL) ||
                      PyList_Append(*missing, key) < 0;
            Py_XDECREF(key);
            if (!bad) {
                status = 2;
                continue;
            }
            got = -1;
        }
        status = got;
        break;
    }
    if (status != 2) Py_CLEAR(*missing);
    if (status != 0) rows_release(R);
    return status;
}
