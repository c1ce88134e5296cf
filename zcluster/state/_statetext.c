/* zcluster.state._statetext: a producer state's checkpoint text made in C, for zcluster.state.layout.
 *
 * state_text(state) -> str or None: "<producer hex>:<last_ack>:<begin>:<max_clock, or last_ack when None>"
 * for a 5-tuple (a ProducerState: journal, producer, last_ack, begin, max_clock) whose producer is exact bytes
 * (at most 64) and whose numbers are exact ints in [-2**63, 2**64) (max_clock may be None), as
 * zcluster.state.layout._text spells it; None for any other object, which _text (the reference, and the path
 * without a build) then spells. tests/state/test_statetext.py compares the two.
 *
 * Why: an applier saves every producer state of a journal at each batch, and a journal read by short-lived
 * producers holds thousands. Compiled Python spent about 4,000 instructions on a state's text, most of it
 * turning 60-bit clocks into decimals through Python ints (about 800 each); this spends about 300.
 */
#include "../_native.h"

#define MAX_PRODUCER 64

static const char HEXDIGITS[] = "0123456789abcdef";

/* An exact int in [-2**63, 2**64) (a begin is -1 outside a transaction; a clock may pass 2**63): its sign and
 * magnitude. */
typedef struct {
    int negative;
    unsigned long long magnitude;
} number;

/* x as a number at *v; 0 for anything else (no error left set: the reference spells it). */
static int number_of(PyObject *x, number *v) {
    if (!PyLong_CheckExact(x)) return 0;
    int overflow;
    long long signed_value = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow == 0) {
        if (signed_value == -1 && PyErr_Occurred()) return PyErr_Clear(), 0;
        v->negative = signed_value < 0;
        /* -(v + 1) + 1: the magnitude of -2**63 too, without overflow */
        v->magnitude = v->negative ? (unsigned long long)(-(signed_value + 1)) + 1 : (unsigned long long)signed_value;
        return 1;
    }
    if (overflow < 0) return 0;
    v->negative = 0;
    v->magnitude = PyLong_AsUnsignedLongLong(x);
    if (v->magnitude == (unsigned long long)-1 && PyErr_Occurred()) return PyErr_Clear(), 0;
    return 1;
}

/* v's decimal at out; returns how many characters (at most 21). */
static int decimal(number v, char *out) {
    char tmp[24], *end = tmp + sizeof tmp, *p = zc_digits(v.magnitude, v.negative, end);
    memcpy(out, p, (size_t)(end - p));
    return (int)(end - p);
}

static PyObject *state_text(PyObject *module, PyObject *state) {
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 5) Py_RETURN_NONE;
    PyObject *producer = PyTuple_GET_ITEM(state, 1), *max_clock = PyTuple_GET_ITEM(state, 4);
    number last_ack, begin, top;
    if (!PyBytes_CheckExact(producer) || PyBytes_GET_SIZE(producer) > MAX_PRODUCER) Py_RETURN_NONE;
    if (!number_of(PyTuple_GET_ITEM(state, 2), &last_ack) || !number_of(PyTuple_GET_ITEM(state, 3), &begin))
        Py_RETURN_NONE;
    if (max_clock == Py_None) {
        top = last_ack;
    } else if (!number_of(max_clock, &top)) {
        Py_RETURN_NONE;
    }
    char buf[2 * MAX_PRODUCER + 3 * (1 + 21)];
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(producer);
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < PyBytes_GET_SIZE(producer); i++) {
        buf[n++] = HEXDIGITS[p[i] >> 4];
        buf[n++] = HEXDIGITS[p[i] & 0x0F];
    }
    buf[n++] = ':';
    n += decimal(last_ack, buf + n);
    buf[n++] = ':';
    n += decimal(begin, buf + n);
    buf[n++] = ':';
    n += decimal(top, buf + n);
    PyObject *text = PyUnicode_New(n, 127);
    if (text == NULL) return NULL;
    memcpy(PyUnicode_1BYTE_DATA(text), buf, (size_t)n);
    return text;
}

static PyMethodDef methods[] = {
    {"state_text", state_text, METH_O,
     "state_text(state) -> str or None: a producer state's checkpoint text, None where the reference spells it."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_statetext, "zcluster.state._statetext", "A producer state's checkpoint text made in C (see the file's header).",
          methods, (void)0)
