/* zcluster/_native.h: what every C module of the compiled build (zcluster._native.EXTENSIONS) shares: its
 * module definition, and decimal digits two at a time. Each includes this file first; zcluster._native's digest of a C module covers this file
 * too, so an edit here makes a build of any of them stale. */
#ifndef ZCLUSTER_NATIVE_H
#define ZCLUSTER_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Multi-phase init and no module state: safe in subinterpreters with a GIL of their own. */
static PyModuleDef_Slot zc_slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

/* The module NAME (dotted), documented by DOC, with METHODS: PyInit_<LEAF> runs SETUP (a statement), then
 * returns its definition. */
#define ZC_MODULE(LEAF, NAME, DOC, METHODS, SETUP)                                                        \
    static struct PyModuleDef zc_module = {PyModuleDef_HEAD_INIT, NAME, DOC, 0, METHODS, zc_slots, NULL, NULL, NULL}; \
    PyMODINIT_FUNC PyInit_##LEAF(void) {                                                                   \
        SETUP;                                                                                             \
        return PyModuleDef_Init(&zc_module);                                                               \
    }

/* "00" .. "99": two digits per division (a digit loop's divisions are most of a number's cost). */
__attribute__((unused)) static const char ZC_PAIRS[201] =
    "0001020304050607080910111213141516171819202122232425262728293031323334353637383940414243444546474849"
    "5051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/* The decimal digits of v (with a '-' before them when negative) in the bytes just before end (at most 21);
 * returns where they start. */
static inline char *zc_digits(unsigned long long v, int negative, char *end) {
    char *p = end;
    while (v >= 100) {
        p -= 2;
        memcpy(p, ZC_PAIRS + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, ZC_PAIRS + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    if (negative) *--p = '-';
    return p;
}

#endif
