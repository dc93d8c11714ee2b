/* The Dispatch type of mdsread.c (included there, once, after the Reader type it calls
 * straight into): a dataset's r[i] in one C call, from the global index to the shard's read
 * function. */

/* ---- Dispatch: r[i] of a whole dataset, from the global index to the shard's function ------ */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    long long *starts; /* nshards + 1 cumulative sample counts */
    Py_ssize_t nshards;
    PyObject *fns;       /* the reader's dict: shard -> (one, many, run), the one store of them */
    PyObject *costly;    /* the reader's set of shards holding decompressed bytes */
    PyObject *cache;     /* the process-wide cache, whose ``epoch`` counts removals */
    PyObject *functions; /* functions(k): shard k's (one, many, run), built or refreshed */
    PyObject *normalize; /* normalize(index): what Python's indexing makes of anything else */
    PyObject *seen;      /* the cache epoch the reader last refreshed at */
} Dispatch;

static PyObject *epoch_name;

static PyObject *
dispatch_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Dispatch *d = (Dispatch *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "takes one index");
        return NULL;
    }
    long long n = d->starts[d->nshards], i = -1;
    if (PyLong_CheckExact(args[0])) {
        int overflow;
        i = PyLong_AsLongLongAndOverflow(args[0], &overflow);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (overflow)
            i = -1;
    }
    if (!(0 <= i && i < n)) { /* negatives, numpy integers, errors: Python's rules */
        PyObject *v = PyObject_CallOneArg(d->normalize, args[0]);
        if (v == NULL)
            return NULL;
        i = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (!(0 <= i && i < n)) {
            PyErr_SetString(PyExc_IndexError, "index out of range");
            return NULL;
        }
    }
    Py_ssize_t lo = 0, hi = d->nshards; /* the last shard starting at or before i */
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (d->starts[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    PyObject *key = PyLong_FromSsize_t(lo);
    if (key == NULL)
        return NULL;
    /* owned at once: the epoch lookup below may run code that evicts this shard's entry */
    PyObject *fns = Py_XNewRef(PyDict_GetItemWithError(d->fns, key));
    int refresh = fns == NULL;
    if (!refresh && PySet_GET_SIZE(d->costly) > 0) {
        PyObject *epoch = PyObject_GetAttr(d->cache, epoch_name);
        if (epoch == NULL) {
            Py_DECREF(fns);
            Py_DECREF(key);
            return NULL;
        }
        int same = PyObject_RichCompareBool(epoch, d->seen, Py_EQ);
        if (same == 0)
            Py_SETREF(d->seen, Py_NewRef(epoch));
        Py_DECREF(epoch);
        if (same < 0) {
            Py_DECREF(fns);
            Py_DECREF(key);
            return NULL;
        }
        refresh = !same;
    }
    if (refresh) {
        if (PyErr_Occurred()) {
            Py_XDECREF(fns);
            Py_DECREF(key);
            return NULL;
        }
        Py_XDECREF(fns);
        fns = PyObject_CallOneArg(d->functions, key);
    }
    Py_DECREF(key);
    if (fns == NULL)
        return NULL;
    if (!PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) < 1) {
        Py_DECREF(fns);
        PyErr_SetString(PyExc_TypeError, "a shard's functions are a tuple");
        return NULL;
    }
    PyObject *one = PyTuple_GET_ITEM(fns, 0), *v;
    Py_ssize_t j = (Py_ssize_t)(i - d->starts[lo]);
    if (Py_IS_TYPE(one, &ReaderType)) {
        v = read_one((Reader *)one, j);
    } else {
        PyObject *jj = PyLong_FromSsize_t(j);
        v = jj == NULL ? NULL : PyObject_CallOneArg(one, jj);
        Py_XDECREF(jj);
    }
    Py_DECREF(fns);
    return v;
}

/* Dispatch(starts, fns, costly, cache, functions, normalize) */
static PyObject *
dispatch_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *starts, *fns, *costly, *cache, *functions, *normalize;
    if (!PyArg_ParseTuple(args, "O!O!O!OOO", &PyList_Type, &starts, &PyDict_Type, &fns,
                          &PySet_Type, &costly, &cache, &functions, &normalize))
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(starts);
    if (m < 1) {
        PyErr_SetString(PyExc_ValueError, "starts holds the shards' starts and the total");
        return NULL;
    }
    long long *st = PyMem_Malloc(m * sizeof(long long));
    if (st == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < m; k++) {
        st[k] = PyLong_AsLongLong(PyList_GET_ITEM(starts, k));
        if ((st[k] == -1 && PyErr_Occurred()) || (k > 0 && st[k] < st[k - 1]) || st[0] != 0) {
            PyMem_Free(st);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "starts must rise from 0");
            return NULL;
        }
    }
    PyObject *seen = PyObject_GetAttr(cache, epoch_name);
    if (seen == NULL) {
        PyMem_Free(st);
        return NULL;
    }
    Dispatch *self = (Dispatch *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyMem_Free(st);
        Py_DECREF(seen);
        return NULL;
    }
    self->vectorcall = dispatch_vectorcall;
    self->starts = st;
    self->nshards = m - 1;
    self->fns = Py_NewRef(fns);
    self->costly = Py_NewRef(costly);
    self->cache = Py_NewRef(cache);
    self->functions = Py_NewRef(functions);
    self->normalize = Py_NewRef(normalize);
    self->seen = seen;
    return (PyObject *)self;
}

static int
dispatch_traverse(Dispatch *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fns);
    Py_VISIT(self->costly);
    Py_VISIT(self->cache);
    Py_VISIT(self->functions);
    Py_VISIT(self->normalize);
    Py_VISIT(self->seen);
    return 0;
}

static int
dispatch_clear(Dispatch *self)
{
    Py_CLEAR(self->fns);
    Py_CLEAR(self->costly);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->functions);
    Py_CLEAR(self->normalize);
    Py_CLEAR(self->seen);
    return 0;
}

static void
dispatch_dealloc(Dispatch *self)
{
    PyObject_GC_UnTrack(self);
    dispatch_clear(self);
    PyMem_Free(self->starts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lmdata._native.mdsread.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A dataset's r[i]: d(i) finds the shard and calls its read function.",
    .tp_new = dispatch_new,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_traverse = (traverseproc)dispatch_traverse,
    .tp_clear = (inquiry)dispatch_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Dispatch, vectorcall),
};
