/* What every extension of lmdata/_native/ shares (each includes it once, after Python.h): the
 * digest of the sources it was built from, which lmdata/_native/__init__.py compares with the
 * sources beside it, so that a build older than its sources is reported and not used. setup.py
 * passes the digest; a build made some other way has none and is never taken for current. */
#ifndef LMDATA_SOURCE_DIGEST
#define LMDATA_SOURCE_DIGEST ""
#endif

/* PyModule_Create(def) with the module's SOURCE_DIGEST set; NULL (an exception set) on failure. */
static PyObject *
native_module(PyModuleDef *def)
{
    PyObject *m = PyModule_Create(def);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", LMDATA_SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
