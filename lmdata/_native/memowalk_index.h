/* block_index and item_at of memowalk.c (included there, after find_item): a block's
 * whole walk once, kept as a small index, then per read a walk of one item's bytes only. */

/* A block's index (block_index): native uint32s, the pickle's length, the number of items n and
 * of shared atoms m, then per item (start, end, memo slots made before it or NOT_ALONE), then
 * per shared atom (memo slot, start, end), ascending by slot: the earlier memo slots some item
 * gets. With it, item_at walks only the item's own bytes. */
#define NOT_ALONE 0xFFFFFFFFu

/* The length of the atom opcode at p[i] (within n), or 0 if it is not one whole atom. */
static Py_ssize_t atom_len(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) {
    int a = ATOM[p[i]];
    if (!a) return 0;
    if (a > 0) return i + a <= n ? a : 0;
    int w = -a;
    if (i + 1 + w > n) return 0;
    unsigned long long sz = w == 1 ? p[i + 1] : le(p + i + 1, w);
    if (sz > (unsigned long long)(n - i - 1 - w)) return 0;
    return 1 + w + (Py_ssize_t)sz;
}

/* item_at(data, j, index) -> bytes or None: item_pickle's pickle of item j, from the block's
 * index (block_index of these very bytes): only the item's bytes are walked. Any bytes and
 * index give a pickle of plain opcodes only (atoms, containers, MEMOIZE and gets) or None. */
static PyObject *
item_from(const unsigned char *p, Py_ssize_t n, const uint32_t *q, Py_ssize_t qlen, Py_ssize_t j)
{
    PyObject *out = NULL;
    Py_ssize_t *gat = NULL, *gslot = NULL, ng = 0, gcap = 0;
    unsigned char *used = NULL;
    Py_ssize_t *rank = NULL;
    if (qlen < 12 || qlen % 4 || q[0] != (uint64_t)n || n < 2 || p[0] != 0x80) goto none;
    Py_ssize_t items = q[1], nsh = q[2];
    if (qlen != 12 + 12 * (items + nsh) || j < 0 || j >= items) goto none;
    const uint32_t *sh = q + 3 + 3 * items;
    Py_ssize_t rs = q[3 + 3 * j], re = q[4 + 3 * j];
    uint32_t base = q[5 + 3 * j];
    if (base == NOT_ALONE || rs > re || re > n) goto none;
    used = PyMem_Calloc((size_t)nsh + 1, 1);
    rank = PyMem_Malloc(((size_t)nsh + 1) * sizeof(Py_ssize_t));
    if (!used || !rank) { PyErr_NoMemory(); goto done; }
    Py_ssize_t own = 0, i = rs;
    while (i < re) {
        unsigned char op = p[i];
        if (ATOM[op]) {
            Py_ssize_t len = atom_len(p, i, re);
            if (!len) goto none;
            i += len;
            continue;
        }
        Py_ssize_t w = 0, mi = -1;
        switch (op) {
        case 0x95: /* FRAME: left out */
            if (i + 9 > re) goto none;
            w = 8;
            break;
        case 'h': case 'j': {
            w = op == 'h' ? 1 : 4;
            if (i + 1 + w > re) goto none;
            unsigned long long idx = op == 'h' ? p[i + 1] : le(p + i + 1, 4);
            if (idx < base) { /* an earlier slot: must be a shared atom */
                Py_ssize_t lo = 0, hi = nsh;
                while (lo < hi) {
                    Py_ssize_t mid = (lo + hi) / 2;
                    if (sh[3 * mid] < idx) lo = mid + 1; else hi = mid;
                }
                if (lo == nsh || sh[3 * lo] != idx) goto none;
                used[lo] = 1;
            } else if (idx >= (unsigned long long)base + (unsigned long long)own) {
                goto none; /* a slot not made yet */
            }
            mi = (Py_ssize_t)idx;
            break;
        }
        case 0x94: own++; i++; continue;
        case ']': case '}': case ')': case 0x8f: case '(': case 'e': case 'u': case 0x90:
        case 't': case 0x91: case 'a': case 's': case 0x85: case 0x86: case 0x87:
            i++;
            continue;
        default:
            goto none;
        }
        if (ng >= gcap) {
            Py_ssize_t c = gcap ? gcap * 2 : 32;
            if (grow((void **)&gat, c, sizeof(Py_ssize_t)) || grow((void **)&gslot, c, sizeof(Py_ssize_t))) {
                PyErr_NoMemory();
                goto done;
            }
            gcap = c;
        }
        gat[ng] = i; gslot[ng] = mi; ng++;
        i += 1 + w;
    }
    /* the shared atoms the item gets, each one whole atom of these bytes */
    Py_ssize_t size = 3 + (re - rs), nused = 0;
    for (Py_ssize_t k = 0; k < nsh; k++) {
        if (!used[k]) continue;
        Py_ssize_t a0 = sh[3 * k + 1], a1 = sh[3 * k + 2];
        if (a0 >= a1 || a1 > n || atom_len(p, a0, n) != a1 - a0) goto none;
        size += a1 - a0 + 2;
        rank[k] = nused++;
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (!out) goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    *o++ = p[0]; *o++ = p[1];
    for (Py_ssize_t k = 0; k < nsh; k++) {
        if (!used[k]) continue;
        Py_ssize_t a0 = sh[3 * k + 1], a1 = sh[3 * k + 2];
        memcpy(o, p + a0, (size_t)(a1 - a0));
        o += a1 - a0;
        *o++ = 0x94; *o++ = '0';
    }
    Py_ssize_t from = rs;
    for (Py_ssize_t g = 0; g < ng; g++) {
        Py_ssize_t at = gat[g], mi = gslot[g];
        memcpy(o, p + from, (size_t)(at - from));
        o += at - from;
        if (mi < 0) { from = at + 9; continue; }
        unsigned long long to;
        if ((unsigned long long)mi < (unsigned long long)base) { /* its rank among the used shared atoms */
            Py_ssize_t lo = 0, hi = nsh;
            while (lo < hi) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (sh[3 * mid] < (uint64_t)mi) lo = mid + 1; else hi = mid;
            }
            to = (unsigned long long)rank[lo];
        } else {
            to = (unsigned long long)(mi - (Py_ssize_t)base + nused);
        }
        /* never more than the old number (ranks and shifts only lower it): the width holds */
        *o++ = p[at];
        int w = p[at] == 'h' ? 1 : 4;
        for (int b = 0; b < w; b++) *o++ = (unsigned char)(to >> (8 * b));
        from = at + 1 + w;
    }
    memcpy(o, p + from, (size_t)(re - from));
    o += re - from;
    *o++ = '.';
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - (unsigned char *)PyBytes_AS_STRING(out))) < 0)
        out = NULL;
    goto done;
none:
    out = Py_NewRef(Py_None);
done:
    PyMem_Free(gat); PyMem_Free(gslot); PyMem_Free(used); PyMem_Free(rank);
    return out;
}

static PyObject *
item_at(PyObject *self, PyObject *args)
{
    Py_buffer data, index;
    Py_ssize_t j;
    if (!PyArg_ParseTuple(args, "y*ny*", &data, &j, &index))
        return NULL;
    PyObject *out = item_from((const unsigned char *)data.buf, data.len,
                              (const uint32_t *)index.buf, index.len, j);
    PyBuffer_Release(&data);
    PyBuffer_Release(&index);
    return out;
}

static PyObject *
block_index(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t want = -1;
    if (!PyArg_ParseTuple(args, "y*|n", &data, &want))
        return NULL;
    Stack st = {0};
    Memo m = {0};
    Py_ssize_t *gets = NULL, *spans = NULL, ngets = 0, rs = 0, re = 0, items = 0;
    unsigned char *shared = NULL;
    PyObject *out = NULL;
    const unsigned char *p = (const unsigned char *)data.buf;
    int ok = data.len < (Py_ssize_t)NOT_ALONE &&
             find_item(p, data.len, -1, &rs, &re, &items, &m, &st, &gets, &ngets, &spans);
    if (ok) {
        shared = PyMem_Calloc((size_t)m.len + 1, 1);
        out = PyBytes_FromStringAndSize(NULL, (12 + 12 * items) + 12 * m.len);
        if (!shared || !out) { if (!shared) PyErr_NoMemory(); goto done; }
        uint32_t *q = (uint32_t *)PyBytes_AS_STRING(out);
        uint32_t *it = q + 3;
        Py_ssize_t mp = 0, g = 0, nshared = 0;
        for (Py_ssize_t k = 0; k < items; k++) {
            Py_ssize_t a0 = spans[2 * k], a1 = spans[2 * k + 1];
            while (mp < m.len && m.pos[mp] < a0) mp++;
            uint32_t base = (uint32_t)mp;
            while (g < ngets && gets[2 * g] < a0) g++;
            for (; g < ngets && gets[2 * g] < a1; g++) {
                Py_ssize_t mi = gets[2 * g + 1];
                if (mi < 0 || mi >= mp) continue; /* a FRAME, or a slot the item makes */
                if (m.astart[mi] < 0) base = NOT_ALONE; /* an earlier container: shared */
                else shared[mi] = 1;
            }
            it[3 * k] = (uint32_t)a0; it[3 * k + 1] = (uint32_t)a1; it[3 * k + 2] = base;
        }
        uint32_t *sh = it + 3 * items;
        for (Py_ssize_t k = 0; k < m.len; k++) {
            if (shared[k]) {
                sh[3 * nshared] = (uint32_t)k;
                sh[3 * nshared + 1] = (uint32_t)m.astart[k];
                sh[3 * nshared + 2] = (uint32_t)m.aend[k];
                nshared++;
            }
        }
        q[0] = (uint32_t)data.len; q[1] = (uint32_t)items; q[2] = (uint32_t)nshared;
        if (_PyBytes_Resize(&out, 12 + 12 * (items + nshared)) < 0) { out = NULL; goto done; }
        if (want >= 0) { /* (index, item_at(data, want, index)) */
            PyObject *item = item_from(p, data.len, (const uint32_t *)PyBytes_AS_STRING(out),
                                       PyBytes_GET_SIZE(out), want);
            PyObject *t = item ? PyTuple_Pack(2, out, item) : NULL;
            Py_XDECREF(item);
            Py_SETREF(out, t);
        }
    }
    if (!ok && !PyErr_Occurred()) out = Py_NewRef(Py_None);
done:
    if (PyErr_Occurred()) Py_CLEAR(out);
    PyMem_Free(st.start); PyMem_Free(st.aend); PyMem_Free(st.kind);
    PyMem_Free(m.astart); PyMem_Free(m.aend); PyMem_Free(m.pos);
    PyMem_Free(gets); PyMem_Free(spans); PyMem_Free(shared);
    PyBuffer_Release(&data);
    return out;
}
