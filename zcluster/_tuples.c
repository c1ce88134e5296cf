/* zcluster._tuples: the write tuples (Insert, Delete, Incr, Count, KeyScoreMember: NamedTuples of three fields)
 * made and held at about the cost of a plain tuple.
 *
 * construct(cls): gives the three-field NamedTuple class cls a C constructor. A NamedTuple's own is a
 * Python function (its generated __new__), called through type.__call__ with an argument tuple built twice:
 * about five times a plain tuple's cost (timed: 165 ns against 31; this constructor 52), paid by every
 * mapper for every write. The constructor is the
 * class's vectorcall (PyTypeObject.tp_vectorcall, which CPython consults before type.__call__ and never
 * passes to a subclass): called with exactly three positional arguments, it makes the instance directly;
 * any other call (keywords, defaults, a wrong count) goes to type.__call__, the generated __new__ and its
 * errors, unchanged. The instance is the same either way: same type, same items, same equality and
 * pickling; only its tracking differs, as below. construct refuses (TypeError) a class that is not a tuple
 * subclass without __dict__ and with exactly three _fields.
 *
 * untrack(obj) -> bool: when obj is a tuple whose type gives it no __dict__ and whose items are all of the
 * exact types str, bytes, int, float, bool or None, stops the collector tracking it (PyObject_GC_UnTrack) and
 * returns True; anything else is left as it is (False). Such an object refers to nothing that can refer
 * back, so it is never part of a reference cycle, and its reference count alone frees it: CPython's
 * collector untracks plain tuples by the same rule (_PyTuple_MaybeUntrack), but never a subclass's, and an
 * Insert is a NamedTuple. The constructor above applies the same rule to what it makes. Without it, the
 * thousands of writes a WriteBuffer holds until its flush were walked by every collection they lived
 * through, and they aged into the oldest generation, whose collections walk every object of the process.
 */
#include "_native.h"

static int atomic(PyObject *item) {
    PyTypeObject *t = Py_TYPE(item);
    return t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyFloat_Type || t == &PyLong_Type ||
           t == &PyBool_Type || item == Py_None;
}

static int all_atomic(PyObject *tuple) {
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(tuple); i < n; i++) {
        if (!atomic(PyTuple_GET_ITEM(tuple, i))) return 0;
    }
    return 1;
}

static PyObject *untrack(PyObject *module, PyObject *obj) {
    if (!PyTuple_Check(obj) || Py_TYPE(obj)->tp_dictoffset != 0 || !PyObject_GC_IsTracked(obj)) Py_RETURN_FALSE;
    if (!all_atomic(obj)) Py_RETURN_FALSE;
    PyObject_GC_UnTrack(obj);
    Py_RETURN_TRUE;
}

/* type.__call__ with the vectorcall's arguments: the generated __new__ decides (and words the errors). */
static PyObject *general(PyObject *cls, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *positional = PyTuple_New(nargs);
    if (positional == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(positional, i, args[i]);
    }
    PyObject *keywords = NULL;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        keywords = PyDict_New();
        if (keywords == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            if (PyDict_SetItem(keywords, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) goto fail;
        }
    }
    PyObject *out = PyType_Type.tp_call(cls, positional, keywords);
    Py_DECREF(positional);
    Py_XDECREF(keywords);
    return out;
fail:
    Py_DECREF(positional);
    Py_XDECREF(keywords);
    return NULL;
}

static PyObject *three(PyObject *cls, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0))
        return general(cls, args, nargsf, kwnames);
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *out = type->tp_alloc(type, 3);
    if (out == NULL) return NULL;
#if PY_VERSION_HEX >= 0x030E0000
    ((PyTupleObject *)out)->ob_hash = -1; /* 3.14 caches a tuple's hash; tp_alloc zeroed it, and -1 is "none yet" */
#endif
    for (Py_ssize_t i = 0; i < 3; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(out, i, args[i]);
    }
    if (all_atomic(out)) PyObject_GC_UnTrack(out);
    return out;
}

static PyObject *construct(PyObject *module, PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) || (PyTypeObject *)cls == &PyTuple_Type) {
        PyErr_Format(PyExc_TypeError, "construct() takes a subclass of tuple, not %R", cls);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (type->tp_dictoffset != 0 || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        PyErr_Format(PyExc_TypeError, "construct() takes a NamedTuple class (no __dict__), not %R", cls);
        return NULL;
    }
    PyObject *fields = PyObject_GetAttrString(cls, "_fields");
    if (fields == NULL) return NULL;
    int ok = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == 3;
    Py_DECREF(fields);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "construct() takes a NamedTuple class of three fields, not %R", cls);
        return NULL;
    }
    type->tp_vectorcall = three;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"construct", construct, METH_O,
     "construct(cls): give a three-field NamedTuple class a C constructor (see the file's header)."},
    {"untrack", untrack, METH_O,
     "untrack(obj) -> bool: stop the cyclic collector tracking a tuple of atomic values (see the file's header)."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_tuples, "zcluster._tuples", "The write tuples made and held at a plain tuple's cost (see the file's header).", methods, (void)0)
