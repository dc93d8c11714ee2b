/* The memo-slot walk of lmdata/_pickle.py (_early_slot) at C speed, for the opcodes the
 * binary protocols use. The opcode table is passed in from Python (one source of truth);
 * a text opcode (PUT, or one that reads a line) returns -1 and Python walks the pickle; a
 * string or bytes count beyond the data returns -2 (Python 3.11 allocates the count first).
 *
 * item_pickle: a pickle of one item of a pickled list, so that a reader unpickles that item
 * alone (see lmdata/_pickle.py, load_item). block_index and item_at: the same in two steps,
 * the whole walk once per block (its small index kept by the reader) and then only the item's
 * own bytes per read (load_indexed). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native.h"
#include <stdint.h>

/* Atoms find_item follows: > 0, the opcode's whole length; < 0, minus the width of the count of
 * bytes that follows it. 0: not an atom. */
static signed char ATOM[256];

/* Opcodes that name or call code (globals, extensions, persistent ids, calls, BUILD): a pickle
 * without them makes plain values only, whatever unpickler loads it. */
static unsigned char FOREIGN[256];

/* The walk: (slot, offset, end) as early_slot answers, for n bytes at p. Touches no Python
 * object, so callers may run it without the GIL. */
static void
walk(const unsigned char *p, Py_ssize_t n, const signed char *t, long long *o_slot,
     long long *o_at, long long *o_end)
{
    Py_ssize_t i = 0;
    long long slot = 0, at = 0, end = -1;
    int foreign = 0;
    while (i < n) {
        int k = t[p[i]];
        foreign |= FOREIGN[p[i]];
        if (k > 0) {
            i += k;
        } else if (k == -1) { /* count of one byte */
            if (i + 1 >= n) break;
            i += 2 + (Py_ssize_t)p[i + 1];
        } else if (k == -2 || k == -3) {
            /* a count of 4 bytes, unsigned as CPython's unpickler reads it (a string of 2-4 GiB
             * is skipped, not a stop that would hide a memo write after it), or of 8 bytes,
             * which it refuses from 2**63 on */
            int w = k == -2 ? 4 : 8;
            if (i + w >= n) break;
            unsigned long long u = 0;
            for (int b = w - 1; b >= 0; b--) u = (u << 8) | p[i + 1 + b];
            long long size = (long long)u;
            if (size < 0) break; /* the unpickler refuses it */
            if (size > (long long)(n - i - 1 - w)) {
                /* more bytes than remain: Python 3.11's unpickler would allocate the count
                 * before finding out, so the caller refuses it first */
                slot = -2; at = i;
                break;
            }
            i += 1 + w + (Py_ssize_t)size;
        } else if (k == -6) { /* LONG_BINPUT */
            unsigned long long s = 0; /* little-endian; a truncated one reads what is there */
            for (int b = 3; b >= 0; b--)
                s = (s << 8) | (i + 1 + b < n ? p[i + 1 + b] : 0);
            if ((long long)s > (long long)i) { slot = (long long)s; at = i; break; }
            i += 5;
        } else if (k == -4 || k == -5 || k == -7) { /* a line: PUT, or text arguments */
            slot = -1; at = i;
            break;
        } else { /* STOP, or an opcode the unpickler refuses */
            if (p[i] == '.' && !foreign) end = i + 1;
            break;
        }
    }
    *o_slot = slot; *o_at = at; *o_end = end;
}

static PyObject *
early_slot(PyObject *self, PyObject *args)
{
    Py_buffer data, table;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &table))
        return NULL;
    if (table.len != 256) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&table);
        PyErr_SetString(PyExc_ValueError, "the opcode table has 256 entries");
        return NULL;
    }
    long long slot, at, end;
    walk((const unsigned char *)data.buf, data.len, (const signed char *)table.buf, &slot, &at, &end);
    PyBuffer_Release(&data);
    PyBuffer_Release(&table);
    return Py_BuildValue("(LLL)", slot, at, end);
}

/* early_slots(buffers, table) -> bytes: early_slot's (slot, offset, end) of each buffer, as
 * three int64s each, walked with the GIL released (a reader's decoder thread walks the blocks
 * it has just decompressed while the reading thread runs). */
static PyObject *
early_slots(PyObject *self, PyObject *args)
{
    PyObject *seq, *fast = NULL, *out = NULL;
    Py_buffer table;
    Py_buffer *bufs = NULL;
    Py_ssize_t n = 0, got = 0;
    if (!PyArg_ParseTuple(args, "Oy*", &seq, &table))
        return NULL;
    if (table.len != 256) {
        PyErr_SetString(PyExc_ValueError, "the opcode table has 256 entries");
        goto done;
    }
    fast = PySequence_Fast(seq, "early_slots takes a sequence of buffers");
    if (!fast) goto done;
    n = PySequence_Fast_GET_SIZE(fast);
    bufs = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    if (!bufs) { PyErr_NoMemory(); goto done; }
    for (; got < n; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
    out = PyBytes_FromStringAndSize(NULL, n * 3 * (Py_ssize_t)sizeof(long long));
    if (!out) goto done;
    long long *r = (long long *)PyBytes_AS_STRING(out);
    const signed char *t = (const signed char *)table.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++)
        walk((const unsigned char *)bufs[k].buf, bufs[k].len, t, &r[3 * k], &r[3 * k + 1], &r[3 * k + 2]);
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&bufs[k]);
    PyMem_Free(bufs);
    Py_XDECREF(fast);
    PyBuffer_Release(&table);
    if (PyErr_Occurred()) Py_CLEAR(out);
    return out;
}


/* ---- item_pickle ---------------------------------------------------------------------- */

/* Kinds of stack values, to mirror what the unpickler accepts for plain data. */
enum { K_ATOM = 1, K_LIST, K_DICT, K_SET, K_TUPLE, K_MAIN };

#define MAX_HEIGHT (1 << 20)
#define MAX_MEMO (1 << 22)

typedef struct {
    Py_ssize_t *start; /* per stack slot: offset of the first opcode that built the value */
    Py_ssize_t *aend;  /* per stack slot: end of the opcode, for an atom */
    unsigned char *kind;
    Py_ssize_t cap;
} Stack;

typedef struct {
    Py_ssize_t *astart, *aend, *pos; /* per memo slot: atom span (-1: not an atom), MEMOIZE offset */
    Py_ssize_t len, cap;
} Memo;

static int grow(void **p, Py_ssize_t n, size_t w) {
    void *q = PyMem_Realloc(*p, (size_t)n * w);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int stack_reserve(Stack *st, Py_ssize_t h) {
    if (h < st->cap) return 0;
    if (h >= MAX_HEIGHT) return -1;
    Py_ssize_t n = st->cap ? st->cap * 2 : 256;
    while (n <= h) n *= 2;
    if (grow((void **)&st->start, n, sizeof(Py_ssize_t)) || grow((void **)&st->aend, n, sizeof(Py_ssize_t)) ||
        grow((void **)&st->kind, n, 1))
        return -1;
    st->cap = n;
    return 0;
}

static int memo_push(Memo *m, Py_ssize_t a, Py_ssize_t e, Py_ssize_t at) {
    if (m->len >= m->cap) {
        if (m->len >= MAX_MEMO) return -1;
        Py_ssize_t n = m->cap ? m->cap * 2 : 256;
        if (grow((void **)&m->astart, n, sizeof(Py_ssize_t)) || grow((void **)&m->aend, n, sizeof(Py_ssize_t)) ||
            grow((void **)&m->pos, n, sizeof(Py_ssize_t)))
            return -1;
        m->cap = n;
    }
    m->astart[m->len] = a;
    m->aend[m->len] = e;
    m->pos[m->len] = at;
    m->len++;
    return 0;
}

/* Appends (offset, memo slot) to the list of gets (slot -1: a FRAME). */
static int note(Py_ssize_t **gets, Py_ssize_t *ngets, Py_ssize_t *gcap, Py_ssize_t at, Py_ssize_t mi) {
    if (*ngets >= *gcap) {
        Py_ssize_t c = *gcap ? *gcap * 2 : 64;
        if (c > MAX_MEMO || grow((void **)gets, c * 2, sizeof(Py_ssize_t))) return -1;
        *gcap = c;
    }
    (*gets)[2 * *ngets] = at;
    (*gets)[2 * *ngets + 1] = mi;
    (*ngets)++;
    return 0;
}

/* Notes item k's span (start, end) in the growable pair array *spans. */
static int span_note(Py_ssize_t **spans, Py_ssize_t *cap, Py_ssize_t k, Py_ssize_t a, Py_ssize_t e) {
    if (k >= *cap) {
        Py_ssize_t c = *cap ? *cap * 2 : 64;
        if (c > MAX_HEIGHT || grow((void **)spans, c * 2, sizeof(Py_ssize_t))) return -1;
        *cap = c;
    }
    (*spans)[2 * k] = a;
    (*spans)[2 * k + 1] = e;
    return 0;
}

static unsigned long long le(const unsigned char *p, int w) {
    unsigned long long u = 0;
    for (int b = w - 1; b >= 0; b--) u = (u << 8) | p[b];
    return u;
}

/* Walks the whole pickle (a list of items, protocol 4 or 5 opcodes of plain data only) and
 * finds item `want`. Returns 1 and fills the outputs, 0 where the pickle is outside that subset
 * or malformed (the caller then unpickles it whole, which reports any damage precisely). */
static int
find_item(const unsigned char *p, Py_ssize_t n, Py_ssize_t want, Py_ssize_t *o_start,
          Py_ssize_t *o_end, Py_ssize_t *o_items, Memo *m, Stack *st, Py_ssize_t **gets,
          Py_ssize_t *ngets, Py_ssize_t **spans)
{
    Py_ssize_t marks[64]; /* deeper nesting than this is left to the unpickler */
    Py_ssize_t mark_at[64];
    int md = 0;
    Py_ssize_t h = 0, i = 0, items = 0, rs = -1, re = -1, gcap = 0, scap = 0;
    if (n < 2 || p[0] != 0x80) return 0;
    i = 2;
    for (;;) {
        if (i >= n) return 0;
        unsigned char op = p[i];
        Py_ssize_t at = i;
        int a = ATOM[op];
        if (a) { /* an atom: a fixed-width argument (a > 0: the opcode's length) or a count */
            Py_ssize_t len;
            if (a > 0) {
                len = a;
            } else {
                int w = -a;
                if (i + 1 + w > n) return 0;
                unsigned long long sz = w == 1 ? p[i + 1] : le(p + i + 1, w);
                if (sz > (unsigned long long)n) return 0;
                len = 1 + w + (Py_ssize_t)sz;
            }
            if (i + len > n || h == 0) return 0; /* the list comes first */
            i += len;
            if (h >= st->cap && stack_reserve(st, h)) return 0;
            st->start[h] = at; st->aend[h] = i; st->kind[h] = K_ATOM; h++;
            continue;
        }
        if (op == 0x95) { /* FRAME: noted, the wanted item must not contain one */
            /* the C unpickler checks only that the frame's bytes are there */
            if (i + 9 > n || le(p + i + 1, 8) > (unsigned long long)(n - i - 9)) return 0;
            if (note(gets, ngets, &gcap, at, -1)) return 0;
            i += 9;
            continue;
        }
        if (h == 0 && !(op == ']' && md == 0)) return 0; /* the list comes first */
        Py_ssize_t fence = md ? marks[md - 1] : 0;
        switch (op) {
        case ']': case '}': case ')': case 0x8f:
            if (h >= st->cap && stack_reserve(st, h)) return 0;
            st->start[h] = at; st->aend[h] = -1;
            st->kind[h] = op == ']' ? (h == 0 && md == 0 ? K_MAIN : K_LIST) : op == '}' ? K_DICT : op == ')' ? K_TUPLE : K_SET;
            h++; i++;
            break;
        case '(':
            if (md == 64) return 0;
            marks[md] = h; mark_at[md] = at; md++; i++;
            break;
        case 'e': case 'u': case 0x90: case 't': case 0x91: { /* pop to the mark */
            if (!md) return 0;
            Py_ssize_t base = marks[--md];
            Py_ssize_t k = h - base;
            if (op == 'u' && k % 2) return 0;
            if (op == 't' || op == 0x91) {
                if (stack_reserve(st, base)) return 0;
                st->start[base] = mark_at[md]; /* the MARK is part of the tuple */
                st->aend[base] = -1; st->kind[base] = K_TUPLE;
                h = base + 1;
            } else {
                if (base < 1) return 0;
                unsigned char t = st->kind[base - 1];
                if (op == 'e' && t == K_MAIN) { /* items base..h-1 of the dataset's list */
                    if (md != 0 || base != 1) return 0;
                    for (Py_ssize_t s = base; s < h; s++, items++) {
                        Py_ssize_t a0 = st->start[s], a1 = s + 1 < h ? st->start[s + 1] : at;
                        if (items == want) { rs = a0; re = a1; }
                        if (spans && span_note(spans, &scap, items, a0, a1)) return 0;
                    }
                } else if (!((op == 'e' && t == K_LIST) || (op == 'u' && t == K_DICT) || (op == 0x90 && t == K_SET))) {
                    return 0;
                }
                h = base;
            }
            i++;
            break;
        }
        case 'a': case 's': { /* APPEND, SETITEM */
            Py_ssize_t k = op == 'a' ? 1 : 2;
            if (h - fence < k + 1) return 0;
            unsigned char t = st->kind[h - k - 1];
            if (op == 'a' && t == K_MAIN) {
                if (md != 0 || h != 2) return 0;
                if (items == want) { rs = st->start[1]; re = at; }
                if (spans && span_note(spans, &scap, items, st->start[1], at)) return 0;
                items++;
            } else if (!((op == 'a' && t == K_LIST) || (op == 's' && t == K_DICT))) {
                return 0;
            }
            h -= k; i++;
            break;
        }
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            Py_ssize_t k = op - 0x84;
            if (h - fence < k) return 0;
            h -= k;
            st->aend[h] = -1; st->kind[h] = K_TUPLE; /* start: the first element's */
            h++; i++;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (h - fence < 1) return 0;
            if (memo_push(m, st->kind[h - 1] == K_MAIN ? -2 : st->kind[h - 1] == K_ATOM && st->aend[h - 1] >= 0 ? st->start[h - 1] : -1, st->aend[h - 1], at))
                return 0;
            i++;
            break;
        case 'h': case 'j': { /* BINGET, LONG_BINGET */
            Py_ssize_t w2 = op == 'h' ? 1 : 4;
            if (i + 1 + w2 > n) return 0;
            unsigned long long idx = op == 'h' ? p[i + 1] : le(p + i + 1, 4);
            if (idx >= (unsigned long long)m->len) return 0;
            if (h >= st->cap && stack_reserve(st, h)) return 0;
            Py_ssize_t mi = (Py_ssize_t)idx;
            if (m->astart[mi] == -2) return 0; /* the list itself */
            /* a memo'd container is shared by reference: opaque, nothing goes into it; a value
             * got from the memo is never itself an atom to copy (aend -1) */
            st->start[h] = at;
            st->aend[h] = -1;
            st->kind[h] = m->astart[mi] >= 0 ? K_ATOM : K_TUPLE;
            h++;
            if (note(gets, ngets, &gcap, at, mi)) return 0;
            i += 1 + w2;
            break;
        }
        case '.': /* STOP */
            if (md != 0 || h != 1 || st->kind[0] != K_MAIN || (rs < 0 && !spans)) return 0;
            *o_start = rs; *o_end = re; *o_items = items;
            return 1;
        default:
            return 0;
        }
    }
}

static PyObject *
item_pickle(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t want;
    if (!PyArg_ParseTuple(args, "y*n", &data, &want))
        return NULL;
    Stack st = {0};
    Memo m = {0};
    Py_ssize_t *gets = NULL, ngets = 0, rs = 0, re = 0, items = 0;
    unsigned char *used = NULL;
    Py_ssize_t *rank = NULL;
    PyObject *out = NULL;
    const unsigned char *p = (const unsigned char *)data.buf;
    int ok = want >= 0 && find_item(p, data.len, want, &rs, &re, &items, &m, &st, &gets, &ngets, NULL);
    Py_ssize_t before = 0, size = 0;
    if (ok) {
        /* memo slots made before the item; the ones it gets must hold atoms */
        while (before < m.len && m.pos[before] < rs) before++;
        used = PyMem_Calloc((size_t)before + 1, 1);
        if (!used) { PyErr_NoMemory(); goto done; }
        for (Py_ssize_t g = 0; g < ngets; g++) {
            Py_ssize_t at = gets[2 * g], mi = gets[2 * g + 1];
            if (at < rs || at >= re) continue;
            if (mi >= 0 && mi < before && m.astart[mi] < 0) { ok = 0; break; } /* a container */
            if (mi >= 0 && mi < before) used[mi] = 1;
        }
    }
    if (ok) {
        /* PROTO; per earlier slot the item gets: the atom, MEMOIZE, POP; the item's opcodes
         * without FRAMEs, each BINGET/LONG_BINGET renumbered (earlier slots the item does not
         * get are left out, so the slots it makes itself move down by as many); STOP */
        Py_ssize_t nused = 0;
        size = 2 + (re - rs) + 1;
        for (Py_ssize_t k = 0; k < before; k++) {
            if (used[k]) {
                size += m.aend[k] - m.astart[k] + 2;
                nused++;
            }
        }
        rank = PyMem_Malloc(((size_t)before + 1) * sizeof(Py_ssize_t));
        if (!rank) { PyErr_NoMemory(); goto done; }
        for (Py_ssize_t k = 0, r = 0; k < before; k++) rank[k] = used[k] ? r++ : -1;
        out = PyBytes_FromStringAndSize(NULL, size);
        if (!out) goto done;
        unsigned char *q = (unsigned char *)PyBytes_AS_STRING(out);
        *q++ = p[0]; *q++ = p[1];
        for (Py_ssize_t k = 0; k < before; k++) {
            if (used[k]) {
                memcpy(q, p + m.astart[k], (size_t)(m.aend[k] - m.astart[k]));
                q += m.aend[k] - m.astart[k];
                *q++ = 0x94; *q++ = '0';
            }
        }
        Py_ssize_t from = rs;
        for (Py_ssize_t g = 0; g < ngets; g++) {
            Py_ssize_t at = gets[2 * g], mi = gets[2 * g + 1];
            if (at < rs || at >= re) continue;
            memcpy(q, p + from, (size_t)(at - from));
            q += at - from;
            if (mi < 0) { /* a FRAME: left out */
                from = at + 9;
                continue;
            }
            /* never more than the old number: a BINGET's one byte still holds it */
            unsigned long long to = mi < before ? (unsigned long long)rank[mi]
                                                : (unsigned long long)(mi - before + nused);
            *q++ = p[at];
            int w = p[at] == 'h' ? 1 : 4;
            for (int b = 0; b < w; b++) *q++ = (unsigned char)(to >> (8 * b));
            from = at + 1 + w;
        }
        memcpy(q, p + from, (size_t)(re - from));
        q += re - from;
        *q++ = '.';
        /* FRAMEs take less than counted: trim */
        if (_PyBytes_Resize(&out, (Py_ssize_t)(q - (unsigned char *)PyBytes_AS_STRING(out))) < 0) {
            out = NULL;
            goto done;
        }
        PyObject *t = Py_BuildValue("(nN)", items, out);
        out = t;
    }
    if (!ok && !PyErr_Occurred()) out = Py_NewRef(Py_None);
done:
    PyMem_Free(st.start); PyMem_Free(st.aend); PyMem_Free(st.kind);
    PyMem_Free(m.astart); PyMem_Free(m.aend); PyMem_Free(m.pos);
    PyMem_Free(gets); PyMem_Free(used); PyMem_Free(rank);
    PyBuffer_Release(&data);
    return out;
}


#include "memowalk_index.h"

static PyMethodDef methods[] = {
    {"early_slot", early_slot, METH_VARARGS,
     "early_slot(data, table) -> (slot, offset, end): the first LONG_BINPUT beyond its offset, "
     "(0, 0) if none, (-1, offset) at a text opcode the caller must walk itself, (-2, offset) "
     "at a 4- or 8-byte string/bytes count beyond the data's end; end: the "
     "offset after STOP if the walk reached it and met no opcode that names or calls code, "
     "else -1."},
    {"early_slots", early_slots, METH_VARARGS,
     "early_slots(buffers, table) -> bytes: early_slot's three answers for each buffer, as "
     "native int64s, walked without the GIL."},
    {"item_pickle", item_pickle, METH_VARARGS,
     "item_pickle(data, j) -> (items, pickle) or None: a pickle of item j of the pickled list "
     "data (of that many items) alone, with the memo slots it reads from earlier items. None: "
     "not a protocol 4/5 pickle of plain data, or malformed."},
    {"block_index", block_index, METH_VARARGS,
     "block_index(data[, j]) -> bytes or None: the index item_at uses (where each item lies, "
     "which earlier memo slots items get), after the whole walk item_pickle makes; None where "
     "item_pickle would answer None for every item. With j: (index, item_at(data, j, index))."},
    {"item_at", item_at, METH_VARARGS,
     "item_at(data, j, index) -> bytes or None: item_pickle(data, j)'s pickle, from the "
     "block's index, walking only item j's bytes; None where the index says the item cannot "
     "be had alone, or does not fit these bytes."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "lmdata._native.memowalk", NULL, -1, methods};

PyMODINIT_FUNC
PyInit_memowalk(void)
{
    /* STACK_GLOBAL, EXT1, EXT2, EXT4, BINPERSID, REDUCE, NEWOBJ, NEWOBJ_EX, BUILD, OBJ (the
     * text ones, GLOBAL, INST and PERSID, end the walk as text opcodes) */
    static const unsigned char codes[] = {0x93, 0x82, 0x83, 0x84, 'Q', 'R', 0x81, 0x92, 'b', 'o'};
    for (size_t c = 0; c < sizeof(codes); c++) FOREIGN[codes[c]] = 1;
    /* SHORT_BINUNICODE, SHORT_BINBYTES, LONG1; BINUNICODE, BINBYTES, LONG4 (counts the
     * unpickler reads unsigned except LONG4's, refused above n anyway); BINUNICODE8, BINBYTES8 */
    ATOM[0x8c] = ATOM['C'] = ATOM[0x8a] = -1;
    ATOM['X'] = ATOM['B'] = ATOM[0x8b] = -4;
    ATOM[0x8d] = ATOM[0x8e] = -8;
    ATOM['J'] = 5; ATOM['K'] = 2; ATOM['M'] = 3; ATOM['G'] = 9; /* BININT, 1, 2, BINFLOAT */
    ATOM['N'] = ATOM[0x88] = ATOM[0x89] = 1; /* NONE, NEWTRUE, NEWFALSE */
    return native_module(&module);
}
