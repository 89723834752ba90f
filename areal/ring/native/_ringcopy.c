/* areal.ring._ringcopy: the ring writer's whole hot path in one call, and its copy + XXH3-64 digest.

Purpose: at 8k tokens a ring record is ~106 KB and the writer's budget is ~5 us. In Python the
copy (mmap.write per part) and the digest (the xxhash wheel, SSE2 only) are two passes over the
record, and the msgpack framing and the frame words cost as much again in interpreter time;
here one call frames the record, copies it with each 1 KiB block hashed right after it is
copied (while it is still in L1; AVX2 or AVX-512 where the CPU has it), and publishes it.

API (all hold the GIL: a few microseconds; releasing it could cost a 5 ms switch interval):
  Writer(mapping, capacity, max_payload, write_pos, next_seq, seen_commit)
      The ring writer's fast path over a mapped segment (areal.ring.layout's layout: header page,
      then ``capacity`` data bytes). ``put(parts, nbytes)`` appends the concatenation of the
      buffers in ``parts`` as one record; ``put_struct(values, head, tail, bulk_from, bulk_to)``
      appends the msgpack encoding of the tuple ``values`` whose elements [bulk_from, bulk_to)
      are buffers (written as bin, straight from their memory) and the rest are given
      pre-encoded (head, tail). Both return the record's sequence number, or a negative code
      with nothing published (no room, wrong nbytes, too large, corrupted commit_pos): the
      slow paths (waiting, doorbells, errors) stay in Python. ``close()`` releases the mapping.
  copy_digest(dest, offset, parts, digest_from, nbytes) -> int | None
      Copy the concatenation of the buffers in ``parts`` (a list or tuple) to dest[offset:],
      zero-pad it to a multiple of 8 bytes, and return XXH3-64 (seed 0, default secret) of
      dest[digest_from : offset + padded]. Returns None, writing nothing, when the parts do not
      hold exactly ``nbytes`` bytes. ValueError if the range does not fit ``dest``; BufferError
      if a part is not C-contiguous or ``dest`` is not writable. Parts must not overlap dest.
  xxh3_64(buffer, start=0, stop=len) -> int
      XXH3-64 (seed 0, default secret) of buffer[start:stop]; equal to xxhash.xxh3_64_intdigest.
  implementations() -> list[str]     kernels this CPU can run ("scalar", "avx2", "avx512")
  use(name) -> str                    select a kernel (tests, benchmarks; None only reports);
                                      returns the previous one. The best one is chosen at import.
  LAYOUT                              the ring layout constants compiled in (checked at import)

Invariants: the digest is bit-identical to XXH3-64 for every length and every kernel (tests
compare against the xxhash package over many lengths, offsets and alignments); a record put
here is byte-identical to one put by the pure-Python writer, and put_struct's bytes are
msgspec's (tests pin both). Written from the public specification (Cyan4973/xxHash
doc/xxhash_spec.md), not from the reference source. Little-endian x86 hosts (the ring's
publish order relies on x86's store order); a big-endian build fails to compile.
The hash itself lives in areal/ring/native/_xxh3.h (included here, so the compiler still inlines the
block loop of the copy into it).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "_xxh3.h"

/* ---- the payload: a list of byte ranges, copied and hashed as one ---- */

typedef struct {
    const u8 *p;
    size_t n;
} Seg;

/* A read position in the payload's segments, for copies that cross segment boundaries. */
typedef struct {
    const Seg *seg;
    Py_ssize_t count, i;
    size_t at; /* offset in segment i */
} Cursor;

/* Copy the next ``k`` payload bytes to dst (the segments hold at least that many). */
static void cursor_copy(Cursor *c, u8 *dst, size_t k) {
    while (k) {
        size_t avail = c->seg[c->i].n - c->at;
        if (avail == 0) {
            c->i++, c->at = 0;
            continue;
        }
        size_t m = k < avail ? k : avail;
        memcpy(dst, c->seg[c->i].p + c->at, m);
        dst += m, c->at += m, k -= m;
    }
}

/* The next ``k`` payload bytes as one contiguous source (consumed), or NULL if they span
   segments (nothing consumed). */
static const u8 *cursor_span(Cursor *c, size_t k) {
    while (c->i < c->count && c->at == c->seg[c->i].n) c->i++, c->at = 0;
    if (c->i == c->count || c->seg[c->i].n - c->at < k) return NULL;
    const u8 *p = c->seg[c->i].p + c->at;
    c->at += k;
    return p;
}

/* Copy the segments (``nbytes`` in all) to dest[offset:], zero-pad to 8 bytes, and return
   XXH3-64 of dest[digest_from : offset + padded]. The caller has checked that the range fits. */
static u64 copy_hash(u8 *dest, size_t digest_from, size_t offset, const Seg *seg, Py_ssize_t count,
                     size_t nbytes) {
    size_t padded = (nbytes + 7) & ~(size_t)7;
    u8 *base = dest + digest_from; /* digest input: base[0 : n] */
    size_t n = offset + padded - digest_from;
    u8 *out = dest + offset;
    Cursor cur = {seg, count, 0, 0};
    memset(out + nbytes, 0, padded - nbytes); /* the padding lies past the payload */
    if (n <= 240) {
        cursor_copy(&cur, out, nbytes);
        return xxh3(base, n);
    }
    /* Block by block (1 KiB of digest input): a block that lies inside one segment is copied
       and hashed in one pass; any other (frame words, segment boundaries) is copied with memcpy,
       then hashed from the destination while it is in L1. The input's last block is left to
       long_finish, which treats it specially. */
    u64 acc[8] __attribute__((aligned(64)));
    long_init(acc);
    size_t head = offset - digest_from;          /* digest bytes before the payload, in dest */
    size_t blocks = (n - 1) / BLOCK, copied = 0; /* copied: payload bytes written so far */
    for (size_t b = 0; b < blocks; b++) {
        size_t p0 = b * BLOCK, p1 = p0 + BLOCK;
        const u8 *whole = NULL;
        if (kernel->copy_stripes != NULL && p0 >= head && p1 - head <= nbytes)
            whole = cursor_span(&cur, BLOCK); /* copied == p0 - head here */
        if (whole != NULL) {
            kernel->copy_stripes(acc, base + p0, whole, STRIPES_PER_BLOCK, SECRET);
            kernel->scramble(acc, SECRET + SECRET_LEN - STRIPE);
            copied += BLOCK;
            continue;
        }
        size_t upto = p1 > head ? p1 - head : 0;
        if (upto > nbytes) upto = nbytes;
        if (upto > copied) {
            cursor_copy(&cur, out + copied, upto - copied);
            copied = upto;
        }
        long_block(acc, base + p0);
    }
    cursor_copy(&cur, out + copied, nbytes - copied);
    return long_finish(acc, base, n, blocks);
}

/* The segments of one call and the buffer views that keep them alive (bytes need none). */
#define STACK_SEGS 40
typedef struct {
    Seg stack_seg[STACK_SEGS], *seg;
    Py_buffer stack_view[STACK_SEGS], *view;
    Py_ssize_t count, views;
    size_t total;
} Source;

static int source_init(Source *s, Py_ssize_t max_segs) {
    s->seg = s->stack_seg, s->view = s->stack_view, s->count = s->views = 0, s->total = 0;
    if (max_segs <= STACK_SEGS) return 0;
    s->seg = PyMem_Malloc(max_segs * sizeof(Seg));
    s->view = PyMem_Malloc(max_segs * sizeof(Py_buffer));
    if (s->seg == NULL || s->view == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void source_release(Source *s) {
    for (Py_ssize_t i = 0; i < s->views; i++) PyBuffer_Release(&s->view[i]);
    if (s->seg != s->stack_seg) PyMem_Free(s->seg);
    if (s->view != s->stack_view) PyMem_Free(s->view);
}

static void source_raw(Source *s, const u8 *p, size_t n) {
    s->seg[s->count++] = (Seg){p, n};
    s->total += n;
}

/* Append a buffer object (C-contiguous; BufferError/ValueError otherwise); its byte length. */
static Py_ssize_t source_object(Source *s, PyObject *o) {
    if (PyBytes_CheckExact(o)) {
        source_raw(s, (const u8 *)PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o));
        return PyBytes_GET_SIZE(o);
    }
    Py_buffer *v = &s->view[s->views];
    if (PyObject_GetBuffer(o, v, PyBUF_SIMPLE) < 0) return -1;
    s->views++;
    source_raw(s, v->buf, (size_t)v->len);
    return v->len;
}

/* Append every buffer of a list or tuple. */
static int source_parts(Source *s, PyObject *parts) {
    PyObject *seq = PySequence_Fast(parts, "parts must be a list or tuple of buffers");
    if (seq == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int rc = source_init(s, count);
    for (Py_ssize_t i = 0; rc == 0 && i < count; i++)
        if (source_object(s, items[i]) < 0) rc = -1;
    Py_DECREF(seq); /* the list or tuple holds the parts; the caller holds it */
    return rc;
}

/* ---- Python bindings ---- */

static int get_index(PyObject *o, Py_ssize_t *out, const char *what) {
    Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s=%zd must be >= 0", what, v);
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *py_xxh3_64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "xxh3_64(buffer, start=0, stop=len)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t start = 0, stop = view.len;
    if ((nargs > 1 && get_index(args[1], &start, "start") < 0) ||
        (nargs > 2 && get_index(args[2], &stop, "stop") < 0)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start > stop || stop > view.len) {
        PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside a buffer of %zd bytes", start, stop, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    u64 h = xxh3((const u8 *)view.buf + start, (size_t)(stop - start));
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *py_copy_digest(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "copy_digest(dest, offset, parts, digest_from, nbytes)");
        return NULL;
    }
    Py_ssize_t offset, digest_from, nbytes;
    if (get_index(args[1], &offset, "offset") < 0 || get_index(args[3], &digest_from, "digest_from") < 0 ||
        get_index(args[4], &nbytes, "nbytes") < 0)
        return NULL;
    Source s;
    Py_buffer dest = {0};
    PyObject *result = NULL;
    if (source_parts(&s, args[2]) < 0) goto done; /* every part acquired before any byte is written */
    if (s.total != (size_t)nbytes) { /* the caller's byte count is wrong: write nothing */
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyObject_GetBuffer(args[0], &dest, PyBUF_WRITABLE) < 0) goto done;
    Py_ssize_t padded = (nbytes + 7) & ~(Py_ssize_t)7;
    if (digest_from > offset || offset > dest.len || padded > dest.len - offset) {
        PyErr_Format(PyExc_ValueError, "record [%zd, %zd) (digest from %zd) outside a buffer of %zd bytes",
                     offset, offset + padded, digest_from, dest.len);
        goto done;
    }
    u64 h = copy_hash(dest.buf, (size_t)digest_from, (size_t)offset, s.seg, s.count, (size_t)nbytes);
    result = PyLong_FromUnsignedLongLong(h);
done:
    if (dest.obj != NULL) PyBuffer_Release(&dest);
    source_release(&s);
    return result;
}

/* ---- the ring writer's hot path (areal.ring.buffer.RingWriter; layout: areal.ring.layout) ---- */

/* Layout constants, checked against areal.ring.layout at import (a mismatch disables the
   extension rather than corrupting a ring). */
#define LAYOUT_VERSION 4
#define HEADER_BYTES 4096
#define OFF_WRITE_POS 64
#define OFF_NEXT_SEQ 128
#define OFF_LAST_START 192
#define OFF_COMMIT_POS 320
#define FRAME_BYTES 24
#define KIND_RECORD 0x32434552ULL /* "REC2" little-endian */
#define KIND_WRAP 0x50415257ULL   /* "WRAP" */
/* put() results other than a sequence number; nothing was written (bar last_start: -1 never
   moves it either). */
#define PUT_NO_ROOM (-1)
#define PUT_WRONG_NBYTES (-2)
#define PUT_TOO_LARGE (-3)
#define PUT_CORRUPTED (-4)

typedef struct {
    PyObject_HEAD
    Py_buffer map; /* the whole segment, header page first; map.obj is NULL once closed */
    u8 *base;
    unsigned long long capacity, max_payload;
    /* The writer's private positions (the shared words mirror them after every put) and its
       cache of the reader's commit_pos, re-read only when the cached value shows no room. */
    unsigned long long write_pos, next_seq, seen_commit;
    unsigned long long pending_nbytes; /* payload bytes of the last put that returned < 0 */
} Writer;

static inline u64 *word(const Writer *w, size_t off) { return (u64 *)(w->base + off); }
static inline void wr64(u8 *p, u64 v) { memcpy(p, &v, 8); }

static int writer_init(Writer *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"mapping", "capacity", "max_payload", "write_pos", "next_seq", "seen_commit", NULL};
    PyObject *mapping;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKKKKK", kw, &mapping, &self->capacity, &self->max_payload,
                                     &self->write_pos, &self->next_seq, &self->seen_commit))
        return -1;
    if (self->map.obj != NULL) PyBuffer_Release(&self->map);
    if (PyObject_GetBuffer(mapping, &self->map, PyBUF_WRITABLE) < 0) return -1;
    self->base = self->map.buf;
    if ((size_t)self->map.len != HEADER_BYTES + self->capacity || self->capacity % 8 || (uintptr_t)self->base % 8 ||
        self->max_payload + FRAME_BYTES > self->capacity / 2 || self->write_pos % 8) {
        PyErr_Format(PyExc_ValueError, "Writer: a %zd-byte mapping does not hold a ring of capacity %llu "
                     "(max_payload %llu, write_pos %llu)", self->map.len, self->capacity, self->max_payload,
                     self->write_pos);
        PyBuffer_Release(&self->map);
        return -1;
    }
    return 0;
}

/* Append one record holding the source's bytes: the whole of RingWriter.put's fast path.

   Store order (the record state machine of areal.ring.buffer): last_start, [wrap marker], frame
   words 1-2, payload + padding, digest, then write_pos (the publish), then next_seq. The
   stores to the mapping are ordinary x86 stores (the copy kernels use no non-temporal stores,
   which would need an sfence), and x86 (TSO) makes ordinary stores visible to other cores in
   program order; what must be kept is the program order itself, against the compiler:
     - the compiler barrier after last_start keeps every later store of the record after it, so
       a writer killed mid-record has always moved last_start first (attach() relies on it);
     - the release store of write_pos keeps every store of the record before it, so the reader,
       which loads write_pos and then the record, never sees a position before its bytes;
     - the acquire load of commit_pos keeps the overwrite of freed space after the load that
       showed it free (x86 never moves a store above an earlier load; this stops the compiler).
   Returns a sequence number, or a PUT_* code with nothing published. */
static PyObject *writer_publish(Writer *w, const Source *s) {
    u64 n = s->total, cap = w->capacity;
    if (n > w->max_payload) {
        w->pending_nbytes = n;
        return PyLong_FromLong(PUT_TOO_LARGE);
    }
    u64 size = FRAME_BYTES + ((n + 7) & ~7ULL), pos = w->write_pos;
    u64 room = cap - pos % cap, skip = room < size ? room : 0, end = pos + skip + size;
    /* commit_pos only grows: a cached value that shows room is still true */
    if (end - w->seen_commit > cap) {
        w->seen_commit = __atomic_load_n(word(w, OFF_COMMIT_POS), __ATOMIC_ACQUIRE);
        if (w->seen_commit > pos || w->seen_commit % 8) {
            w->pending_nbytes = n;
            return PyLong_FromLong(PUT_CORRUPTED);
        }
        if (end - w->seen_commit > cap) {
            w->pending_nbytes = n;
            return PyLong_FromLong(PUT_NO_ROOM);
        }
    }
    u64 seq = w->next_seq;
    __atomic_store_n(word(w, OFF_LAST_START), pos + skip, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* compiler barrier: last_start before the record */
    u8 *data = w->base + HEADER_BYTES;
    if (skip >= FRAME_BYTES) { /* an explicit wrap marker; the reader reads only its kind word */
        u8 *f = data + pos % cap;
        wr64(f + 8, KIND_WRAP);
        wr64(f + 16, seq);
        wr64(f, 0);
    }
    pos += skip;
    size_t start = HEADER_BYTES + pos % cap; /* the frame, in the mapping */
    u8 *frame = w->base + start;
    wr64(frame + 8, KIND_RECORD | n << 32);
    wr64(frame + 16, seq);
    wr64(frame, copy_hash(w->base, start + 8, start + FRAME_BYTES, s->seg, s->count, n));
    w->write_pos = pos + size;
    __atomic_store_n(word(w, OFF_WRITE_POS), w->write_pos, __ATOMIC_RELEASE); /* publish */
    w->next_seq = seq + 1;
    __atomic_store_n(word(w, OFF_NEXT_SEQ), seq + 1, __ATOMIC_RELAXED);
    return PyLong_FromUnsignedLongLong(seq);
}

static int writer_open(Writer *w) {
    if (w->map.obj != NULL) return 0;
    PyErr_SetString(PyExc_ValueError, "Writer is closed");
    return -1;
}

static PyObject *writer_put(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put(parts, nbytes)");
        return NULL;
    }
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[1]);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    if (writer_open(self) < 0) return NULL;
    Source s;
    PyObject *result = NULL;
    if (source_parts(&s, args[0]) == 0) {
        if (nbytes >= 0 && s.total != (size_t)nbytes) { /* the caller's total is wrong: write nothing */
            self->pending_nbytes = s.total;
            result = PyLong_FromLong(PUT_WRONG_NBYTES);
        } else {
            result = writer_publish(self, &s);
        }
    }
    source_release(&s);
    return result;
}

/* msgpack headers, as msgspec writes them (the smallest form). */
static size_t msgpack_array_header(u8 *out, size_t count) {
    if (count < 16) return out[0] = (u8)(0x90 | count), 1;
    if (count < 65536) return out[0] = 0xdc, out[1] = (u8)(count >> 8), out[2] = (u8)count, 3;
    out[0] = 0xdd;
    for (int i = 0; i < 4; i++) out[1 + i] = (u8)(count >> (24 - 8 * i));
    return 5;
}

static size_t msgpack_bin_header(u8 *out, size_t n) {
    if (n < 256) return out[0] = 0xc4, out[1] = (u8)n, 2;
    if (n < 65536) return out[0] = 0xc5, out[1] = (u8)(n >> 8), out[2] = (u8)n, 3;
    out[0] = 0xc6;
    for (int i = 0; i < 4; i++) out[1 + i] = (u8)(n >> (24 - 8 * i));
    return 5;
}

#define MAX_BULK 16

/* put_struct(values, head, tail, bulk_from, bulk_to): the record is the msgpack array of
   ``values`` (a tuple), given as head = encoding of values[:bulk_from] (a fixarray),
   values[bulk_from:bulk_to] (buffers, written as bin), tail = encoding of values[bulk_to:]. */
static PyObject *writer_put_struct(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "put_struct(values, head, tail, bulk_from, bulk_to)");
        return NULL;
    }
    PyObject *values = args[0], *head = args[1], *tail = args[2];
    Py_ssize_t from = PyLong_AsSsize_t(args[3]), to = PyLong_AsSsize_t(args[4]);
    if ((from == -1 || to == -1) && PyErr_Occurred()) return NULL;
    if (!PyTuple_CheckExact(values) || !PyBytes_CheckExact(head) || !PyBytes_CheckExact(tail)) {
        PyErr_SetString(PyExc_TypeError, "put_struct: values must be a tuple, head and tail bytes");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(values);
    const u8 *h = (const u8 *)PyBytes_AS_STRING(head), *t = (const u8 *)PyBytes_AS_STRING(tail);
    if (from < 0 || from > to || to > count || to - from > MAX_BULK || from >= 16 || count - to >= 16 ||
        PyBytes_GET_SIZE(head) < 1 || h[0] != (0x90 | from) || PyBytes_GET_SIZE(tail) < 1 ||
        t[0] != (0x90 | (count - to))) {
        PyErr_Format(PyExc_ValueError, "put_struct: head/tail are not fixarrays of %zd and %zd elements "
                     "(bulk %zd:%zd of %zd, at most %d)", from, count - to, from, to, count, MAX_BULK);
        return NULL;
    }
    if (writer_open(self) < 0) return NULL;
    u8 scratch[5 + 5 * MAX_BULK], *at = scratch; /* the array header and the bin headers */
    Source s;
    PyObject *result = NULL;
    source_init(&s, 0); /* at most 3 + 2 * MAX_BULK segments: on the stack */
    size_t k = msgpack_array_header(at, (size_t)count);
    source_raw(&s, at, k), at += k;
    source_raw(&s, h + 1, (size_t)PyBytes_GET_SIZE(head) - 1);
    for (Py_ssize_t i = from; i < to; i++) {
        Seg *bin = &s.seg[s.count];
        source_raw(&s, at, 0); /* its header, filled in once the size is known */
        Py_ssize_t m = source_object(&s, PyTuple_GET_ITEM(values, i));
        if (m < 0) goto done;
        if ((u64)m > 0xFFFFFFFFULL) {
            PyErr_Format(PyExc_ValueError, "put_struct: a %zd-byte buffer exceeds msgpack's bin 32", m);
            goto done;
        }
        bin->n = msgpack_bin_header(at, (size_t)m), s.total += bin->n, at += bin->n;
    }
    source_raw(&s, t + 1, (size_t)PyBytes_GET_SIZE(tail) - 1);
    result = writer_publish(self, &s);
done:
    source_release(&s);
    return result;
}

static PyObject *writer_close(Writer *self, PyObject *unused) {
    if (self->map.obj != NULL) PyBuffer_Release(&self->map);
    self->base = NULL;
    Py_RETURN_NONE;
}

static void writer_dealloc(Writer *self) {
    if (self->map.obj != NULL) PyBuffer_Release(&self->map);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef writer_methods[] = {
    {"put", (PyCFunction)(void (*)(void))writer_put, METH_FASTCALL,
     "put(parts, nbytes) -> int: append the concatenation of parts (a list or tuple of buffers; "
     "nbytes: their total, or -1 to measure) as one record; its sequence number, or -1 no room, "
     "-2 wrong nbytes, -3 too large, -4 commit_pos corrupted (nothing published; pending_nbytes)."},
    {"put_struct", (PyCFunction)(void (*)(void))writer_put_struct, METH_FASTCALL,
     "put_struct(values, head, tail, bulk_from, bulk_to) -> int: append msgpack of the tuple values "
     "as one record, from head = encoding of values[:bulk_from], the buffers values[bulk_from:bulk_to] "
     "and tail = encoding of values[bulk_to:]; results as put()."},
    {"close", (PyCFunction)writer_close, METH_NOARGS, "Release the mapping (idempotent)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef writer_members[] = {
    {"write_pos", T_ULONGLONG, offsetof(Writer, write_pos), READONLY, "end of the last published record"},
    {"next_seq", T_ULONGLONG, offsetof(Writer, next_seq), READONLY, "sequence number of the next record"},
    {"seen_commit", T_ULONGLONG, offsetof(Writer, seen_commit), READONLY, "cached commit_pos"},
    {"pending_nbytes", T_ULONGLONG, offsetof(Writer, pending_nbytes), READONLY,
     "payload bytes of the last put that published nothing"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "areal.ring._ringcopy.Writer",
    .tp_doc = "Writer(mapping, capacity, max_payload, write_pos, next_seq, seen_commit): the ring "
              "writer's fast path over a mapped segment (header page + data).",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
    .tp_members = writer_members,
};

static PyObject *py_implementations(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (size_t k = 0; k < N_KERNELS; k++) {
        if (!kernel_supported(k)) continue;
        PyObject *name = PyUnicode_FromString(KERNELS[k].name);
        if (name == NULL || PyList_Append(out, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(name);
    }
    return out;
}

static PyObject *py_use(PyObject *self, PyObject *arg) {
    const char *previous = kernel->name;
    if (arg != Py_None) {
        const char *want = PyUnicode_AsUTF8(arg);
        if (want == NULL) return NULL;
        size_t k = 0;
        while (k < N_KERNELS && strcmp(KERNELS[k].name, want) != 0) k++;
        if (k == N_KERNELS || !kernel_supported(k)) {
            PyErr_Format(PyExc_ValueError, "kernel %R is not available on this CPU", arg);
            return NULL;
        }
        kernel = &KERNELS[k];
    }
    return PyUnicode_FromString(previous);
}

static PyMethodDef methods[] = {
    {"copy_digest", (PyCFunction)(void (*)(void))py_copy_digest, METH_FASTCALL,
     "copy_digest(dest, offset, parts, digest_from, nbytes) -> int | None: copy parts to dest[offset:], "
     "zero-pad to 8, return XXH3-64 of dest[digest_from:end]; None (nothing written) if the parts "
     "do not hold nbytes bytes."},
    {"xxh3_64", (PyCFunction)(void (*)(void))py_xxh3_64, METH_FASTCALL,
     "xxh3_64(buffer, start=0, stop=len) -> int: XXH3-64 (seed 0) of buffer[start:stop]."},
    {"implementations", py_implementations, METH_NOARGS, "Kernels this CPU can run."},
    {"use", py_use, METH_O, "use(name or None) -> previous kernel name; None only reports."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_ringcopy", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ringcopy(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
#endif
    /* avx2 where the CPU has it: on Zen 4 the avx512 kernel is no faster at hashing and slower
       at copying (a record's 64-byte stores start 8 bytes into a line, so every one splits). */
    for (size_t k = 0; k < N_KERNELS; k++)
        if (kernel_supported(k) && strcmp(KERNELS[k].name, "avx512") != 0) kernel = &KERNELS[k];
    if (PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *layout = Py_BuildValue(
        "{sisisisisisisisKsK}", "version", LAYOUT_VERSION, "header_bytes", HEADER_BYTES, "off_write_pos",
        OFF_WRITE_POS, "off_next_seq", OFF_NEXT_SEQ, "off_last_start", OFF_LAST_START, "off_commit_pos",
        OFF_COMMIT_POS, "frame_bytes", FRAME_BYTES, "kind_record", KIND_RECORD, "kind_wrap", KIND_WRAP);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT", layout) < 0 ||
        PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
