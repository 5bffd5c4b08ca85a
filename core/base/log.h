/* log: JSON log lines, one object per line on stdout (or log.file; log.format: text gives
 * "ts level msg key=value ..." lines instead).
 *
 * Lines are built in memory and appended to a buffer that is flushed once per
 * loop iteration (and whenever it grows past 64 KiB), so a busy loop pays one
 * write(2) for many lines. Before the loop exists (start-up, --check), and from any
 * other thread (the store's writer, a reload's worker), lines are written straight away: an
 * idle loop may not turn again for a long time, and its buffered lines go first. Values
 * given to the field helpers are JSON-escaped; never pass a secret or a prompt. */
#ifndef MG_LOG_H
#define MG_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef enum {
    MG_LOG_DEBUG = 0,
    MG_LOG_INFO = 1,
    MG_LOG_WARN = 2,
    MG_LOG_ERROR = 3
} mg_log_level_t;

/* A line under construction. Start with mg_log_begin, add fields, finish with mg_log_end. */
typedef struct mg_logline_s {
    char buf[2048];
    size_t len;
    int overflow;
} mg_logline_t;

void mg_log_set_level(mg_log_level_t level);
/* 1: key=value lines for a terminal (log.format: text); 0: JSON objects (the default). */
void mg_log_set_text(int text);
/* Every line carries "node_id" from then on (cluster.node_id); the first call's value stays
 * (it is read by every thread, so it never changes under them). */
void mg_log_set_node(const char *node_id);

int mg_log_level_parse(const char *s, mg_log_level_t *out);
int mg_log_enabled(mg_log_level_t level);

/* Attach the buffered writer to a loop (flushes in a check handle). mg_log_detach
 * flushes and closes the handle; lines after it are written directly. */
void mg_log_attach(uv_loop_t *loop);
void mg_log_detach(void);
void mg_log_flush(void);
/* From now on, lines go to `fd` instead of what they went to (stdout or the last fd given):
 * what is buffered is flushed first, then fd takes the place of standard output (dup2), so a
 * line is never split between two files. The caller closes fd afterwards. Any thread. */
int mg_log_redirect(int fd);

void mg_log_begin(mg_logline_t *l, mg_log_level_t level, const char *msg);
void mg_log_str(mg_logline_t *l, const char *key, const char *value); /* NULL value -> null */
void mg_log_strn(mg_logline_t *l, const char *key, const char *value, size_t n);
void mg_log_int(mg_logline_t *l, const char *key, int64_t value);
void mg_log_double(mg_logline_t *l, const char *key, double value);
void mg_log_bool(mg_logline_t *l, const char *key, int value);
void mg_log_end(mg_logline_t *l);

/* Finish l with n more fields whose values may be long (the full mode's prompt and answer,
 * already redacted by the caller): each escaped whole, never cut, the line built on the heap
 * and written as one. Out of memory: the long fields are dropped (truncated=true). */
void mg_log_end_long(mg_logline_t *l, size_t n, const char *const keys[], const char *const vals[],
                     const size_t lens[]);

/* One-shot message with an optional request id (NULL for none). */
void mg_log_msg(mg_log_level_t level, const char *request_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with the request's trace id (NULL or "" for none). */
void mg_log_msg_traced(mg_log_level_t level, const char *request_id, const char *trace_id,
                       const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* JSON string escaping into dst (always NUL-terminated when cap > 0); returns bytes written. */
size_t mg_json_escape(char *dst, size_t cap, const char *src, size_t n);

#endif
