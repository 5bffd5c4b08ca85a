/* memtrim: give memory back to the system after a burst of large frees.
 *
 * glibc keeps freed heap memory for reuse, and its mmap threshold grows to the size of the
 * largest block freed (up to 32 MiB): after a burst of big answers, queued for clients that
 * read slowly and then left, the process keeps that memory indefinitely; and the many small
 * blocks of a crowd of connections that left (a connection, its input buffer) stay in the heap
 * as holes glibc does not give back by itself. Owners note the large buffers and the
 * connections they free; once MG_MEMTRIM_MIN_BYTES were freed and a quiet second followed
 * (no further frees noted: the burst is over, the loop went idle), malloc_trim(0) runs on a
 * worker thread, off the loop. Elsewhere than glibc nothing is trimmed. */
#ifndef MG_MEMTRIM_H
#define MG_MEMTRIM_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Enough that a trim is worth its heap walk; small enough that the tail of a burst (the last
 * slow readers' buffers, freed after the burst's trim) is given back too, once it is quiet. */
#define MG_MEMTRIM_MIN_BYTES (1u * 1024u * 1024u)

typedef struct mg_memtrim_s {
    uv_loop_t *loop;
    uv_timer_t timer;    /* the quiet second after a burst */
    uv_work_t work;      /* malloc_trim on the thread pool */
    size_t freed;        /* bytes noted since the last trim */
    size_t freed_at_arm; /* ... when the timer was set */
    int open, armed, working;
    uint64_t trims; /* malloc_trim runs so far */
} mg_memtrim_t;

/* Set up on a loop. Returns 0 or a negative libuv error. */
int mg_memtrim_init(mg_memtrim_t *t, uv_loop_t *loop);
/* `bytes` of a large buffer (or a closed connection) were just freed. Costs an addition, and a
 * timer start once per burst. */
void mg_memtrim_note(mg_memtrim_t *t, size_t bytes);
/* Stop; the timer handle closes on the next loop turn (a trim already running finishes on
 * its thread). The struct must stay valid until the loop has run once more. */
void mg_memtrim_close(mg_memtrim_t *t);

#endif
