/* zcluster._tuples: the write tuples (Insert, Delete, Incr, Count, KeyScoreMember: NamedTuples of three fields)
 * and the Sequencer's ProducerState made and held at about the cost of a plain tuple.
 *
 * construct(cls): gives the NamedTuple class cls (of 1 to 8 fields) a C constructor. A NamedTuple's own is a
 * Python function (its generated __new__), called through type.__call__ with an argument tuple built twice:
 * about five times a plain tuple's cost (timed: 165 ns against 31; this constructor 52), paid by every
 * mapper for every write. The constructor is the
 * class's vectorcall (PyTypeObject.tp_vectorcall, which CPython consults before type.__call__ and never
 * passes to a subclass): called with exactly one positional argument per field, it makes the instance directly;
 * any other call (keywords, defaults, a wrong count) goes to type.__call__, the generated __new__ and its
 * errors, unchanged. The instance is the same either way: same type, same items, same equality and
 * pickling; only its tracking differs, as below. construct refuses (TypeError) a class that is not a tuple
 * subclass without __dict__ and with 1 to 8 _fields, and more than 16 classes in all (a table of the classes
 * and their widths, searched at each call, stays short).
 *
 * untrack(obj) -> bool: when obj is a tuple whose type gives it no __dict__ and whose items are all of the
 * exact types str, bytes, int, float, bool or None, stops the collector tracking it (PyObject_GC_UnTrack) and
 * returns True; anything else is left as it is (False). Such an object refers to nothing that can refer
 * back, so it is never part of a reference cycle, and its reference count alone frees it: CPython's
 * collector untracks plain tuples by the same rule (_PyTuple_MaybeUntrack), but never a subclass's, and an
 * Insert is a NamedTuple. The constructor above applies the same rule to what it makes. Without it, the
 * thousands of writes a WriteBuffer holds until its flush were walked by every collection they lived
 * through, and they aged into the oldest generation, whose collections walk every object of the process.
 * A plain list (exactly list) of atomic values is untracked by the same rule, on its owner's promise to
 * store nothing but atomic values in it later (a list, unlike a tuple, changes; the collector would not see
 * a container stored in it afterwards). The Sequencer's rings of clocks, offsets and links are such lists:
 * thousands of slots made with each Sequencer, which every young collection walked until they aged.
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
    if (!PyObject_GC_IsTracked(obj)) Py_RETURN_FALSE;
    if (PyList_CheckExact(obj)) {
        for (Py_ssize_t i = 0, n = PyList_GET_SIZE(obj); i < n; i++) {
            if (!atomic(PyList_GET_ITEM(obj, i))) Py_RETURN_FALSE;
        }
    } else if (!PyTuple_Check(obj) || Py_TYPE(obj)->tp_dictoffset != 0 || !all_atomic(obj)) {
        Py_RETURN_FALSE;
    }
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

#define MAX_CLASSES 16
#define MAX_FIELDS 8
static PyTypeObject *classes[MAX_CLASSES]; /* the constructed classes (each holds a reference) and their widths */
static Py_ssize_t widths[MAX_CLASSES];
static int n_classes;

static PyObject *direct(PyObject *cls, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t width = -1, nargs = PyVectorcall_NARGS(nargsf);
    for (int i = 0; i < n_classes; i++) {
        if (classes[i] == (PyTypeObject *)cls) width = widths[i];
    }
    if (nargs != width || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0))
        return general(cls, args, nargsf, kwnames);
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *out = type->tp_alloc(type, nargs);
    if (out == NULL) return NULL;
#if PY_VERSION_HEX >= 0x030E0000
    ((PyTupleObject *)out)->ob_hash = -1; /* 3.14 caches a tuple's hash; tp_alloc zeroed it, and -1 is "none yet" */
#endif
    for (Py_ssize_t i = 0; i < nargs; i++) {
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
    Py_ssize_t width = PyTuple_Check(fields) ? PyTuple_GET_SIZE(fields) : 0;
    Py_DECREF(fields);
    if (width < 1 || width > MAX_FIELDS) {
        PyErr_Format(PyExc_TypeError, "construct() takes a NamedTuple class of 1 to %d fields, not %R", MAX_FIELDS, cls);
        return NULL;
    }
    for (int i = 0; i < n_classes; i++) {
        if (classes[i] == type) Py_RETURN_NONE; /* already */
    }
    if (n_classes == MAX_CLASSES) {
        PyErr_Format(PyExc_TypeError, "construct(): %d classes at most, refusing %R", MAX_CLASSES, cls);
        return NULL;
    }
    Py_INCREF(cls); /* the table's: a constructed class is never freed */
    classes[n_classes] = type;
    widths[n_classes++] = width;
    type->tp_vectorcall = direct;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"construct", construct, METH_O,
     "construct(cls): give a NamedTuple class of 1 to 8 fields a C constructor (see the file's header)."},
    {"untrack", untrack, METH_O,
     "untrack(obj) -> bool: stop the cyclic collector tracking a tuple or list of atomic values (see the file's header)."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_tuples, "zcluster._tuples", "The write tuples made and held at a plain tuple's cost (see the file's header).", methods, (void)0)
