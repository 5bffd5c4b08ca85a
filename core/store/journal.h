/* journal: a ring of typed records in a memory-mapped file, the usage events' fast path
 * (obs/usage.h, store/store.h's mg_store_use_journal).
 *
 * Why: durability against kill -9 needs the bytes in the OS page cache only (what the WAL
 * with synchronous=normal gives), and a store into a MAP_SHARED mapping is there at once:
 * no syscall, no thread hand-off, no commit to wait for. The store's writer later turns the
 * records into ordinary writes (one transaction per drain) and then frees them.
 *
 * One producer (the loop thread: mg_journal_append) and one consumer (the writer thread:
 * mg_journal_read, mg_journal_release). Positions are byte counts since the file was made
 * (never wrap; the offset in the ring is pos % capacity). A record is fully written before
 * the head moves past it (a release store), so a kill -9 mid-record leaves a record that
 * does not exist; each record also carries a checksum, checked on read (a torn or stray
 * record ends the read: nothing past it is trusted). The file is pre-faulted and mlocked
 * (when allowed) at open, so an append never page-faults. Power loss: as synchronous=normal,
 * the last records may be lost (no msync). */
#ifndef MG_JOURNAL_H
#define MG_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

typedef struct mg_journal_s mg_journal_t;

#define MG_JOURNAL_BYTES_DEFAULT (4u << 20) /* ~10,000 usage events */
#define MG_JOURNAL_VALS_MAX 64

/* Open (creating it when missing) the ring file at path, `bytes` of ring (a multiple of 4 KiB;
 * an existing file of another size is made anew at this size when it is empty, and keeps its
 * own size while records are in it). 0 and *out, or -1 and err. */
int mg_journal_open(const char *path, size_t bytes, mg_journal_t **out, char *err, size_t errlen);
void mg_journal_close(mg_journal_t *j);

/* Producer: append one record of n typed values (text copied; MG_STORE_REAL not supported).
 * 0, or -1 when it does not fit (the ring is full: the caller takes another path). */
int mg_journal_append(mg_journal_t *j, int n, const mg_store_val_t *v);
/* Bytes in use (head - tail) and the ring's capacity: any thread. */
size_t mg_journal_used(const mg_journal_t *j);
size_t mg_journal_capacity(const mg_journal_t *j);

/* Consumer: each record from the tail up to the head as it is now, in order, at most `max`
 * of them; `each` gets its values (valid during the call). Returns the position after the last
 * record read (pass it to mg_journal_release once what was read is durable elsewhere). */
typedef void (*mg_journal_each_fn)(void *ud, int n, const mg_store_val_t *v);
uint64_t mg_journal_read(mg_journal_t *j, int max, mg_journal_each_fn each, void *ud);
/* Consumer: the records before pos are no longer needed. */
void mg_journal_release(mg_journal_t *j, uint64_t pos);

/* Copy the journal file at path (another process may be appending to it and draining it)
 * into dest, as one state: the records between its tail and head at one moment, none torn
 * by a drain's release racing the copy (the copy is retried while the tail moves). 1 when
 * dest was written with records in it, 0 when there is no journal or nothing in it (dest not
 * written), -1 and err. Blocking file I/O: a worker thread or the CLI. */
int mg_journal_copy(const char *path, const char *dest, char *err, size_t errlen);

#endif
