/* fuzz_json: the request-body scanners of core/base/json.c that the pipeline's parse step
 * (core/pipeline/body.c) reads client bodies with, without a tree, differential against the
 * cJSON parse the tree path does on the same bytes. A client is not trusted.
 *
 * The first byte chooses a member (bits 0-5) at which a callback stops, and whether it also
 * frees the text it is scanning (bit 6: the stop-and-free case, as a caller that ends the
 * request inside the callback; ASan sees any read after that); the rest is the body, copied to
 * a heap buffer of its exact size (no NUL after it). Checks:
 *   - mg_json_check accepts exactly what cJSON_ParseWithLength accepts, and ends where cJSON
 *     stopped reading;
 *   - mg_json_check_members = 0 only for an object cJSON parses, with the same members in the
 *     same order (keys without escapes byte for byte), each value a whole value by itself;
 *   - mg_json_members and mg_json_elements report values inside the text, and a stopping
 *     callback's value comes back as is;
 *   - mg_json_keep_big_ints and mg_json_print on cJSON's tree give text cJSON reads again. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

typedef struct {
    const char *text;
    size_t len;
    const cJSON *tree, *child; /* cJSON's tree and its next member (check_members) */
    int n, stop_at, free_at_stop;
    int mismatch; /* a member unlike the tree's: only a refused text (-1) may have one, as the
                     callbacks run before the scan's verdict */
    char *owned;  /* freed at the stop in the stop-and-free case */
} scan_t;

static void check_inside(const scan_t *s, const char *p, size_t n)
{
    if (!p || p < s->text || n > s->len || (size_t)(p - s->text) > s->len - n) __builtin_trap();
}

static int stop_here(scan_t *s)
{
    if (s->n++ != s->stop_at) return 0;
    if (s->free_at_stop) {
        free(s->owned);
        s->owned = NULL;
    }
    return 7;
}

static int member_seen(void *ud, const mg_json_member_t *m)
{
    scan_t *s = ud;
    check_inside(s, m->key, m->key_len);
    check_inside(s, m->value, m->value_len);
    if (m->value_len == 0) __builtin_trap();
    return stop_here(s);
}

static int element_seen(void *ud, const char *v, size_t n)
{
    scan_t *s = ud;
    check_inside(s, v, n);
    if (n == 0) __builtin_trap();
    return stop_here(s);
}

/* check_members' member against cJSON's tree of the same text */
static int member_matches(void *ud, const mg_json_member_t *m)
{
    scan_t *s = ud;
    check_inside(s, m->key, m->key_len);
    check_inside(s, m->value, m->value_len);
    s->n++;
    if (!s->tree) return 0; /* cJSON refused: check_members must come to -1 */
    if (!s->child) {        /* more members than the tree */
        s->mismatch = 1;
        return 0;
    }
    /* cJSON's keys are C strings: a raw NUL byte ends one (escapes are decoded there) */
    size_t klen = strnlen(m->key, m->key_len);
    if (!memchr(m->key, '\\', m->key_len) &&
        (strlen(s->child->string) != klen || memcmp(s->child->string, m->key, klen)))
        s->mismatch = 1;
    size_t end = 0;
    if (mg_json_check(m->value, m->value_len, &end) != 0 || end != m->value_len)
        s->mismatch = 1; /* a value is exactly one value */
    s->child = s->child->next;
    return 0;
}

static char *copy(const uint8_t *data, size_t n)
{
    char *t = malloc(n ? n : 1);
    if (!t) abort();
    memcpy(t, data, n);
    return t;
}

static void check_against_cjson(const char *text, size_t n)
{
    const char *cend = NULL;
    cJSON *tree = cJSON_ParseWithLengthOpts(text, n, &cend, 0);
    size_t end = 0;
    int rc = mg_json_check(text, n, &end);
    if ((rc >= 0) != (tree != NULL)) __builtin_trap();
    if (tree && end != (size_t)(cend - text)) __builtin_trap();
    scan_t s = {
        .text = text, .len = n, .tree = tree, .child = tree ? tree->child : NULL, .stop_at = -1};
    int mrc = mg_json_check_members(text, n, member_matches, &s);
    if (mrc == 0) {
        if (!tree || !cJSON_IsObject(tree) || s.child || s.mismatch) __builtin_trap();
        if (rc != 0) __builtin_trap();
        for (size_t i = end; i < n; i++) /* one object, nothing but whitespace after it */
            if (!strchr(" \t\r\n", text[i]) || !text[i]) __builtin_trap();
    }
    if (tree && cJSON_IsObject(tree)) {
        if (mg_json_keep_big_ints(tree, text, n) != 0) abort();
        mg_buf_t out = {0};
        if (mg_json_print(tree, &out) != 0) abort();
        cJSON *again = cJSON_ParseWithLength(out.data, out.len);
        if (!again) __builtin_trap();
        cJSON_Delete(again);
        mg_buf_free(&out);
    }
    cJSON_Delete(tree);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int stop_at = data[0] & 63, free_at_stop = (data[0] >> 6) & 1;
    data++;
    size--;
    char *text = copy(data, size);
    check_against_cjson(text, size);

    /* the walkers, each with a callback that stops (and maybe frees) at member stop_at */
    for (int walker = 0; walker < 2; walker++) {
        scan_t s = {.text = copy(data, size), .len = size, .stop_at = stop_at};
        s.owned = (char *)s.text;
        s.free_at_stop = free_at_stop;
        int rc = walker == 0 ? mg_json_members(s.text, size, member_seen, &s)
                             : mg_json_elements(s.text, size, element_seen, &s);
        if (s.n > stop_at && rc != 7) __builtin_trap(); /* the stop's value, as is */
        if (rc == 7 && s.n != stop_at + 1) __builtin_trap();
        free(s.owned);
    }
    free(text);
    return 0;
}
