/* zcluster/_native.h: what every C module of the compiled build (zcluster._native.EXTENSIONS) shares, its
 * module definition. Each includes this file first; zcluster._native's digest of a C module covers this file
 * too, so an edit here makes a build of any of them stale. */
#ifndef ZCLUSTER_NATIVE_H
#define ZCLUSTER_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

#endif
