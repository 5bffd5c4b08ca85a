/* journal: the memory-mapped ring of records; see journal.h. */
#include "store/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

#define MAGIC 0x6c6e724a67674dULL /* "MggJrnl" */
/* 2: records summed a word at a time (sum_words); 1: byte by byte (FNV-1a), still read from a
 * ring a kill left with records in it, and written on until it is drained */
#define VERSION 2u
#define VERSION_FNV 1u
#define HEADER 4096u
#define PAGE 4096u
#define WRAP 0xffffffffu /* at a record's place: the rest of the ring is unused, go to 0 */

typedef struct {
    uint64_t magic;
    uint32_t version, pad;
    uint64_t capacity;
    _Atomic uint64_t head; /* the producer's: moved after the record is written (release) */
    _Atomic uint64_t tail; /* the consumer's: moved after the records are durable elsewhere */
} header_t;

struct mg_journal_s {
    header_t *h;
    unsigned char *ring;
    size_t cap, map_len;
    uint32_t version; /* the ring's: which checksum its records carry */
};

static uint32_t sum_bytes(const unsigned char *p, size_t n)
{
    uint32_t x = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) x = (x ^ p[i]) * 16777619u;
    return x;
}

/* Eight bytes per step (the byte loop cost a few thousand instructions per usage event on
 * each side); the length is mixed in, so a record cut short of zeros does not match. */
static uint32_t sum_words(const unsigned char *p, size_t n)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        x = (x ^ w) * 0xff51afd7ed558ccdull;
        x ^= x >> 32;
    }
    if (n) {
        w = 0;
        memcpy(&w, p, n);
        x = (x ^ w) * 0xff51afd7ed558ccdull;
    }
    x ^= x >> 29;
    return (uint32_t)(x ^ (x >> 32));
}

static uint32_t checksum(const mg_journal_t *j, const unsigned char *p, size_t n)
{
    return j->version == VERSION_FNV ? sum_bytes(p, n) : sum_words(p, n);
}

static int known_version(uint32_t v)
{
    return v == VERSION || v == VERSION_FNV;
}

/* Every page resident before the loop appends: locked when allowed, touched anyway. */
static void prefault(unsigned char *p, size_t n)
{
    if (mlock(p, n) != 0 && errno != EPERM && errno != ENOMEM && errno != EAGAIN)
        mg_log_msg(MG_LOG_WARN, NULL, "journal: mlock: %s", strerror(errno));
    for (size_t i = 0; i < n; i += PAGE) {
        volatile unsigned char *b = p + i;
        *b = *b;
    }
}

static int fail(char *err, size_t errlen, const char *path, const char *what, int fd)
{
    snprintf(err, errlen, "%s: %s: %s", path, what, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
}

/* An existing ring of another size is made anew at the size asked for when nothing is in it;
 * with records in it, it keeps its size until a start finds it drained. */
static int resizable(int fd, const struct stat *st, size_t bytes)
{
    header_t h;
    if ((size_t)st->st_size == HEADER + bytes) return 0;
    if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) return 0;
    if (h.magic == MAGIC && known_version(h.version) && h.head != h.tail) {
        mg_log_msg(MG_LOG_INFO, NULL,
                   "journal: %zu bytes asked, %zu kept until the records in it are drained", bytes,
                   (size_t)st->st_size - HEADER);
        return 0;
    }
    return ftruncate(fd, 0) == 0;
}

int mg_journal_open(const char *path, size_t bytes, mg_journal_t **out, char *err, size_t errlen)
{
    *out = NULL;
    bytes = (bytes + PAGE - 1) / PAGE * PAGE;
    if (bytes < 4 * PAGE) bytes = 4 * PAGE;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return fail(err, errlen, path, "open", -1);
    struct stat st;
    if (fstat(fd, &st) != 0) return fail(err, errlen, path, "stat", fd);
    int fresh = st.st_size < (off_t)(HEADER + 4 * PAGE) || resizable(fd, &st, bytes);
    size_t len = fresh ? HEADER + bytes : (size_t)st.st_size;
    /* the blocks exist before they are mapped: a full disk cannot fault a store later */
    if (fresh && (errno = posix_fallocate(fd, 0, (off_t)len)) != 0)
        return fail(err, errlen, path, "allocate", fd);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return fail(err, errlen, path, "mmap", fd);
    close(fd); /* the mapping keeps the file */
    mg_journal_t *j = calloc(1, sizeof(*j));
    if (!j) {
        munmap(m, len);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    j->h = m;
    j->ring = (unsigned char *)m + HEADER;
    j->map_len = len;
    j->cap = len - HEADER;
    header_t *h = j->h;
    uint64_t head = atomic_load(&h->head), tail = atomic_load(&h->tail);
    if (fresh || h->magic != MAGIC || !known_version(h->version) || h->capacity != j->cap ||
        tail > head || head - tail > j->cap || tail % 8) {
        if (!fresh)
            mg_log_msg(MG_LOG_ERROR, NULL, "journal: %s: not a journal of this version; reset",
                       path);
        memset(h, 0, sizeof(*h));
        h->magic = MAGIC;
        h->version = VERSION;
        h->capacity = j->cap;
    }
    if (h->version != VERSION && head == tail) h->version = VERSION; /* drained: the new sum */
    j->version = h->version;
    prefault(m, len);
    *out = j;
    return 0;
}

void mg_journal_close(mg_journal_t *j)
{
    if (!j) return;
    munmap(j->h, j->map_len);
    free(j);
}

size_t mg_journal_used(const mg_journal_t *j)
{
    header_t *h = j->h;
    return (size_t)(atomic_load_explicit(&h->head, memory_order_acquire) -
                    atomic_load_explicit(&h->tail, memory_order_acquire));
}

size_t mg_journal_capacity(const mg_journal_t *j)
{
    return j->cap;
}

/* The payload's size; each text's length goes to len[] (measured once: serialize uses it). */
static size_t payload_size(int n, const mg_store_val_t *v, uint32_t *len)
{
    size_t size = 4;
    for (int i = 0; i < n; i++) {
        size += 1;
        if (v[i].kind == MG_STORE_INT) size += 8;
        else if (v[i].kind == MG_STORE_TEXT && v[i].s) {
            len[i] = (uint32_t)strlen(v[i].s);
            size += 4 + len[i];
        }
    }
    return size;
}

static void put(unsigned char **p, const void *src, size_t n)
{
    memcpy(*p, src, n);
    *p += n;
}

static void serialize(unsigned char *p, int n, const mg_store_val_t *v, const uint32_t *len)
{
    uint32_t un = (uint32_t)n;
    put(&p, &un, 4);
    for (int i = 0; i < n; i++) {
        unsigned char kind = (unsigned char)v[i].kind;
        if (kind == MG_STORE_TEXT && !v[i].s) kind = MG_STORE_NULL;
        put(&p, &kind, 1);
        if (kind == MG_STORE_INT) put(&p, &v[i].i, 8);
        if (kind != MG_STORE_TEXT) continue;
        put(&p, &len[i], 4);
        put(&p, v[i].s, len[i]);
    }
}

int mg_journal_append(mg_journal_t *j, int n, const mg_store_val_t *v)
{
    if (n < 0 || n > MG_JOURNAL_VALS_MAX) return -1;
    for (int i = 0; i < n; i++)
        if (v[i].kind == MG_STORE_REAL) return -1;
    header_t *h = j->h;
    uint32_t lens[MG_JOURNAL_VALS_MAX];
    size_t payload = payload_size(n, v, lens), rec = (8 + payload + 7) / 8 * 8;
    if (rec > j->cap / 4) return -1;
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
    size_t off = (size_t)(head % j->cap), skip = j->cap - off < rec ? j->cap - off : 0;
    if (head + skip + rec - tail > j->cap) return -1; /* full */
    if (skip) {
        uint32_t wrap = WRAP;
        memcpy(j->ring + off, &wrap, 4);
        off = 0;
    }
    unsigned char *r = j->ring + off;
    serialize(r + 8, n, v, lens);
    uint32_t len = (uint32_t)payload, sum = checksum(j, r + 8, payload);
    memcpy(r, &len, 4);
    memcpy(r + 4, &sum, 4);
    /* the record exists from here on */
    atomic_store_explicit(&h->head, head + skip + rec, memory_order_release);
    return 0;
}

static int get(const unsigned char **p, const unsigned char *end, void *dst, size_t n)
{
    if ((size_t)(end - *p) < n) return -1;
    memcpy(dst, *p, n);
    *p += n;
    return 0;
}

/* The values of one payload; text points into a copy (`buf`, NUL-terminated each). */
static int parse(const unsigned char *p, size_t len, mg_store_val_t *v, char *buf)
{
    const unsigned char *end = p + len;
    uint32_t n;
    if (get(&p, end, &n, 4) != 0 || n > MG_JOURNAL_VALS_MAX) return -1;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char kind;
        if (get(&p, end, &kind, 1) != 0) return -1;
        v[i] = (mg_store_val_t){kind, 0, NULL, 0};
        if (kind == MG_STORE_INT) {
            if (get(&p, end, &v[i].i, 8) != 0) return -1;
        } else if (kind == MG_STORE_TEXT) {
            uint32_t l;
            if (get(&p, end, &l, 4) != 0 || get(&p, end, buf, l) != 0) return -1;
            buf[l] = 0;
            v[i].s = buf;
            buf += l + 1;
        } else if (kind != MG_STORE_NULL) {
            return -1;
        }
    }
    return p == end ? (int)n : -1;
}

uint64_t mg_journal_read(mg_journal_t *j, int max, mg_journal_each_fn each, void *ud)
{
    header_t *h = j->h;
    uint64_t pos = atomic_load_explicit(&h->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    mg_store_val_t v[MG_JOURNAL_VALS_MAX];
    char *buf = NULL;
    for (int done = 0; pos < head && done < max;) {
        size_t off = (size_t)(pos % j->cap);
        uint32_t len, sum;
        memcpy(&len, j->ring + off, 4);
        if (len == WRAP) {
            pos += j->cap - off;
            continue;
        }
        memcpy(&sum, j->ring + off + 4, 4);
        if (!buf) buf = malloc(j->cap / 4 + MG_JOURNAL_VALS_MAX);
        int n = -1;
        if (buf && len <= j->cap - off - 8 && checksum(j, j->ring + off + 8, len) == sum)
            n = parse(j->ring + off + 8, len, v, buf);
        if (n < 0) { /* not a record: nothing after it can be trusted either */
            mg_log_msg(MG_LOG_ERROR, NULL, "journal: a damaged record; %llu bytes skipped",
                       (unsigned long long)(head - pos));
            pos = head;
            break;
        }
        each(ud, n, v);
        pos += (8 + len + 7) / 8 * 8;
        done++;
    }
    free(buf);
    return pos;
}

void mg_journal_release(mg_journal_t *j, uint64_t pos)
{
    atomic_store_explicit(&j->h->tail, pos, memory_order_release);
}

/* ---- a consistent copy of a journal in use (store/upkeep's backups) ---- */

static int read_all(int fd, unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static uint64_t tail_now(int fd)
{
    header_t h;
    if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) return UINT64_MAX;
    return h.tail;
}

static int write_copy(const char *dest, const unsigned char *buf, size_t n, char *err,
                      size_t errlen)
{
    int fd = open(dest, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return fail(err, errlen, dest, "open", -1);
    size_t put_n = 0;
    while (put_n < n) {
        ssize_t w = write(fd, buf + put_n, n - put_n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fail(err, errlen, dest, "write", fd);
            unlink(dest);
            return -1;
        }
        put_n += (size_t)w;
    }
    if (close(fd) != 0) {
        snprintf(err, errlen, "%s: close: %s", dest, strerror(errno));
        unlink(dest);
        return -1;
    }
    return 0;
}

int mg_journal_copy(const char *path, const char *dest, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        return fail(err, errlen, path, "open", -1);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) return fail(err, errlen, path, "stat", fd);
    if (st.st_size < (off_t)(HEADER + 4 * PAGE)) {
        close(fd);
        return 0;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    /* The appender writes only past the head; a drain frees records behind the tail, and the
     * next appends may overwrite them. A copy is one state when the tail did not move while
     * it was read (drains are ~250 ms apart, a copy takes about a millisecond). */
    int rc = -1, tries = 0;
    for (; tries < 100; tries++) {
        if (read_all(fd, buf, len) != 0) {
            fail(err, errlen, path, "read", -1);
            break;
        }
        const header_t *h = (const header_t *)buf;
        if (h->magic != MAGIC || !known_version(h->version) || h->head == h->tail) {
            rc = 0; /* not a journal of ours, or nothing in it */
            break;
        }
        if (tail_now(fd) == h->tail) {
            rc = write_copy(dest, buf, len, err, errlen) == 0 ? 1 : -1;
            break;
        }
        usleep(1000);
    }
    if (tries == 100) snprintf(err, errlen, "%s: drained while copied, 100 times", path);
    free(buf);
    close(fd);
    return rc;
}
