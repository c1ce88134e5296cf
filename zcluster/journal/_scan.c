/* zcluster.journal._scan: the open fragment's records scanned in C, for zcluster.journal._filefmt.
 *
 * scan_payloads(buf, collect) -> (records, used, payloads): exactly what _filefmt's pure scan_payloads gives
 * (its docstring is the contract; tests/journal/test_scan.py compares the two on random and damaged
 * buffers): the whole, CRC-valid records at the start of buf (bytes or any contiguous buffer), one after
 * another, each an 8-byte header (payload length, CRC-32 of the payload; both big-endian) then the payload;
 * it stops at the first record that is incomplete, empty or fails its CRC. payloads: their payloads end to
 * end, or None unless collect: as bytes, where the pure scan gives a bytearray (equal; the readers hand bytes
 * on, and bytes() of bytes is no copy). The pure loop costs a struct unpack, a slice, a zlib call and
 * a bytearray append per record (about 4,600 instructions per message of a typical journal); this one
 * makes no Python object per record and computes the CRC (the IEEE polynomial, as zlib.crc32) with the GIL
 * released: on an x86-64 CPU with carry-less multiplication (PCLMULQDQ, 2010 on), 64 bytes at a time by
 * folding (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel,
 * 2009), about 0.3 instructions a byte; elsewhere, and for a record's last bytes, eight bytes at a time by
 * table (about 3 a byte, zlib's own 3.9). tests/journal/test_scan.py checks both against zlib.crc32.
 *
 * split_lines(buf) -> list[bytes]: bytes(buf).split(b"\n"), exactly (the pieces between newlines, the one
 * after the last newline included, empty or not), for frames.py's runs of ndjson lines. bytes.split looks
 * at one byte at a time, and its caller copied the buffer first; this finds each newline with memchr and
 * copies each line once, into its own bytes object.
 */
#include "../_native.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
static int clmul; /* the CPU multiplies carry-less (set at import) */
#endif

static uint32_t table[8][256]; /* table[k][b]: the CRC of byte b followed by k zero bytes ("slicing by 8") */

static void init_table(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    /* ZCLUSTER_CRC_TABLE=1: the table path everywhere (the tests compare both paths) */
    const char *forced = getenv("ZCLUSTER_CRC_TABLE");
    clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1") && !(forced && *forced == '1');
#endif
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int i = 0; i < 8; i++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        table[0][b] = c;
    }
    for (int k = 1; k < 8; k++) {
        for (int b = 0; b < 256; b++) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xFF];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* a, folded forward by the distance k's constants stand for, into b (the paper's "fold" step) */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i fold(__m128i a, __m128i k, __m128i b) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), b);
}

/* The running (inverted) CRC c carried over n >= 64 bytes, n a multiple of 16. The constants are the
 * paper's for the bit-reflected IEEE polynomial: x^(4*128+32) and x^(4*128-32) mod P (four blocks ahead),
 * x^(128+32) and x^(128-32) mod P (one block), x^64 mod P, then P itself and floor(x^64 / P) for the final
 * Barrett reduction, each bit-reflected and shifted left once. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_folded(uint32_t c, const unsigned char *p, Py_ssize_t n) {
    const __m128i four = _mm_set_epi64x(0x1c6e41596, 0x154442bd4), one = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124), barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i low32 = _mm_setr_epi32(-1, 0, 0, 0);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16)), x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x1 = fold(x1, four, _mm_loadu_si128((const __m128i *)p));
        x2 = fold(x2, four, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = fold(x3, four, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = fold(x4, four, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = fold(fold(fold(x1, one, x2), one, x3), one, x4);
    for (; n >= 16; p += 16, n -= 16) x1 = fold(x1, one, _mm_loadu_si128((const __m128i *)p));
    /* 128 bits to 96, to 64, then Barrett-reduced to the 32-bit remainder */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, one, 0x10));
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00));
    __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), barrett, 0x10), low32);
    x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(t, barrett, 0x00));
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static uint32_t crc32(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
#if defined(__x86_64__) && defined(__GNUC__)
    if (clmul && n >= 64) {
        Py_ssize_t whole = n & ~(Py_ssize_t)15;
        c = crc32_folded(c, p, whole);
        p += whole;
        n -= whole;
    }
#endif
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
            table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return c ^ 0xFFFFFFFFu;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static PyObject *scan_payloads(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "scan_payloads(buf, collect) takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    int collect = PyObject_IsTrue(args[1]);
    if (collect < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t n = view.len, pos = 0, records = 0, kept = 0;
    PyObject *out = NULL;
    char *into = NULL;
    if (collect) { /* at most n - 8 payload bytes; shrunk to what was found below */
        out = PyBytes_FromStringAndSize(NULL, n > 8 ? n - 8 : 0);
        if (out == NULL) goto fail;
        into = PyBytes_AS_STRING(out);
    }
    Py_BEGIN_ALLOW_THREADS
    while (pos <= n - 8) {
        Py_ssize_t size = (Py_ssize_t)be32(data + pos), start = pos + 8, end = start + size;
        if (end > n || size == 0 || crc32(data + start, size) != be32(data + pos + 4)) break;
        if (into != NULL) {
            memcpy(into + kept, data + start, (size_t)size);
            kept += size;
        }
        records++;
        pos = end;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (out == NULL) return Py_BuildValue("nnO", records, pos, Py_None);
    if (_PyBytes_Resize(&out, kept) < 0) return NULL; /* frees out on failure */
    return Py_BuildValue("nnN", records, pos, out);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *split_lines(PyObject *module, PyObject *buf) {
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *data = view.buf, *at = data, *end = data + view.len;
    PyObject *out = PyList_New(0);
    if (out == NULL) goto fail;
    for (;;) {
        const char *nl = at < end ? memchr(at, '\n', (size_t)(end - at)) : NULL;
        PyObject *line = PyBytes_FromStringAndSize(at, (nl == NULL ? end : nl) - at);
        if (line == NULL) goto fail;
        int appended = PyList_Append(out, line);
        Py_DECREF(line);
        if (appended < 0) goto fail;
        if (nl == NULL) break;
        at = nl + 1;
    }
    PyBuffer_Release(&view);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split_lines", split_lines, METH_O, "split_lines(buf) -> list[bytes]: bytes(buf).split(b'\\n'), exactly."},
    {"scan_payloads", (PyCFunction)(void (*)(void))scan_payloads, METH_FASTCALL,
     "scan_payloads(buf, collect) -> (records, used, payloads or None): the whole, CRC-valid records at the "
     "start of buf, as zcluster.journal._filefmt.scan_payloads finds them."},
    {NULL, NULL, 0, NULL},
};

ZC_MODULE(_scan, "zcluster.journal._scan", "An open fragment's records scanned in C (see the file's header).", methods, init_table())
