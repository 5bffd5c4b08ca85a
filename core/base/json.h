/* json: a growable byte buffer and a fast serializer for cJSON trees.
 *
 * cJSON's own printer formats every number with sprintf and checks it with sscanf; this
 * one writes integers directly and uses "%.15g" (falling back to "%.17g" only when needed
 * to round-trip) for the rest, so printing stays off the request's profile
 * (bench/README.md). */
#ifndef MG_JSON_H
#define MG_JSON_H

#include <stddef.h>
#include <cjson/cJSON.h>

typedef struct mg_buf_s {
    char *data; /* owned (malloc); NUL-terminated when len > 0 */
    size_t len, cap;
} mg_buf_t;

/* Append n bytes; 0 or -1 when out of memory (the buffer is unchanged then). */
int mg_buf_append(mg_buf_t *b, const void *data, size_t n);
int mg_buf_append_str(mg_buf_t *b, const char *s);
/* The decimal digits of v (what printf's %lld writes), written backwards into the end of
 * tmp (room for any long long and its sign); returns where they start, their length in
 * *len. No printf, no locale. */
#define MG_INT_DIGITS_MAX 24
const char *mg_int_digits(long long v, char tmp[MG_INT_DIGITS_MAX], size_t *len);
/* Append those digits. */
int mg_buf_append_int(mg_buf_t *b, long long v);
/* Make room for n more bytes now (one allocation instead of several doublings). */
int mg_buf_reserve(mg_buf_t *b, size_t n);
void mg_buf_free(mg_buf_t *b);

/* Append the compact JSON text of v; 0 or -1 (out of memory). */
int mg_json_print(const cJSON *v, mg_buf_t *out);
/* Append s as a JSON string literal (with quotes). */
int mg_json_print_string(const char *s, size_t n, mg_buf_t *out);
/* Append a number the way mg_json_print does. */
int mg_json_print_number(double d, mg_buf_t *out);

/* v's number as an integer, truncated toward zero and clamped to [LLONG_MIN, LLONG_MAX] (or
 * [INT_MIN, INT_MAX]); dflt when v is not a number or is NaN. A plain cast of a double out of
 * range is undefined behaviour, and clients and upstreams send 1e300. */
long long mg_json_ll(const cJSON *v, long long dflt);
int mg_json_int(const cJSON *v, int dflt);

/* Inserting into an array in the middle: mg_json_cut moves arr's items from index `at` on
 * into a new array (NULL when out of memory), the caller appends what goes there, and
 * mg_json_rejoin puts the cut items back after them and frees the holder. Not
 * cJSON_InsertItemInArray: Debian's cJSON 1.7.15 refuses to insert into a parsed array. */
cJSON *mg_json_cut(cJSON *arr, int at);
void mg_json_rejoin(cJSON *arr, cJSON *cut);

/* One member of a JSON object, as byte ranges into the scanned text. `key` is the
 * raw text between the quotes (escapes not decoded); `value` is the member's whole
 * value text (an object or array with everything inside it). */
typedef struct mg_json_member_s {
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
} mg_json_member_t;

/* Return 0 to continue, non-zero to stop (mg_json_members returns it). */
typedef int (*mg_json_member_cb)(void *ud, const mg_json_member_t *m);

/* Walk the top-level members of the JSON object in s[0..n) without building a tree.
 * Returns 0 after the last member, the callback's non-zero value, or -1 when the
 * text is not a well-formed object at the top level (nested values are checked
 * for balanced brackets and string syntax only). */
int mg_json_members(const char *s, size_t n, mg_json_member_cb cb, void *ud);

/* The same for the elements of a JSON array: cb gets each element's whole value text.
 * Returns 0 after the last element, the callback's non-zero value, or -1. */
typedef int (*mg_json_element_cb)(void *ud, const char *value, size_t len);
int mg_json_elements(const char *s, size_t n, mg_json_element_cb cb, void *ud);

/* Would cJSON_ParseWithLength(s, n) accept the text? The same grammar, quirks included
 * (bytes up to 32 are whitespace, numbers are what strtod takes of a run of [0-9+-eE.],
 * "\u" escapes with bad hex digits pass, 1,000 levels of nesting, bytes after the first
 * value are ignored), checked without building a tree: the request path uses it to keep
 * cJSON's verdict on a body it reads as bytes. Returns 0 when accepted and the whitespace
 * between tokens is only space, tab, CR and LF (so every scalar value ends exactly where
 * mg_json_members says it does), 1 when accepted with other whitespace or a BOM, -1 when
 * refused. *end (may be NULL) is set just past the first value when accepted. */
int mg_json_check(const char *s, size_t n, size_t *end);

/* mg_json_check and mg_json_members in one pass: 0 when cJSON would accept the text, it is
 * one object with nothing after it and only space, tab, CR and LF between tokens, and cb
 * saw every top-level member; cb's non-zero return when it stopped (the rest unchecked);
 * -1 otherwise. Values are exact here: a scalar's text ends with its last character. */
int mg_json_check_members(const char *s, size_t n, mg_json_member_cb cb, void *ud);

/* The integers a tree parsed from s[0..n) holds as doubles but the text wrote exactly: each
 * top-level member of obj whose value is an integer literal beyond a double's exact range
 * (|v| >= 2^53, a client's 64-bit seed) becomes a cJSON_Raw item of that literal, so that
 * mg_json_print writes it back as it came and Lua reads it as an exact integer. Costs one
 * look at obj's members when none is that large. 0, or -1 when out of memory. */
int mg_json_keep_big_ints(cJSON *obj, const char *s, size_t n);

#endif
