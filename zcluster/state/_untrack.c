/* zcluster.state._untrack: a buffered write taken off the cyclic garbage collector's lists, for
 * zcluster.state.batch.WriteBuffer.
 *
 * untrack(obj) -> bool: when obj is a tuple (an Insert or a Delete is one) whose type gives it no __dict__
 * and whose items are all of the exact types str, bytes, int, float, bool or None, stops the collector
 * tracking it (PyObject_GC_UnTrack) and returns True; anything else is left as it is (False). Such an object
 * refers to nothing that can refer back, so it is never part of a reference cycle, and its reference count
 * alone frees it: CPython's collector untracks plain tuples by the same rule (_PyTuple_MaybeUntrack), but
 * never a subclass's, and an Insert is a NamedTuple. Without this, the thousands of writes a WriteBuffer
 * holds until its flush were walked by every collection they lived through, and they aged into the oldest
 * generation, whose collections walk every object of the process.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int atomic(PyObject *item) {
    PyTypeObject *t = Py_TYPE(item);
    return t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyFloat_Type || t == &PyLong_Type ||
           t == &PyBool_Type || item == Py_None;
}

static PyObject *untrack(PyObject *module, PyObject *obj) {
    if (!PyTuple_Check(obj) || Py_TYPE(obj)->tp_dictoffset != 0 || !PyObject_GC_IsTracked(obj)) Py_RETURN_FALSE;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(obj); i < n; i++) {
        if (!atomic(PyTuple_GET_ITEM(obj, i))) Py_RETURN_FALSE;
    }
    PyObject_GC_UnTrack(obj);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"untrack", untrack, METH_O,
     "untrack(obj) -> bool: stop the cyclic collector tracking a tuple of atomic values (see the file's header)."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zcluster.state._untrack",
    "Buffered writes taken off the cyclic garbage collector's lists (see the file's header).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__untrack(void) { return PyModuleDef_Init(&module); }
