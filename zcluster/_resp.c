/* zcluster._resp: Redis commands packed into RESP, for the pipelines of zcluster._pipelines.
 *
 * pack_commands(commands) -> bytes: every command (a tuple or list of bytes, str, int and float arguments)
 * as a RESP array of bulk strings, all in one bytes object. The bytes are exactly hiredis' pack_command's
 * for the same arguments (str as UTF-8, int in decimal, float as Python's repr), which
 * tests/test_resp.py checks on random commands; it costs a fraction of it, as it makes no Python object
 * per argument and finds the shortest digits of a score (any from 1e-3 to 2^53) in integer arithmetic, at a
 * fraction of the cost of repr's general search.
 * Anything else (bool included: Redis has no booleans) is a TypeError naming the command and the argument.
 */
#include "_native.h"
#include <math.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int grow(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2;
    if (cap < b->len + more) cap = b->len + more + 256;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

/* Decimal digits of v into the end of tmp (32 bytes); returns where they start. */
static char *digits(unsigned long long v, int negative, char *end) {
    char *p = end;
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (negative) *--p = '-';
    return p;
}

/* "<mark><n>\r\n" */
static int header(Buf *b, char mark, Py_ssize_t n) {
    char tmp[32];
    char *p = digits((unsigned long long)n, 0, tmp + sizeof tmp);
    Py_ssize_t k = tmp + sizeof tmp - p;
    if (grow(b, k + 3) < 0) return -1;
    b->data[b->len++] = mark;
    memcpy(b->data + b->len, p, (size_t)k);
    b->len += k;
    b->data[b->len++] = '\r';
    b->data[b->len++] = '\n';
    return 0;
}

static int bulk(Buf *b, const char *s, Py_ssize_t n) {
    if (header(b, '$', n) < 0 || grow(b, n + 2) < 0) return -1;
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    b->data[b->len++] = '\r';
    b->data[b->len++] = '\n';
    return 0;
}

/* repr of v for 1e-3 <= |v| < 2^53 (repr writes those without an exponent): the shortest decimal that reads
 * back as v, found exactly in 128-bit integers. |v| = m * 2^e with e < 0 (whole numbers are handled before),
 * so in units of 2^(e-2) it is 4m, and a number reads back as v when it lies strictly between 4m - 2 and
 * 4m + 2 (4m - 1 below a power of two, whose lower neighbour is nearer). For k = 1, 2, ... decimals, the
 * k-decimal number nearest to v is d / 10^k with d = round(4m * 10^k / 2^(2-e)); the first that lies inside
 * is repr's text: the fewest digits and, among those, the nearest. The loop ends by k = -e, where v's own
 * exact decimal expansion is the candidate; the interval's ends need one decimal more, so whether they would
 * read back as v never matters. Returns 0 once written, -1 on error, 1 when v is out of that range.
 * tests/test_resp.py checks it against repr on millions of values. */
static int shortest(Buf *b, double v) {
    typedef unsigned __int128 u128;
    double a = fabs(v);
    if (!(a >= 1e-3 && a < 9007199254740992.0)) return 1;
    unsigned long long bits;
    memcpy(&bits, &a, sizeof bits);
    const unsigned long long hidden = 1ULL << 52;
    unsigned long long m = (bits & (hidden - 1)) | hidden;
    int e = (int)(bits >> 52) - 1075, s = 2 - e; /* |v| = m * 2^e = 4m / 2^s; 3 <= s <= 64 here */
    if (e >= 0) return 1;
    u128 mid = (u128)m * 4, lo = mid - (m == hidden ? 1 : 2), hi = mid + 2, p = 1, half = (u128)1 << (s - 1);
    for (int k = 1; k <= 21; k++) {
        p *= 10; /* mid * p < 2^55 * 10^21 < 2^128 */
        u128 x = mid * p, d = x >> s, rem = x - (d << s);
        if (rem > half || (rem == half && (d & 1))) d++;
        u128 at = d << s;
        if (at > lo * p && at < hi * p) {
            char tmp[48], *end = tmp + sizeof tmp;
            unsigned long long n = (unsigned long long)d; /* at most 17 digits */
            for (int i = 0; i < k; i++) { /* the k decimals, the point, the whole part ("0" at least) */
                *--end = (char)('0' + n % 10);
                n /= 10;
            }
            *--end = '.';
            char *start = digits(n, v < 0, end);
            return bulk(b, start, tmp + sizeof tmp - start);
        }
    }
    return 1;
}

static int argument(Buf *b, PyObject *arg, Py_ssize_t command, Py_ssize_t index) {
    char tmp[32], *end = tmp + sizeof tmp;
    if (PyBytes_CheckExact(arg)) return bulk(b, PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    if (PyUnicode_Check(arg)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
        return s == NULL ? -1 : bulk(b, s, n);
    }
    if (PyFloat_CheckExact(arg)) {
        double v = PyFloat_AS_DOUBLE(arg);
        /* repr of a whole number below 1e16 is its digits and ".0" (-0.0 keeps its sign) */
        if (v > -1e16 && v < 1e16 && v == (double)(long long)v) {
            long long whole = (long long)v;
            *--end = '0';
            *--end = '.';
            int negative = whole < 0 || (whole == 0 && signbit(v));
            char *p = digits(negative ? 0ULL - (unsigned long long)whole : (unsigned long long)whole, negative, end);
            return bulk(b, p, tmp + sizeof tmp - p);
        }
        int written = shortest(b, v);
        if (written != 1) return written;
        char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (text == NULL) return -1;
        int rc = bulk(b, text, (Py_ssize_t)strlen(text));
        PyMem_Free(text);
        return rc;
    }
    if (PyLong_Check(arg) && !PyBool_Check(arg)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (!overflow) {
            char *p = digits(v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v, v < 0, end);
            return bulk(b, p, end - p);
        }
        PyObject *text = PyObject_Str(arg);
        if (text == NULL) return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(text, &n);
        int rc = s == NULL ? -1 : bulk(b, s, n);
        Py_DECREF(text);
        return rc;
    }
    if (PyBytes_Check(arg)) return bulk(b, PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    if (PyFloat_Check(arg)) { /* a float subclass: its value, as a float */
        PyObject *plain = PyFloat_FromDouble(PyFloat_AS_DOUBLE(arg));
        if (plain == NULL) return -1;
        int rc = argument(b, plain, command, index);
        Py_DECREF(plain);
        return rc;
    }
    PyErr_Format(PyExc_TypeError, "command %zd, argument %zd: expected bytes, str, int or float, got %.200s", command,
                 index, Py_TYPE(arg)->tp_name);
    return -1;
}

static PyObject *pack_commands(PyObject *module, PyObject *commands) {
    PyObject *seq = PySequence_Fast(commands, "pack_commands() takes a sequence of commands");
    if (seq == NULL) return NULL;
    Buf b = {NULL, 0, 0};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (grow(&b, 64 * n + 64) < 0) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *command = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(command) && !PyList_Check(command)) {
            PyErr_Format(PyExc_TypeError, "command %zd: expected a tuple or list, got %.200s", i,
                         Py_TYPE(command)->tp_name);
            goto fail;
        }
        Py_ssize_t argc = PySequence_Fast_GET_SIZE(command);
        if (argc == 0) {
            PyErr_Format(PyExc_ValueError, "command %zd is empty", i);
            goto fail;
        }
        PyObject **args = PySequence_Fast_ITEMS(command);
        if (header(&b, '*', argc) < 0) goto fail;
        for (Py_ssize_t j = 0; j < argc; j++) {
            if (argument(&b, args[j], i, j) < 0) goto fail;
        }
    }
    Py_DECREF(seq);
    PyObject *out = PyBytes_FromStringAndSize(b.data, b.len);
    PyMem_Free(b.data);
    return out;
fail:
    Py_DECREF(seq);
    PyMem_Free(b.data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_commands", pack_commands, METH_O,
     "pack_commands(commands) -> bytes: each command (a tuple or list of bytes, str, int or float) as RESP, "
     "the bytes hiredis' pack_command makes, all in one bytes object."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_resp, "zcluster._resp", "Redis commands packed into RESP (see the file's header).", methods, (void)0)
