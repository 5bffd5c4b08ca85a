/* chunk: what an OpenAI stream chunk carries that the gateway acts on, found from its
 * bytes without parsing them.
 *
 * Passthrough streams forward most events untouched; only the first chunk, the one with
 * a finish_reason, a usage chunk and an error are annotated or read. This scan tells them
 * apart at a fraction of a parse. It may report a key that is not there (a string value
 * that looks like one): that costs the caller a parse, never a wrong answer. It never
 * misses one that is. */
#ifndef MG_CHUNK_H
#define MG_CHUNK_H

#include <stddef.h>

#define MG_CHUNK_FINISH 1 /* a "finish_reason" with a string value */
#define MG_CHUNK_USAGE 2  /* a "usage" object */
#define MG_CHUNK_ERROR 4  /* an "error" object or string */

/* The MG_CHUNK_* flags of the n bytes of one event's data. */
int mg_chunk_keys(const char *s, size_t n);

#endif
