/* arena: a per-request memory pool with cleanup handlers.
 *
 * Everything a request allocates from its arena dies with it in one
 * mg_arena_destroy(); cleanup handlers run first, newest first, for resources that
 * are not memory (Lua references, cJSON trees). Allocation never fails silently:
 * a NULL return means out of memory and the caller must fail the request. */
#ifndef MG_ARENA_H
#define MG_ARENA_H

#include <stddef.h>

typedef struct mg_arena_block_s mg_arena_block_t;
typedef struct mg_arena_cleanup_s mg_arena_cleanup_t;

typedef struct mg_arena_s {
    mg_arena_block_t *head;       /* owned chain of blocks */
    mg_arena_cleanup_t *cleanups; /* owned list, run newest first */
    size_t block_size;
} mg_arena_t;

/* Whether to keep freed per-request objects for reuse (an arena block, a call): 0 under
 * AddressSanitizer, which must see every use after free. */
#if defined(__SANITIZE_ADDRESS__)
#define MG_RECYCLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MG_RECYCLE 0
#endif
#endif
#ifndef MG_RECYCLE
#define MG_RECYCLE 1
#endif

void mg_arena_init(mg_arena_t *a, size_t block_size);
void *mg_arena_alloc(mg_arena_t *a, size_t n);  /* 16-byte aligned, not zeroed */
void *mg_arena_calloc(mg_arena_t *a, size_t n); /* zeroed */
char *mg_arena_strndup(mg_arena_t *a, const char *s, size_t n);
char *mg_arena_strdup(mg_arena_t *a, const char *s);
/* Run fn(data) when the arena is destroyed. Returns 0, or -1 when out of memory
 * (fn is then not registered and the caller still owns data). */
int mg_arena_on_destroy(mg_arena_t *a, void (*fn)(void *), void *data);
/* Run cleanups and free every block but one of the block size, which is kept empty for
 * reuse: a cheaper destroy + init for an arena that serves one request after another. */
void mg_arena_reset(mg_arena_t *a);
/* Run cleanups and free every block; the arena can be initialised again after. */
void mg_arena_destroy(mg_arena_t *a);

#endif
