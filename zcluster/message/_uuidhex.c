/* zcluster.message._uuidhex: a UUID's canonical text parsed in C, for zcluster.message.uuid.
 *
 * bytes16(text) -> bytes or None: the 16 bytes of text when it is exactly a UUID's canonical form (36
 * characters, dashes at 8, 13, 18 and 23, hex digits of either case everywhere else), None for any other
 * str, as zcluster.message.uuid._bytes16 (the reference, and the path without a build) decides;
 * tests/message/test_uuidhex.py compares the two. The reference's replace and fromhex make two objects and
 * cost about 2,300 instructions per message; this makes only the result.
 *
 * ack_text(line) -> str or None: the 36 characters of line when it is exactly {"UUID":"<36 ASCII
 * characters>"} (47 bytes: the acknowledgement a JSON publisher appends after a transaction), None for any
 * other bytes, as zcluster.message.decoding._ack_text decides. A decoder reading such a line takes those
 * characters for the UUID without parsing JSON, when bytes16 accepts them: then no escape or quote can be
 * among them, and the JSON parse would have made {"UUID": the same text} (about 2,000 instructions).
 */
#include "../_native.h"

/* 0x10 | a hex digit's value, 0 for any other character: one load a character instead of three range checks
 * (the parse cost about 850 instructions a message with them). */
static const unsigned char HEX[256] = {
    ['0'] = 0x10, ['1'] = 0x11, ['2'] = 0x12, ['3'] = 0x13, ['4'] = 0x14, ['5'] = 0x15, ['6'] = 0x16,
    ['7'] = 0x17, ['8'] = 0x18, ['9'] = 0x19, ['a'] = 0x1A, ['b'] = 0x1B, ['c'] = 0x1C, ['d'] = 0x1D,
    ['e'] = 0x1E, ['f'] = 0x1F, ['A'] = 0x1A, ['B'] = 0x1B, ['C'] = 0x1C, ['D'] = 0x1D, ['E'] = 0x1E,
    ['F'] = 0x1F,
};

static PyObject *bytes16(PyObject *module, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "bytes16() takes a str, got %.200s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_GET_LENGTH(text) != 36 || !PyUnicode_IS_ASCII(text)) Py_RETURN_NONE;
    const unsigned char *s = PyUnicode_1BYTE_DATA(text);
    if (s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-') Py_RETURN_NONE;
    /* where each byte's two digits start: the dashes skipped */
    static const unsigned char at[16] = {0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34};
    unsigned char out[16], valid = 0x10;
    for (int k = 0; k < 16; k++) {
        unsigned char hi = HEX[s[at[k]]], lo = HEX[s[at[k] + 1]];
        valid &= hi & lo; /* bit 4 cleared by any character that is not a hex digit */
        out[k] = (unsigned char)((hi & 0x0F) << 4 | (lo & 0x0F));
    }
    if (!valid) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

static PyObject *ack_text(PyObject *module, PyObject *line) {
    if (!PyBytes_Check(line)) {
        PyErr_Format(PyExc_TypeError, "ack_text() takes bytes, got %.200s", Py_TYPE(line)->tp_name);
        return NULL;
    }
    static const char head[] = "{\"UUID\":\"";
    const char *s = PyBytes_AS_STRING(line);
    if (PyBytes_GET_SIZE(line) != 47 || memcmp(s, head, 9) != 0 || s[45] != '"' || s[46] != '}') Py_RETURN_NONE;
    for (int i = 9; i < 45; i++) {
        if ((unsigned char)s[i] >= 0x80) Py_RETURN_NONE;
    }
    return PyUnicode_FromStringAndSize(s + 9, 36);
}

static PyMethodDef methods[] = {
    {"bytes16", bytes16, METH_O,
     "bytes16(text) -> bytes or None: the 16 bytes of a UUID's canonical text (any case), else None."},
    {"ack_text", ack_text, METH_O,
     "ack_text(line) -> str or None: the UUID text of a line that is exactly {\"UUID\":\"<36 ASCII characters>\"}."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_uuidhex, "zcluster.message._uuidhex", "A UUID's canonical text parsed in C (see the file's header).", methods, (void)0)
