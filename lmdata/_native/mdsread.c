/* The MDS read functions of lmdata/formats/mds/fastpath.py in one C call per sample: offsets,
 * size table, the checks, then int/str/bytes/json/1-D ndarray columns built straight from the
 * shard's buffer (no slice per column, no interpreted step). Whatever is not plain -- offsets
 * outside the file, sizes that do not add up, text that is not UTF-8, a JSON digit run that may
 * be an integer beyond 64 bits, a decoder that raises -- goes to ``fallback(j)``, the generated
 * Python function, which decodes the sample again and returns it or raises the precise error.
 * Built optionally (setup.py); without it the Python functions do all of this. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native.h"
#include <stddef.h>

#if SIZEOF_SIZE_T < 8
/* Sizes and offsets (uint32 in MDS) are summed in Py_ssize_t: only sound on 64-bit builds.
 * The extension is optional, so a 32-bit build skips it and the Python reader runs. */
#error "lmdata._native.mdsread needs a 64-bit build"
#endif

enum { K_INT = 0, K_STR = 1, K_BYTES = 2, K_JSON = 3, K_ND = 4, K_OTHER = 5 };

typedef struct {
    PyObject *name; /* NULL: column not kept (its bytes are skipped) */
    int kind;
    Py_ssize_t size; /* -1: variable, its size in the sample's size table */
    PyObject *aux;   /* K_ND: the dtype; K_OTHER: the decoder */
    Py_ssize_t itemsize;
} Col;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *table, *data, *fallback, *loads, *frombuffer;
    Py_ssize_t lo, size, nvar, head, fixed, ncols, long_run;
    int ranged; /* data is fetch(begin, length), not the shard's buffer */
    Col *cols;
} Reader;

static unsigned long long
le(const unsigned char *p, int n)
{
    unsigned long long v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* 1 when the text holds a run of at least ``limit`` ASCII digits */
static int
long_digit_run(const unsigned char *p, Py_ssize_t n, Py_ssize_t limit)
{
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] >= '0' && p[i] <= '9') {
            if (++run >= limit)
                return 1;
        } else {
            run = 0;
        }
    }
    return 0;
}

/* An ordinary exception (as Python's ``except Exception``) is cleared: the sample goes to the
 * fallback. Anything else (KeyboardInterrupt, SystemExit) stays set and propagates. */
static int
declined(void)
{
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return 0;
}

static PyObject *
column(Reader *r, Col *c, const unsigned char *p, Py_ssize_t n)
{
    switch (c->kind) {
    case K_INT:
        return PyLong_FromLongLong((long long)le(p, 8));
    case K_STR:
        return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    case K_BYTES:
        return PyBytes_FromStringAndSize((const char *)p, n);
    case K_JSON: {
        if (n >= r->long_run && long_digit_run(p, n, r->long_run))
            return NULL; /* no error set: the fallback parses it exactly */
        PyObject *x = PyBytes_FromStringAndSize((const char *)p, n);
        if (x == NULL)
            return NULL;
        PyObject *v = PyObject_CallOneArg(r->loads, x);
        Py_DECREF(x);
        return v;
    }
    case K_ND: {
        if (n < 1)
            return NULL;
        int h = p[0], w = 1 << (h & 3);
        if (h >> 2 != 1 || n < 1 + w)
            return NULL;
        unsigned long long m = le(p + 1, w);
        if (m > (unsigned long long)n || /* no overflow below */
            m * (unsigned long long)c->itemsize != (unsigned long long)(n - 1 - w))
            return NULL;
        PyObject *x = PyBytes_FromStringAndSize((const char *)p, n);
        if (x == NULL)
            return NULL;
        PyObject *v = PyObject_CallFunction(r->frombuffer, "OOnn", x, c->aux, (Py_ssize_t)m,
                                            (Py_ssize_t)(1 + w));
        Py_DECREF(x);
        return v;
    }
    default: {
        PyObject *x = PyBytes_FromStringAndSize((const char *)p, n);
        if (x == NULL)
            return NULL;
        PyObject *v = PyObject_CallOneArg(c->aux, x);
        Py_DECREF(x);
        return v;
    }
    }
}

/* The sample in dat[b:e] (its size table first) as a dict, or NULL: with an error set to
 * propagate, else "use the fallback". The caller checked b <= e inside dat and e - b >= head. */
static PyObject *
sample(Reader *r, const unsigned char *dat, Py_ssize_t b, Py_ssize_t e)
{
    Py_ssize_t total = r->head + r->fixed;
    for (Py_ssize_t k = 0; k < r->nvar; k++)
        total += (Py_ssize_t)le(dat + b + 4 * k, 4);
    if (total != e - b)
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = b + r->head, var = 0;
    for (Py_ssize_t i = 0; i < r->ncols; i++) {
        Col *c = &r->cols[i];
        Py_ssize_t n = c->size;
        if (n < 0)
            n = (Py_ssize_t)le(dat + b + 4 * var++, 4);
        if (c->name != NULL) {
            PyObject *v = column(r, c, dat + pos, n);
            if (v == NULL || PyDict_SetItem(out, c->name, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
        pos += n;
    }
    return out;
}

/* Sample j's offsets from the table, checked against the file's [lo, size), into *b and *e;
 * 0 when they are not a range of at least a size table inside it. */
static int
offsets(Reader *r, const unsigned char *tab, Py_ssize_t tlen, Py_ssize_t j, Py_ssize_t size,
        Py_ssize_t *b, Py_ssize_t *e)
{
    if (j < 0 || tlen < 12 || j > (tlen - 12) / 4) /* the two offsets lie in the table */
        return 0;
    *b = (Py_ssize_t)le(tab + 4 + 4 * j, 4);
    *e = (Py_ssize_t)le(tab + 8 + 4 * j, 4);
    return r->lo <= *b && *b <= *e && *e <= size && *e - *b >= r->head;
}

/* sample j's dict from the shard's buffer, or NULL (as sample()) */
static PyObject *
decode(Reader *r, const unsigned char *tab, Py_ssize_t tlen, const unsigned char *dat,
       Py_ssize_t dlen, Py_ssize_t j)
{
    Py_ssize_t b, e;
    if (!offsets(r, tab, tlen, j, r->size < dlen ? r->size : dlen, &b, &e))
        return NULL;
    return sample(r, dat, b, e);
}

/* sample j's dict from a shard read by ranges (r->data is fetch(begin, length) -> bytes, the
 * sample's bytes from the store or its range cache), or NULL (as sample()) */
static PyObject *
decode_ranged(Reader *r, const unsigned char *tab, Py_ssize_t tlen, Py_ssize_t j)
{
    Py_ssize_t b, e;
    if (!offsets(r, tab, tlen, j, r->size, &b, &e))
        return NULL;
    PyObject *blob = PyObject_CallFunction(r->data, "nn", b, e - b);
    if (blob == NULL)
        return NULL;
    Py_buffer d;
    PyObject *v = NULL;
    if (PyObject_GetBuffer(blob, &d, PyBUF_SIMPLE) == 0) {
        if (d.len == e - b)
            v = sample(r, d.buf, 0, d.len);
        PyBuffer_Release(&d);
    }
    Py_DECREF(blob);
    return v;
}

static PyObject *
read_one(Reader *r, Py_ssize_t j)
{
    Py_buffer t, d;
    PyObject *v;
    if (PyObject_GetBuffer(r->table, &t, PyBUF_SIMPLE) < 0)
        return NULL;
    if (r->ranged) {
        v = decode_ranged(r, t.buf, t.len, j);
    } else {
        if (PyObject_GetBuffer(r->data, &d, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&t);
            return NULL;
        }
        v = decode(r, t.buf, t.len, d.buf, d.len, j);
        PyBuffer_Release(&d);
    }
    PyBuffer_Release(&t);
    if (v != NULL)
        return v;
    if (declined() < 0)
        return NULL;
    PyObject *jj = PyLong_FromSsize_t(j);
    if (jj == NULL)
        return NULL;
    v = PyObject_CallOneArg(r->fallback, jj);
    Py_DECREF(jj);
    return v;
}

static PyObject *
reader_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a read function takes one sample number");
        return NULL;
    }
    Py_ssize_t j = PyLong_AsSsize_t(args[0]);
    if (j == -1 && PyErr_Occurred())
        return NULL;
    return read_one((Reader *)self, j);
}

static PyObject *
reader_many(Reader *self, PyObject *js)
{
    PyObject *it = PyObject_GetIter(js);
    if (it == NULL)
        return NULL;
    PyObject *out = PyList_New(0), *item;
    if (out == NULL) {
        Py_DECREF(it);
        return NULL;
    }
    while ((item = PyIter_Next(it)) != NULL) {
        Py_ssize_t j = PyLong_AsSsize_t(item);
        Py_DECREF(item);
        PyObject *v = (j == -1 && PyErr_Occurred()) ? NULL : read_one(self, j);
        if (v == NULL || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            Py_DECREF(it);
            return NULL;
        }
        Py_DECREF(v);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
reader_run(Reader *self, PyObject *args)
{
    Py_ssize_t j0, j1;
    if (!PyArg_ParseTuple(args, "nn", &j0, &j1))
        return NULL;
    PyObject *out = PyList_New(j1 > j0 ? j1 - j0 : 0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = j0; j < j1; j++) {
        PyObject *v = read_one(self, j);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j - j0, v);
    }
    return out;
}

static void
free_cols(Col *cols, Py_ssize_t n)
{
    if (cols == NULL)
        return;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(cols[i].name);
        Py_XDECREF(cols[i].aux);
    }
    PyMem_Free(cols);
}

/* Reader(table, data, lo, size, columns, nvar, long_run, loads, frombuffer, fallback);
 * data: the shard's buffer, or a callable fetch(begin, length) -> bytes for a shard read by
 * ranges; columns: ((name or None, kind, size or -1, aux, itemsize), ...) in the shard's order */
static PyObject *
reader_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *table, *data, *spec, *loads, *frombuffer, *fallback;
    Py_ssize_t lo, size, nvar, long_run;
    if (!PyArg_ParseTuple(args, "OOnnO!nnOOO", &table, &data, &lo, &size, &PyTuple_Type, &spec,
                          &nvar, &long_run, &loads, &frombuffer, &fallback))
        return NULL;
    int ranged = !PyObject_CheckBuffer(data);
    if (ranged && !PyCallable_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "data is a buffer or a fetch(begin, length) callable");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    Col *cols = PyMem_Calloc(n > 0 ? n : 1, sizeof(Col));
    if (cols == NULL)
        return PyErr_NoMemory();
    Py_ssize_t fixed = 0, counted = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *aux;
        int kind;
        Py_ssize_t csize, itemsize;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spec, i), "OinOn", &name, &kind, &csize, &aux,
                              &itemsize)) {
            free_cols(cols, n);
            return NULL;
        }
        if (kind < K_INT || kind > K_OTHER || (kind == K_INT && csize != 8) || csize < -1 ||
            (name != Py_None && !PyUnicode_Check(name))) {
            free_cols(cols, n);
            PyErr_SetString(PyExc_ValueError, "bad column spec");
            return NULL;
        }
        cols[i].name = name == Py_None ? NULL : Py_NewRef(name);
        cols[i].kind = kind;
        cols[i].size = csize;
        cols[i].aux = Py_NewRef(aux);
        cols[i].itemsize = itemsize;
        if (csize < 0)
            counted++;
        else
            fixed += csize;
    }
    if (counted != nvar) {
        free_cols(cols, n);
        PyErr_SetString(PyExc_ValueError, "nvar differs from the variable columns");
        return NULL;
    }
    Reader *self = (Reader *)type->tp_alloc(type, 0);
    if (self == NULL) {
        free_cols(cols, n);
        return NULL;
    }
    self->vectorcall = reader_vectorcall;
    self->table = Py_NewRef(table);
    self->data = Py_NewRef(data);
    self->loads = Py_NewRef(loads);
    self->frombuffer = Py_NewRef(frombuffer);
    self->fallback = Py_NewRef(fallback);
    self->lo = lo;
    self->size = size;
    self->ranged = ranged;
    self->nvar = nvar;
    self->head = 4 * nvar;
    self->fixed = fixed;
    self->ncols = n;
    self->long_run = long_run;
    self->cols = cols;
    return (PyObject *)self;
}

static int
reader_traverse(Reader *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->data);
    Py_VISIT(self->loads);
    Py_VISIT(self->frombuffer);
    Py_VISIT(self->fallback);
    for (Py_ssize_t i = 0; i < self->ncols; i++)
        Py_VISIT(self->cols[i].aux);
    return 0;
}

static int
reader_clear(Reader *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->data);
    Py_CLEAR(self->loads);
    Py_CLEAR(self->frombuffer);
    Py_CLEAR(self->fallback);
    free_cols(self->cols, self->ncols);
    self->cols = NULL;
    self->ncols = 0;
    return 0;
}

static void
reader_dealloc(Reader *self)
{
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"many", (PyCFunction)reader_many, METH_O, "many(js): the samples js, in that order"},
    {"run", (PyCFunction)reader_run, METH_VARARGS, "run(j0, j1): samples j0..j1-1"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lmdata._native.mdsread.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One shard's read function: reader(j) is sample j's dict.",
    .tp_new = reader_new,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Reader, vectorcall),
    .tp_methods = reader_methods,
};

/* Dispatch: r[i] of a whole dataset, from the global index to the shard's Reader. */
#include "mdsread_dispatch.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "lmdata._native.mdsread", "MDS samples decoded in one C call.", -1, NULL,
};

PyMODINIT_FUNC
PyInit_mdsread(void)
{
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&DispatchType) < 0)
        return NULL;
    epoch_name = PyUnicode_InternFromString("epoch");
    if (epoch_name == NULL)
        return NULL;
    PyObject *m = native_module(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DispatchType);
    if (PyModule_AddObject(m, "Dispatch", (PyObject *)&DispatchType) < 0) {
        Py_DECREF(&DispatchType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
