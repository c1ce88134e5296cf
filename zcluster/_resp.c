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

/* The output, written straight into the bytes object returned (cut to its length at the end): no copy of
 * the whole at the end, and sized from the argument count first, so that a pipeline's megabyte is rarely
 * moved while it grows. */
typedef struct {
    PyObject *bytes;
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int grow_slow(Buf *b, Py_ssize_t more) {
    Py_ssize_t cap = b->cap * 2;
    if (cap < b->len + more) cap = b->len + more + 256;
    if (b->bytes == NULL) {
        b->bytes = PyBytes_FromStringAndSize(NULL, cap);
        if (b->bytes == NULL) return -1;
    } else if (_PyBytes_Resize(&b->bytes, cap) < 0) {
        return -1; /* b->bytes is NULL: freed */
    }
    b->data = PyBytes_AS_STRING(b->bytes);
    b->cap = cap;
    return 0;
}

/* Room for `more` bytes: inline, as every argument asks (the pipeline's bytes are sized beforehand). */
static inline int grow(Buf *b, Py_ssize_t more) { return b->len + more <= b->cap ? 0 : grow_slow(b, more); }

/* The last k decimal digits of v into the k bytes before end (leading zeros kept); returns v without them. */
static unsigned long long last_digits(unsigned long long v, int k, char *end) {
    for (; k >= 2; k -= 2, v /= 100) {
        end -= 2;
        memcpy(end, ZC_PAIRS + 2 * (v % 100), 2);
    }
    if (k) {
        *--end = (char)('0' + v % 10);
        v /= 10;
    }
    return v;
}

/* "<mark><n>\r\n" */
static int header(Buf *b, char mark, Py_ssize_t n) {
    char tmp[32];
    char *p = zc_digits((unsigned long long)n, 0, tmp + sizeof tmp);
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
    if (n < 100) { /* most arguments: one growth check, the length's digits from ZC_PAIRS */
        if (grow(b, n + 7) < 0) return -1;
        char *p = b->data + b->len;
        *p++ = '$';
        if (n < 10) {
            *p++ = (char)('0' + n);
        } else {
            memcpy(p, ZC_PAIRS + 2 * n, 2);
            p += 2;
        }
        *p++ = '\r';
        *p++ = '\n';
        memcpy(p, s, (size_t)n);
        p += n;
        *p++ = '\r';
        *p++ = '\n';
        b->len = p - b->data;
        return 0;
    }
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
 * 4m + 2 (4m - 1 below a power of two, whose lower neighbour is nearer). For k decimals, the k-decimal
 * number nearest to v is d / 10^k with d = round(4m * 10^k / 2^(2-e)); the fewest k for which it lies inside
 * gives repr's text: the fewest digits and, among those, the nearest. Seventeen significant digits always
 * read back, which bounds k by k17 (at most 19 here). Where the interval is symmetric, a nearer number lies
 * inside whenever a farther one does, and the k-decimal nearest is never farther than the (k-1)-decimal one,
 * so "inside" only turns on as k grows: a binary search over 1..k17 finds the fewest in about four tries
 * (a typical timestamp needs its 17 digits: seven tries one by one). Below a power of two, the lower side
 * is narrower and that order may break: k grows one by one there. Returns 0 once written, -1 on error, 1
 * when v is out of that range. tests/test_resp.py checks it against repr on millions of values. */
typedef unsigned __int128 u128;

typedef struct {
    u128 mid, lo, hi, half;
    int s;
} Interval;

/* d (the k-decimal nearest to v, times 10^k) when it reads back as v, else 0 (d is never 0 in range) */
static unsigned long long inside(const Interval *in, int k) {
    static const u128 TEN[22] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
                                 100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
                                 10000000000000ULL, 100000000000000ULL, 1000000000000000ULL,
                                 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
                                 10000000000000000000ULL, (u128)10000000000000000000ULL * 10,
                                 (u128)10000000000000000000ULL * 100};
    u128 p = TEN[k], x = in->mid * p, d = x >> in->s, rem = x - (d << in->s); /* mid * p < 2^55 * 10^21 */
    if (rem > in->half || (rem == in->half && (d & 1))) d++;
    u128 at = d << in->s;
    return at > in->lo * p && at < in->hi * p ? (unsigned long long)d : 0;
}

static int shortest(Buf *b, double v) {
    double a = fabs(v);
    if (!(a >= 1e-3 && a < 9007199254740992.0)) return 1;
    unsigned long long bits;
    memcpy(&bits, &a, sizeof bits);
    const unsigned long long hidden = 1ULL << 52;
    unsigned long long m = (bits & (hidden - 1)) | hidden;
    int e = (int)(bits >> 52) - 1075, s = 2 - e; /* |v| = m * 2^e = 4m / 2^s; 3 <= s <= 64 here */
    if (e >= 0) return 1;
    Interval in = {(u128)m * 4, (u128)m * 4 - (m == hidden ? 1 : 2), (u128)m * 4 + 2, (u128)1 << (s - 1), s};
    /* k17: decimals for 17 significant digits (the whole part's digits, or the zeros after the point) */
    unsigned long long whole = (unsigned long long)a;
    int k17 = 17;
    for (unsigned long long w = whole; w; w /= 10) k17--;
    for (double f = a * 10; whole == 0 && f < 1; f *= 10) k17++;
    if (k17 < 1) k17 = 1;
    int k = 0;
    unsigned long long d = 0;
    if (m != hidden) {
        int low = 1, high = k17; /* the fewest k is in [low, high], high known inside */
        unsigned long long at_high = inside(&in, high);
        if (at_high && high > 1) { /* most scores (timestamps) need all 17 digits: one try says so */
            unsigned long long fewer = inside(&in, high - 1);
            if (fewer) {
                high--;
                at_high = fewer;
            } else {
                low = high;
            }
        }
        if (at_high) {
            while (low < high) {
                int mid = (low + high) / 2;
                unsigned long long at = inside(&in, mid);
                if (at) {
                    high = mid;
                    at_high = at;
                } else {
                    low = mid + 1;
                }
            }
            k = high;
            d = at_high;
        }
    }
    for (int j = 1; !d && j <= 21; j++) { /* below a power of two (and, defensively, if k17 was not inside) */
        d = inside(&in, j);
        k = j;
    }
    if (!d) return 1;
    char tmp[48], *end = tmp + sizeof tmp - k; /* the k decimals, the point, the whole part ("0" at least) */
    unsigned long long n = last_digits(d, k, tmp + sizeof tmp); /* d: at most 17 digits */
    *--end = '.';
    char *start = zc_digits(n, v < 0, end);
    return bulk(b, start, tmp + sizeof tmp - start);
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
            char *p = zc_digits(negative ? 0ULL - (unsigned long long)whole : (unsigned long long)whole, negative, end);
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
            char *p = zc_digits(v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v, v < 0, end);
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
    Buf b = {NULL, NULL, 0, 0};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), guess = 64;
    for (Py_ssize_t i = 0; i < n; i++) { /* about 24 bytes an argument: keys, scores, members */
        PyObject *command = PySequence_Fast_GET_ITEM(seq, i);
        guess += 16 + 24 * ((PyTuple_Check(command) || PyList_Check(command)) ? PySequence_Fast_GET_SIZE(command) : 0);
    }
    if (grow(&b, guess) < 0) goto fail;
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
    if (_PyBytes_Resize(&b.bytes, b.len) < 0) return NULL;
    return b.bytes;
fail:
    Py_DECREF(seq);
    Py_XDECREF(b.bytes);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_commands", pack_commands, METH_O,
     "pack_commands(commands) -> bytes: each command (a tuple or list of bytes, str, int or float) as RESP, "
     "the bytes hiredis' pack_command makes, all in one bytes object."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_resp, "zcluster._resp", "Redis commands packed into RESP (see the file's header).", methods, (void)0)
