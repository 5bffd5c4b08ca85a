/* loader: what every section reader of the YAML config shares (conf/config.c and the
 * section files beside it): the loader's state, errors that name the file and line, the
 * allocation budget that bounds alias expansion, ${NAME} expansion, strict key checks, and
 * typed optional fields. Every function that fails writes "NAME:LINE: reason" into the
 * loader's error buffer and returns -1, so callers can `return conf_fail(...)`. */
#ifndef MG_CONF_LOADER_H
#define MG_CONF_LOADER_H

#include "conf/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#define MAX_ID_LEN 128          /* provider ids and adapter names */
#define MAX_NAME_LEN 256        /* logical and upstream model names */
#define MAX_TIMEOUT_MS 86400000 /* one day: keeps ms arithmetic far from int overflow */
#define KIB 1024LL
#define MIB (1024LL * 1024LL)
#define GIB (1024LL * 1024LL * 1024LL)

typedef struct conf_loader_s {
    const char *name;  /* file name for messages */
    const char *input; /* the YAML text (reader errors give a byte offset) */
    size_t input_len;
    yaml_document_t *doc;
    mg_config_t *cfg;
    char *err;
    size_t err_len;
    size_t budget; /* bytes the result may still allocate; bounds alias expansion */
} conf_loader_t;

/* A field being read: the mapping it lives in, the value and its dotted path. */
typedef struct conf_field_s {
    yaml_node_t *val; /* NULL when the key is absent */
    int line;         /* the key's line (the mapping's when absent) */
    char path[360];   /* e.g. "server.listen", "providers[2].weight" */
} conf_field_t;

/* Writes "NAME:LINE: message" (or "NAME: message" when line <= 0) into the error buffer
 * and returns -1, so callers can `return conf_fail(...)`. */
int conf_fail(conf_loader_t *l, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int conf_line_of(const yaml_node_t *n);
yaml_node_t *conf_node_at(conf_loader_t *l, int index);
/* Takes `bytes` from the allocation budget; fails once a (probably aliased) document
 * would expand far beyond its own size. */
int conf_charge(conf_loader_t *l, int line, size_t bytes);
/* Copies s for the result, charging the budget. */
char *conf_dup_str(conf_loader_t *l, int line, const char *s);
/* A short printable rendering of a value for messages (never used for secrets):
 * non-printable bytes become '?', long values end in "...". */
const char *conf_shown(const char *s, char *buf, size_t len);
bool conf_is_scalar(const yaml_node_t *n);
const char *conf_scalar_text(const yaml_node_t *n);
/* A plain (unquoted) empty, ~ or null scalar is YAML's null. */
bool conf_is_null(const yaml_node_t *n);
/* Returns a malloc'd copy of the scalar `v` with every ${NAME} replaced by the value of
 * environment variable NAME; text around references is kept. An undefined variable is an
 * error, unless `missing` is given (api_key): then an undefined or empty variable sets
 * *missing and the caller treats the whole value as absent. `path` names the key in
 * messages, which may name a variable but never show the value or the scalar, so this is
 * safe for secrets. Returns NULL with the error set on failure. */
char *conf_expand(conf_loader_t *l, const yaml_node_t *v, int line, const char *path,
                  bool *missing);
bool conf_key_is(conf_loader_t *l, const yaml_node_pair_t *p, const char *key);
/* The pair with scalar key `key` in mapping `map`, or NULL. */
yaml_node_pair_t *conf_find_pair(conf_loader_t *l, yaml_node_t *map, const char *key);
/* A key and its position in file order, for finding repeats. */
typedef struct conf_keyref_s {
    const char *key;
    size_t index;
} conf_keyref_t;

/* Index of the first entry (in file order) whose key repeats an earlier one, or -1.
 * Sorting keeps this O(n log n) for large, fuzzed inputs. Reorders `refs`. */
long conf_first_duplicate(conf_keyref_t *refs, size_t n);
/* Checks that every key of mapping `map` is a string, appears once and, when `allowed`
 * (NULL-terminated) is given, is one of the allowed keys. `where` completes messages:
 * "unknown key 'x' in server". */
int conf_check_keys(conf_loader_t *l, yaml_node_t *map, const char *where,
                    const char *const *allowed);
/* Checks that `v` (the value at `path`, on `line`) is a mapping with only `allowed` keys.
 * Returns 1 for a mapping, 0 for null (an empty section), -1 on error. */
int conf_want_map(conf_loader_t *l, yaml_node_t *v, int line, const char *path,
                  const char *const *allowed);
void conf_field_get(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    conf_field_t *f);
/* Reads the field as a string with ${NAME} expanded; the result is owned by the caller.
 * Null and non-scalars are type errors. */
int conf_field_string(conf_loader_t *l, const conf_field_t *f, char **out);
/* Optional non-empty string: absent leaves *dst unchanged; present replaces it. */
int conf_opt_string(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    char **dst);
/* Required non-empty string. */
int conf_req_string(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    char **dst);
/* Optional integer in [lo, hi] (decimal, optional sign). */
int conf_opt_int(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                 long long lo, long long hi, long long *dst);
int conf_opt_int_field(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                       long long lo, long long hi, int *dst);
/* Optional boolean: true/false (also YAML 1.1's yes/no/on/off), any case. */
int conf_opt_bool(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key, bool *dst);
/* Optional one of `choices` (NULL-terminated): *dst becomes its index; absent leaves it. */
int conf_opt_choice(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    const char *const *choices, int *dst);
/* Optional string that may be empty (then *dst becomes NULL); absent leaves *dst. */
int conf_opt_text(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                  char **dst);
/* A number in (0, hi], or [0, hi] with zero_ok. */
int conf_opt_number(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    bool zero_ok, double hi, double *dst);
int conf_opt_positive(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                      double hi, double *dst);
bool conf_all_chars(const char *s, const char *extra);
/* "host:port" with port 0-65535; host a name/IPv4 address or a bracketed IPv6 address. */
bool conf_valid_listen(const char *s);
/* Port of a valid listen address. */
long conf_listen_port(const char *s);
/* Logical and upstream model names: non-empty, printable, no whitespace. */
bool conf_valid_name(const char *s);

#endif
