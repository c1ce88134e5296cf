/* zcluster.message._uuidhex: a UUID's canonical text parsed in C, for zcluster.message.uuid.
 *
 * bytes16(text) -> bytes or None: the 16 bytes of text when it is exactly a UUID's canonical form (36
 * characters, dashes at 8, 13, 18 and 23, hex digits of either case everywhere else), None for any other
 * str, as zcluster.message.uuid._bytes16 (the reference, and the path without a build) decides;
 * tests/message/test_uuidhex.py compares the two. The reference's replace and fromhex make two objects and
 * cost about 2,300 instructions per message; this makes only the result.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int nibble(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static PyObject *bytes16(PyObject *module, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "bytes16() takes a str, got %.200s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_GET_LENGTH(text) != 36 || !PyUnicode_IS_ASCII(text)) Py_RETURN_NONE;
    const unsigned char *s = PyUnicode_1BYTE_DATA(text);
    unsigned char out[16];
    int k = 0;
    for (int i = 0; i < 36;) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-') Py_RETURN_NONE;
            i++;
            continue;
        }
        int hi = nibble(s[i]), lo = nibble(s[i + 1]);
        if (hi < 0 || lo < 0) Py_RETURN_NONE;
        out[k++] = (unsigned char)(hi << 4 | lo);
        i += 2;
    }
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

static PyMethodDef methods[] = {
    {"bytes16", bytes16, METH_O,
     "bytes16(text) -> bytes or None: the 16 bytes of a UUID's canonical text (any case), else None."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zcluster.message._uuidhex", "A UUID's canonical text parsed in C (see the file's header).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__uuidhex(void) { return PyModuleDef_Init(&module); }
