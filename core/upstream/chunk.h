/* chunk: whether an OpenAI stream chunk is JSON, and what it carries that the gateway acts
 * on, found from its bytes in one pass without building a tree.
 *
 * Passthrough streams forward most events untouched; only the first chunk, the one with
 * a finish_reason, a usage chunk and an error are annotated or read. Every forwarded event
 * must also be JSON the client's SDK can parse (a broken one ends the stream instead), so
 * the one scan both validates the chunk and tells those keys apart. */
#ifndef MG_CHUNK_H
#define MG_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#define MG_CHUNK_FINISH 1 /* a "finish_reason" key with a string value */
#define MG_CHUNK_USAGE 2  /* a "usage" key with an object value */
#define MG_CHUNK_ERROR 4  /* an "error" key with an object or string value */

/* Deepest nesting accepted (a chunk comes nowhere near it; the SDKs' parsers stop too). */
#define MG_CHUNK_MAX_DEPTH 512

/* The n bytes of one event's data: their MG_CHUNK_* flags (0 or more) when they are one JSON
 * object as RFC 8259 defines it, -1 otherwise. Strict, as JSON.parse and Python's json are:
 * UTF-8 only (no surrogate or overlong encodings), no raw control characters in strings,
 * escapes from the grammar's list (\uXXXX with four hex digits), numbers in the grammar's
 * form, only space, tab, CR and LF between tokens and around the object, nothing after it,
 * at most MG_CHUNK_MAX_DEPTH levels. A key counts wherever it is nested (as before: the
 * callers look closer when a flag is set), and only as a key: a string value that reads
 * like one sets nothing. Keys are matched as written, escapes not decoded. */
int mg_chunk_scan(const char *s, size_t n);

/* What a stream's chunks have in common, kept between them: the stream's last chunk that
 * was scanned in full. The chunks of one stream mostly differ in a few string values (the
 * content, an id): a chunk that is this one with string values swapped for strings is
 * checked by comparing bytes and scanning only the swapped strings. Zeroed memory is an
 * empty memo; mg_chunk_memo_free gives its buffer back (owned, at most MG_CHUNK_MEMO_MAX). */
#define MG_CHUNK_MEMO_STRINGS 32
#define MG_CHUNK_MEMO_MAX 4096
typedef struct mg_chunk_memo_s {
    char *text; /* owned (malloc): the template, a valid chunk; len 0: none */
    size_t len, cap;
    int flags;     /* its MG_CHUNK_* flags */
    int n_strings; /* its first value strings (not keys), by their quotes' offsets */
    uint32_t open[MG_CHUNK_MEMO_STRINGS], close[MG_CHUNK_MEMO_STRINGS];
    /* The chunk last scanned: matched when it is the template with value strings swapped
     * (or the template itself, just made), so that it has the template's structure and its
     * keys; then, when the caller set places (the others do not pay for it), at_open/at_close
     * are the quotes of its value strings, the template's n_strings in order. A caller that
     * read the template's structure keeps what it found by string index while generation
     * (counts the templates made) stays the same. */
    int places;
    int matched;
    unsigned generation;
    uint32_t at_open[MG_CHUNK_MEMO_STRINGS], at_close[MG_CHUNK_MEMO_STRINGS];
} mg_chunk_memo_t;

/* mg_chunk_scan's answer for s[0..n), exactly, found against the memo when s is its template
 * with string values changed, else by a full scan that makes s the template (when valid and
 * not over MG_CHUNK_MEMO_MAX bytes). Any memo contents give the right answer. */
int mg_chunk_scan_memo(mg_chunk_memo_t *m, const char *s, size_t n);
void mg_chunk_memo_free(mg_chunk_memo_t *m);

#endif
