/* The memo-slot walk of lmdata/_pickle.py (_early_slot) at C speed, for the opcodes the
 * binary protocols use. The opcode table is passed in from Python (one source of truth);
 * a text opcode (PUT, or one that reads a line) returns -1 and Python walks the pickle. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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
    const unsigned char *p = (const unsigned char *)data.buf;
    const signed char *t = (const signed char *)table.buf;
    Py_ssize_t n = data.len, i = 0;
    long long slot = 0, at = 0;
    while (i < n) {
        int k = t[p[i]];
        if (k > 0) {
            i += k;
        } else if (k == -1) { /* count of one byte */
            if (i + 1 >= n) break;
            i += 2 + (Py_ssize_t)p[i + 1];
        } else if (k == -2 || k == -3) { /* count of 4 or 8 bytes, signed */
            int w = k == -2 ? 4 : 8;
            if (i + w >= n) break;
            unsigned long long u = 0;
            for (int b = w - 1; b >= 0; b--) u = (u << 8) | p[i + 1 + b];
            long long size = w == 4 ? (long long)(int32_t)(uint32_t)u : (long long)u;
            if (size < 0 || size > n) break; /* the unpickler refuses it, or it is truncated */
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
            break;
        }
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&table);
    return Py_BuildValue("(LL)", slot, at);
}

static PyMethodDef methods[] = {
    {"early_slot", early_slot, METH_VARARGS,
     "early_slot(data, table) -> (slot, offset): the first LONG_BINPUT beyond its offset, "
     "(0, 0) if none, (-1, offset) at a text opcode the caller must walk itself."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_memowalk", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__memowalk(void)
{
    return PyModule_Create(&module);
}
