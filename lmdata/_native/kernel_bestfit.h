/* Best-fit packing for the Loader's "bestfit" mode (lmdata/loader/bestfit.py), included once by
 * kernel.c: best_fit() assigns items to rows, segments() lays a batch's rows out from
 * their segments. bestfit.py runs the same in Python where no compiler built this module, and
 * the tests compare the two: both must give the same rows for the same items. */

/* best_fit(sizes, capacity, max_bins, starts, members): best-fit decreasing of items of `sizes`
 * (int64, each in 1 .. capacity) into at most `max_bins` rows of `capacity`: items in order of
 * size, largest first (ties by index); each goes to the open row with the least room that holds
 * it (of several with the same room, the one that reached it last), else to a new row while
 * fewer than max_bins are open, else it is left over. Returns the rows opened, R; members
 * (int32, one per item) lists row 0's items, row 1's, ... (each row's in the order placed), then
 * the items left over (by index), and starts (int64, one more than the items) has row r's at
 * members[starts[r] : starts[r + 1]] for r < R (starts[R]: the items placed). Rooms are found
 * in a two-level bitmap over 0 .. capacity: a few word scans per item, so a block of 10^4 items
 * packs in a tenth of a millisecond. */
static PyObject *
best_fit(PyObject *self, PyObject *args)
{
    PyObject *objs[3];
    Py_ssize_t capacity, max_bins;
    if (!PyArg_ParseTuple(args, "OnnOO", &objs[0], &capacity, &max_bins, &objs[1], &objs[2]))
        return NULL;
    if (capacity < 1 || capacity > (1 << 26) || max_bins < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must be in 1 .. 2^26, max_bins >= 0");
        return NULL;
    }
    Py_buffer v[3];
    for (int k = 0; k < 3; k++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (k > 0 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[k], &v[k], flags) < 0) {
            release(v, k);
            return NULL;
        }
        if (check_items(&v[k], k < 2 ? 8 : 4, k) < 0) {
            release(v, k + 1);
            return NULL;
        }
    }
    Py_ssize_t n = v[0].len / 8;
    if (v[1].len != (n + 1) * 8 || v[2].len != n * 4) {
        release(v, 3);
        PyErr_SetString(PyExc_ValueError, "starts must have n + 1 int64, members n int32");
        return NULL;
    }
    /* the sizes are checked and copied: the loop runs without the GIL */
    const Py_ssize_t words = (capacity + 1 + 63) / 64, tops = (words + 63) / 64;
    int64_t *size = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    int64_t *count = PyMem_Calloc((size_t)capacity + 2, sizeof(int64_t));
    int32_t *order = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int32_t *head = PyMem_Malloc(((size_t)capacity + 1) * sizeof(int32_t));
    int32_t *next = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int32_t *placed = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int64_t *room = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    uint64_t *bits = PyMem_Calloc((size_t)words, sizeof(uint64_t));
    uint64_t *top = PyMem_Calloc((size_t)tops, sizeof(uint64_t));
    PyObject *result = NULL;
    if (!size || !count || !order || !head || !next || !placed || !room || !bits || !top) {
        PyErr_NoMemory();
        goto done;
    }
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many items");
        goto done;
    }
    const int64_t *in = (const int64_t *)v[0].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        size[i] = in[i];
        if (size[i] < 1 || size[i] > capacity) {
            PyErr_Format(PyExc_ValueError, "item %zd has size %lld, outside 1 .. %zd", i,
                         (long long)size[i], capacity);
            goto done;
        }
    }
    int32_t *bin = placed;
    int64_t *starts = (int64_t *)v[1].buf;
    int32_t *members = (int32_t *)v[2].buf;
    Py_ssize_t opened = 0;
    Py_BEGIN_ALLOW_THREADS
    /* counting sort, largest first, ties by index */
    for (Py_ssize_t i = 0; i < n; i++) count[capacity - size[i]]++;
    int64_t at = 0;
    for (Py_ssize_t s = 0; s <= capacity; s++) {
        int64_t c = count[s];
        count[s] = at;
        at += c;
    }
    for (Py_ssize_t i = 0; i < n; i++) order[count[capacity - size[i]]++] = (int32_t)i;
    for (Py_ssize_t r = 0; r <= capacity; r++) head[r] = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        int32_t i = order[j];
        int64_t s = size[i];
        /* the least room >= s with a row: its word, then the next non-empty word */
        Py_ssize_t w = (Py_ssize_t)(s >> 6), found = -1;
        uint64_t m = bits[w] & (~0ULL << (s & 63));
        if (m)
            found = (w << 6) + __builtin_ctzll(m);
        else {
            Py_ssize_t t = (w + 1) >> 6;
            uint64_t tm = (w + 1) < words ? top[t] & (~0ULL << ((w + 1) & 63)) : 0;
            while (!tm && ++t < tops) tm = top[t];
            if (tm) {
                Py_ssize_t w2 = (t << 6) + __builtin_ctzll(tm);
                found = (w2 << 6) + __builtin_ctzll(bits[w2]);
            }
        }
        int32_t b;
        if (found >= 0) { /* take the row off its room's list */
            b = head[found];
            head[found] = next[b];
            if (head[found] < 0) {
                bits[found >> 6] &= ~(1ULL << (found & 63));
                if (!bits[found >> 6]) top[found >> 12] &= ~(1ULL << ((found >> 6) & 63));
            }
        } else if (opened < max_bins) {
            b = (int32_t)opened++;
            room[b] = capacity;
        } else {
            bin[i] = -1;
            continue;
        }
        bin[i] = b;
        room[b] -= s;
        int64_t r = room[b];
        if (r > 0) { /* onto its new room's list */
            next[b] = head[r];
            head[r] = b;
            bits[r >> 6] |= 1ULL << (r & 63);
            top[r >> 12] |= 1ULL << ((r >> 6) & 63);
        }
    }
    /* rows as lists: each row's items in the order placed, then the items left over */
    for (Py_ssize_t r = 0; r <= opened; r++) starts[r] = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (bin[i] >= 0) starts[bin[i] + 1]++;
    for (Py_ssize_t r = 0; r < opened; r++) starts[r + 1] += starts[r];
    for (Py_ssize_t r = opened + 1; r <= n; r++) starts[r] = starts[opened];
    for (Py_ssize_t r = 0; r < opened; r++) room[r] = starts[r]; /* (a cursor per row) */
    for (Py_ssize_t j = 0; j < n; j++) {
        int32_t i = order[j];
        if (bin[i] >= 0) members[room[bin[i]]++] = i;
    }
    int64_t left = starts[opened];
    for (Py_ssize_t i = 0; i < n; i++)
        if (bin[i] < 0) members[left++] = (int32_t)i;
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(opened);
done:
    PyMem_Free(size);
    PyMem_Free(count);
    PyMem_Free(order);
    PyMem_Free(head);
    PyMem_Free(next);
    PyMem_Free(placed);
    PyMem_Free(room);
    PyMem_Free(bits);
    PyMem_Free(top);
    release(v, 3);
    return result;
}

/* One segment of a bestfit row, for T = int32_t or int64_t: n values of src (>> shift) from
 * position at of the row, document-aware (bos, then the tokens shifted right by one). No value
 * is carried from one item to the next (each input is read from src again): the compiler makes
 * it a vector loop (a carried "previous token" kept it scalar, 2.5x slower). */
#define SEGMENT_ROW(T, NAME, ATTR)                                                             \
    ATTR static void NAME(const uint32_t *restrict src, Py_ssize_t n, T *restrict in,         \
                            T *restrict tg, int32_t *restrict seg, int32_t *restrict pos,       \
                            uint8_t *restrict mask, int32_t id, T bos, int shift)              \
    {                                                                                         \
        in[0] = bos;                                                                          \
        tg[0] = (T)(src[0] >> shift);                                                         \
        seg[0] = id;                                                                          \
        pos[0] = 0;                                                                           \
        for (Py_ssize_t k = 1; k < n; k++) {                                                  \
            in[k] = (T)(src[k - 1] >> shift);                                                 \
            tg[k] = (T)(src[k] >> shift);                                                     \
            seg[k] = id;                                                                      \
            pos[k] = (int32_t)k;                                                              \
        }                                                                                     \
        memset(mask, 1, (size_t)n);                                                           \
    }

#define PAD_ROW(T)                                                                            \
    static void pad_##T(Py_ssize_t n, T *restrict in, T *restrict tg, int32_t *seg,            \
                        int32_t *pos, uint8_t *mask, T pad)                                   \
    {                                                                                         \
        for (Py_ssize_t k = 0; k < n; k++) {                                                  \
            in[k] = pad;                                                                      \
            tg[k] = pad;                                                                      \
        }                                                                                     \
        memset(seg, 0, (size_t)n * 4);                                                        \
        memset(pos, 0, (size_t)n * 4);                                                        \
        memset(mask, 0, (size_t)n);                                                           \
    }

SEGMENT_ROW(int32_t, segment_int32_t, )
SEGMENT_ROW(int64_t, segment_int64_t, )
PAD_ROW(int32_t)
PAD_ROW(int64_t)
#ifdef HAVE_AVX2_ROW
/* the same loop compiled for AVX2 (chosen at run time, as the packed rows): 8 values a store */
SEGMENT_ROW(int32_t, segment_int32_avx2, __attribute__((target("avx2"))))
#endif

/* The segments (offsets, lengths, rows: int64 buffers, one item per segment) checked against
 * the rows and windows, copied into one array of three per segment; NULL with an error set. */
static Py_ssize_t *
check_segments(PyObject **objs, Py_ssize_t width, Py_ssize_t rows, Py_ssize_t length,
               Py_ssize_t *nseg)
{
    Py_buffer head[3];
    for (int k = 0; k < 3; k++) {
        if (PyObject_GetBuffer(objs[k], &head[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            release(head, k);
            return NULL;
        }
        if (check_items(&head[k], 8, k) < 0 || head[k].len != head[0].len) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "one offset, length and row per segment");
            release(head, k + 1);
            return NULL;
        }
    }
    Py_ssize_t n = head[0].len / 8;
    Py_ssize_t *piece = PyMem_Malloc((size_t)(n ? n : 1) * 3 * sizeof(Py_ssize_t));
    if (piece == NULL) {
        release(head, 3);
        PyErr_NoMemory();
        return NULL;
    }
    const int64_t *off = head[0].buf, *len = head[1].buf, *row = head[2].buf;
    int64_t last = -1, used = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t o = off[j], k = len[j], r = row[j];
        if (r != last) used = 0;
        if (o < 0 || k < 1 || o > width || k > width - o || r < last || r >= rows ||
            k > length - used) {
            PyErr_Format(PyExc_ValueError,
                         "segment %zd: %lld values at %lld of a %zd-value window into row %lld "
                         "(%lld of %zd used) do not fit",
                         j, (long long)k, (long long)o, width, (long long)r, (long long)used,
                         length);
            release(head, 3);
            PyMem_Free(piece);
            return NULL;
        }
        piece[3 * j] = (Py_ssize_t)o;
        piece[3 * j + 1] = (Py_ssize_t)k;
        piece[3 * j + 2] = (Py_ssize_t)r;
        used += k;
        last = r;
    }
    release(head, 3);
    *nseg = n;
    return piece;
}

#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2 /* segments ahead whose tokens are prefetched */
#endif

/* Lay the checked segments out of R's windows into the outputs v[0..4] (without the GIL). */
static void
run_segments(const Rows *R, const Py_ssize_t *piece, Py_ssize_t nseg, Py_buffer *v,
             Py_ssize_t rows, Py_ssize_t length, long long bos, long long pad, int shift,
             int wide)
{
    int32_t *seg = v[2].buf, *pos = v[3].buf;
    uint8_t *mask = v[4].buf;
#ifdef HAVE_AVX2_ROW
    int avx2 = max_simd >= 2 && has_avx2();
#endif
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t f = 0; f < PREFETCH_AHEAD && f < nseg; f++) { /* the first ones' tokens */
        const char *nx = (const char *)(row_at(R, f) + piece[3 * f]);
        for (Py_ssize_t b = 0; b < 4096 && b < piece[3 * f + 1] * 4; b += 64)
            __builtin_prefetch(nx + b);
    }
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t at = r * length, end = at + length;
        int32_t id = 0;
        for (; j < nseg && piece[3 * j + 2] == r; j++) {
            const uint32_t *src = row_at(R, j) + piece[3 * j];
            Py_ssize_t k = piece[3 * j + 1];
            if (j + PREFETCH_AHEAD < nseg) { /* a later segment: misses the loop would wait for */
                Py_ssize_t f = j + PREFETCH_AHEAD;
                const char *nx = (const char *)(row_at(R, f) + piece[3 * f]);
                for (Py_ssize_t b = 0; b < 4096 && b < piece[3 * f + 1] * 4; b += 64)
                    __builtin_prefetch(nx + b);
            }
            if (wide)
                segment_int64_t(src, k, (int64_t *)v[0].buf + at, (int64_t *)v[1].buf + at,
                                seg + at, pos + at, mask + at, ++id, (int64_t)bos, shift);
#ifdef HAVE_AVX2_ROW
            else if (avx2)
                segment_int32_avx2(src, k, (int32_t *)v[0].buf + at, (int32_t *)v[1].buf + at,
                                   seg + at, pos + at, mask + at, ++id, (int32_t)bos, shift);
#endif
            else
                segment_int32_t(src, k, (int32_t *)v[0].buf + at, (int32_t *)v[1].buf + at,
                                seg + at, pos + at, mask + at, ++id, (int32_t)bos, shift);
            at += k;
        }
        if (wide)
            pad_int64_t(end - at, (int64_t *)v[0].buf + at, (int64_t *)v[1].buf + at, seg + at,
                        pos + at, mask + at, (int64_t)pad);
        else
            pad_int32_t(end - at, (int32_t *)v[0].buf + at, (int32_t *)v[1].buf + at, seg + at,
                        pos + at, mask + at, (int32_t)pad);
    }
    Py_END_ALLOW_THREADS
}

/* The five outputs (inputs, targets, segment_ids, positions, loss_mask) of rows x length. */
static int
segment_outputs(PyObject **objs, Py_buffer *v, Py_ssize_t rows, Py_ssize_t length, int wide)
{
    Py_ssize_t n = rows * length, w = wide ? 8 : 4;
    Py_ssize_t sizes[5] = {n * w, n * w, n * 4, n * 4, n}, items[5] = {w, w, 4, 4, 1};
    int writable[5] = {1, 1, 1, 1, 1};
    return get_buffers(objs, v, sizes, items, writable, 5);
}

/* segments(enc, width, offsets, lengths, seg_rows, inputs, targets, segment_ids, positions,
 * loss_mask, rows, length, bos, pad, shift, wide): rows of documents laid end to end. Segment j
 * is enc's row j (`width` values, see rows_get) from offsets[j], lengths[j] values (>> shift),
 * placed in row seg_rows[j] after the row's earlier segments (seg_rows never decreasing); each
 * row is right-padded with pad (segment 0, position 0, loss_mask 0). Every segment is checked
 * to lie inside its window and every row's segments to fit `length` before the loop. */
static PyObject *
segments(PyObject *self, PyObject *args)
{
    PyObject *enc, *objs[8];
    Py_ssize_t width, rows, length, nseg;
    long long bos, pad;
    int shift, wide;
    if (!PyArg_ParseTuple(args, "OnOOOOOOOOnnLLip", &enc, &width, &objs[0], &objs[1], &objs[2],
                          &objs[3], &objs[4], &objs[5], &objs[6], &objs[7], &rows, &length, &bos,
                          &pad, &shift, &wide))
        return NULL;
    if (check_shape(rows, length) < 0 || width < 0 || check_value(bos, wide, "bos") < 0 ||
        check_value(pad, wide, "pad") < 0)
        return NULL;
    if (shift < 0 || shift > 31) {
        PyErr_SetString(PyExc_ValueError, "shift must be in 0..31");
        return NULL;
    }
    Py_buffer v[5];
    if (segment_outputs(objs + 3, v, rows, length, wide) < 0) return NULL;
    Py_ssize_t *piece = check_segments(objs, width, rows, length, &nseg);
    if (piece == NULL) {
        release(v, 5);
        return NULL;
    }
    Rows R;
    if (rows_get(enc, nseg, width, &R) < 0) {
        release(v, 5);
        PyMem_Free(piece);
        return NULL;
    }
    run_segments(&R, piece, nseg, v, rows, length, bos, pad, shift, wide);
    rows_release(&R);
    release(v, 5);
    PyMem_Free(piece);
    Py_RETURN_NONE;
}

/* segments_at(views, unit, starts, width, total, scale, offsets, lengths, seg_rows, inputs,
 * targets, segment_ids, positions, loss_mask, rows, length, bos, pad, wide): segments() of the
 * stored windows (shift 1) that unit_windows finds at starts * scale: one call per batch, no
 * lists of where they lie. True, False (declined: outputs untouched) or the missing units. */
static PyObject *
segments_at(PyObject *self, PyObject *args)
{
    PyObject *views, *starts, *objs[8];
    Py_ssize_t unit, width, total, scale, rows, length, nseg;
    long long bos, pad;
    int wide;
    if (!PyArg_ParseTuple(args, "O!nOnnnOOOOOOOOnnLLp", &PyDict_Type, &views, &unit, &starts,
                          &width, &total, &scale, &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6], &objs[7], &rows, &length, &bos, &pad,
                          &wide))
        return NULL;
    if (!lookup_ok(unit, width, total, scale)) Py_RETURN_FALSE;
    if (check_shape(rows, length) < 0 || check_value(bos, wide, "bos") < 0 ||
        check_value(pad, wide, "pad") < 0)
        return NULL;
    Py_buffer sv;
    if (get_starts(starts, &sv) < 0) return NULL;
    Py_buffer v[5];
    if (segment_outputs(objs + 3, v, rows, length, wide) < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    Py_ssize_t *piece = check_segments(objs, width, rows, length, &nseg);
    if (piece == NULL || sv.len / 8 != nseg) {
        if (piece != NULL) {
            PyErr_SetString(PyExc_ValueError, "one start per segment");
            PyMem_Free(piece);
        }
        release(v, 5);
        PyBuffer_Release(&sv);
        return NULL;
    }
    Rows R;
    PyObject *missing, *result = NULL;
    int got = rows_lookup(views, unit, &sv, width, total, scale, &R, &missing);
    if (got == 0) {
        run_segments(&R, piece, nseg, v, rows, length, bos, pad, 1, wide);
        rows_release(&R);
        result = Py_NewRef(Py_True);
    } else if (got == 1)
        result = Py_NewRef(Py_False);
    else if (got == 2)
        result = missing;
    release(v, 5);
    PyBuffer_Release(&sv);
    PyMem_Free(piece);
    return result;
}
