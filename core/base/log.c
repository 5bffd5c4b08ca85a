/* log: JSON lines with a per-loop-iteration buffered writer (see log.h). */
#include "base/log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/time.h>

#define LOG_FLUSH_AT (64 * 1024)
#include <stdlib.h>

static const char *level_names[] = {"debug", "info", "warn", "error"};

/* Logging is process-wide by nature (like stdout itself): one level, one buffer. */
/* The mutex matters only when another thread (the store's writer, a reload's worker) logs;
 * uncontended it costs a few nanoseconds. */
static pthread_mutex_t g_log_mutex = PTHREAD_MUTEX_INITIALIZER;

static struct {
    mg_log_level_t level;
    uv_check_t check;
    int attached;
    pthread_t loop_thread; /* the attached loop's: only its lines wait for the check */
    char *buf;
    size_t len, cap;
    int text;      /* log.format: text */
    char node[80]; /* cluster.node_id, set once at start: every line says which instance */
} g_log = {.level = MG_LOG_INFO};

void mg_log_set_node(const char *node_id)
{
    if (!g_log.node[0] && node_id) snprintf(g_log.node, sizeof g_log.node, "%s", node_id);
}

void mg_log_set_text(int text)
{
    g_log.text = text;
}

void mg_log_set_level(mg_log_level_t level)
{
    g_log.level = level;
}

int mg_log_enabled(mg_log_level_t level)
{
    return level >= g_log.level;
}

int mg_log_level_parse(const char *s, mg_log_level_t *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (mg_log_level_t)i;
            return 0;
        }
    }
    return -1;
}

static void write_all(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, p, n);
        if (w < 0) return; /* nowhere to report a failing log */
        p += w;
        n -= (size_t)w;
    }
}

static void flush_locked(void)
{
    if (g_log.len == 0) return;
    write_all(g_log.buf, g_log.len);
    g_log.len = 0;
}

void mg_log_flush(void)
{
    pthread_mutex_lock(&g_log_mutex);
    flush_locked();
    pthread_mutex_unlock(&g_log_mutex);
}

int mg_log_redirect(int fd)
{
    pthread_mutex_lock(&g_log_mutex);
    flush_locked();
    int rc = dup2(fd, STDOUT_FILENO) < 0 ? -1 : 0;
    pthread_mutex_unlock(&g_log_mutex);
    return rc;
}

static void on_check(uv_check_t *h)
{
    mg_log_flush();
}

void mg_log_attach(uv_loop_t *loop)
{
    uv_check_init(loop, &g_log.check);
    uv_unref((uv_handle_t *)&g_log.check);
    uv_check_start(&g_log.check, on_check);
    g_log.loop_thread = pthread_self();
    g_log.attached = 1;
}

void mg_log_detach(void)
{
    if (!g_log.attached) return;
    mg_log_flush();
    uv_check_stop(&g_log.check);
    uv_close((uv_handle_t *)&g_log.check, NULL);
    g_log.attached = 0;
    free(g_log.buf);
    g_log.buf = NULL;
    g_log.cap = 0;
}

static void emit_locked(const char *line, size_t n);

static void emit(const char *line, size_t n)
{
    pthread_mutex_lock(&g_log_mutex);
    emit_locked(line, n);
    pthread_mutex_unlock(&g_log_mutex);
}

static void emit_locked(const char *line, size_t n)
{
    if (!g_log.attached || !pthread_equal(pthread_self(), g_log.loop_thread)) {
        flush_locked(); /* the loop's earlier lines first */
        write_all(line, n);
        return;
    }
    if (g_log.len + n > g_log.cap) {
        size_t cap = g_log.cap ? g_log.cap : 16384;
        while (cap < g_log.len + n) cap *= 2;
        char *nb = realloc(g_log.buf, cap);
        if (!nb) {
            flush_locked();
            write_all(line, n);
            return;
        }
        g_log.buf = nb;
        g_log.cap = cap;
    }
    memcpy(g_log.buf + g_log.len, line, n);
    g_log.len += n;
    if (g_log.len >= LOG_FLUSH_AT) flush_locked();
}

size_t mg_json_escape(char *dst, size_t cap, const char *src, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (cap == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        char esc = 0;
        switch (c) {
        case '"': esc = '"'; break;
        case '\\': esc = '\\'; break;
        case '\n': esc = 'n'; break;
        case '\r': esc = 'r'; break;
        case '\t': esc = 't'; break;
        default: break;
        }
        if (esc) {
            if (o + 2 >= cap) break;
            dst[o++] = '\\';
            dst[o++] = esc;
        } else if (c < 0x20) {
            if (o + 6 >= cap) break;
            dst[o++] = '\\';
            dst[o++] = 'u';
            dst[o++] = '0';
            dst[o++] = '0';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        } else {
            if (o + 1 >= cap) break;
            dst[o++] = (char)c;
        }
    }
    dst[o] = '\0';
    return o;
}

static void append(mg_logline_t *l, const char *s, size_t n)
{
    if (l->len + n >= sizeof(l->buf) - 2) {
        l->overflow = 1;
        return;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void append_key(mg_logline_t *l, const char *key)
{
    if (g_log.text) {
        append(l, " ", 1);
        append(l, key, strlen(key));
        append(l, "=", 1);
        return;
    }
    append(l, ",\"", 2);
    append(l, key, strlen(key));
    append(l, "\":", 2);
}

/* A text-format value goes bare when it is one plain word, quoted (JSON escapes) otherwise. */
static int plain_word(const char *s, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f) return 0;
    }
    return 1;
}

static void append_escaped(mg_logline_t *l, const char *s, size_t n)
{
    char tmp[1024];
    /* Long values are cut: a log line must stay a line, not a dump. */
    size_t w = mg_json_escape(tmp, sizeof(tmp), s, n);
    if (g_log.text && plain_word(tmp, w)) {
        append(l, tmp, w);
        return;
    }
    append(l, "\"", 1);
    append(l, tmp, w);
    append(l, "\"", 1);
}

/* Each field is all or nothing: a field that does not fit is dropped whole. */
#define FIELD_BEGIN(l)                                                                             \
    size_t mark_ = (l)->len;                                                                       \
    int ovf_ = (l)->overflow;                                                                      \
    (l)->overflow = 0
#define FIELD_END(l)                                                                               \
    do {                                                                                           \
        if ((l)->overflow) (l)->len = mark_;                                                       \
        (l)->overflow |= ovf_;                                                                     \
    } while (0)

/* The "ts" prefix up to the seconds changes once a second: format it once. */
static _Thread_local struct {
    time_t sec;
    char text[32];
} ts_cache = {-1, ""};

void mg_log_begin(mg_logline_t *l, mg_log_level_t level, const char *msg)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    if (tv.tv_sec != ts_cache.sec) {
        struct tm tm;
        gmtime_r(&tv.tv_sec, &tm);
        strftime(ts_cache.text, sizeof(ts_cache.text), "%Y-%m-%dT%H:%M:%S", &tm);
        ts_cache.sec = tv.tv_sec;
    }
    int ms = (int)(tv.tv_usec / 1000);
    l->overflow = 0;
    l->len = 0;
    char frac[8] = {
        '.', (char)('0' + ms / 100), (char)('0' + ms / 10 % 10), (char)('0' + ms % 10), 'Z', '"'};
    if (g_log.text) { /* "2026-08-03T06:56:00.123Z info msg key=value ..." */
        append(l, ts_cache.text, strlen(ts_cache.text));
        append(l, frac, 5);
        append(l, " ", 1);
        append(l, level_names[level], strlen(level_names[level]));
        append(l, " ", 1);
        append_escaped(l, msg, strlen(msg));
        if (g_log.node[0]) mg_log_str(l, "node_id", g_log.node);
        return;
    }
    append(l, "{\"ts\":\"", 7);
    append(l, ts_cache.text, strlen(ts_cache.text));
    append(l, frac, 6);
    append(l, ",\"level\":\"", 10);
    append(l, level_names[level], strlen(level_names[level]));
    append(l, "\"", 1);
    mg_log_str(l, "msg", msg);
    if (g_log.node[0]) mg_log_str(l, "node_id", g_log.node);
}

void mg_log_str(mg_logline_t *l, const char *key, const char *value)
{
    if (!value) {
        FIELD_BEGIN(l);
        append_key(l, key);
        append(l, "null", 4);
        FIELD_END(l);
        return;
    }
    mg_log_strn(l, key, value, strlen(value));
}

void mg_log_strn(mg_logline_t *l, const char *key, const char *value, size_t n)
{
    FIELD_BEGIN(l);
    append_key(l, key);
    append_escaped(l, value, n);
    FIELD_END(l);
}

static size_t format_int(char *end, int64_t value)
{
    char *p = end;
    uint64_t u = value < 0 ? 0ull - (uint64_t)value : (uint64_t)value;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0) *--p = '-';
    return (size_t)(end - p);
}

void mg_log_int(mg_logline_t *l, const char *key, int64_t value)
{
    char tmp[24];
    size_t n = format_int(tmp + sizeof(tmp), value);
    FIELD_BEGIN(l);
    append_key(l, key);
    append(l, tmp + sizeof(tmp) - n, n);
    FIELD_END(l);
}

/* Three decimals by integer arithmetic (durations in ms: printf's float path is slow). */
void mg_log_double(mg_logline_t *l, const char *key, double value)
{
    char tmp[48];
    int64_t milli = (int64_t)(value * 1000.0 + (value < 0 ? -0.5 : 0.5));
    int64_t whole = milli / 1000, frac = milli % 1000;
    if (frac < 0) frac = -frac;
    size_t w = format_int(tmp + 24, whole);
    memmove(tmp, tmp + 24 - w, w);
    int n = (int)w;
    if (milli < 0 && whole == 0) {
        memmove(tmp + 1, tmp, (size_t)n);
        tmp[0] = '-';
        n++;
    }
    tmp[n++] = '.';
    tmp[n++] = (char)('0' + frac / 100);
    tmp[n++] = (char)('0' + frac / 10 % 10);
    tmp[n++] = (char)('0' + frac % 10);
    FIELD_BEGIN(l);
    append_key(l, key);
    append(l, tmp, (size_t)n);
    FIELD_END(l);
}

void mg_log_bool(mg_logline_t *l, const char *key, int value)
{
    FIELD_BEGIN(l);
    append_key(l, key);
    append(l, value ? "true" : "false", value ? 4 : 5);
    FIELD_END(l);
}

void mg_log_end(mg_logline_t *l)
{
    const char *mark = g_log.text ? " truncated=true" : ",\"truncated\":true";
    size_t mark_len = strlen(mark);
    if (l->overflow && l->len + mark_len + 3 < sizeof(l->buf)) {
        memcpy(l->buf + l->len, mark, mark_len);
        l->len += mark_len;
    }
    if (!g_log.text) l->buf[l->len++] = '}';
    l->buf[l->len++] = '\n';
    emit(l->buf, l->len);
}

void mg_log_end_long(mg_logline_t *l, size_t n, const char *const keys[], const char *const vals[],
                     const size_t lens[])
{
    size_t total = l->len + 4;
    for (size_t i = 0; i < n; i++) total += strlen(keys[i]) + 6 * lens[i] + 8;
    char *line = malloc(total);
    if (!line) {
        l->overflow = 1;
        mg_log_end(l);
        return;
    }
    size_t o = l->len;
    memcpy(line, l->buf, o);
    for (size_t i = 0; i < n; i++) {
        const char *lead = g_log.text ? " " : ",\"";
        memcpy(line + o, lead, strlen(lead));
        o += strlen(lead);
        memcpy(line + o, keys[i], strlen(keys[i]));
        o += strlen(keys[i]);
        const char *mid = g_log.text ? "=\"" : "\":\"";
        memcpy(line + o, mid, strlen(mid));
        o += strlen(mid);
        o += mg_json_escape(line + o, 6 * lens[i] + 1, vals[i], lens[i]);
        line[o++] = '"';
    }
    if (!g_log.text) line[o++] = '}';
    line[o++] = '\n';
    emit(line, o);
    free(line);
}

static void log_msgv(mg_log_level_t level, const char *request_id, const char *trace_id,
                     const char *fmt, va_list ap)
{
    char text[1024];
    vsnprintf(text, sizeof(text), fmt, ap);
    mg_logline_t l;
    mg_log_begin(&l, level, text);
    if (request_id) mg_log_str(&l, "request_id", request_id);
    if (trace_id && trace_id[0]) mg_log_str(&l, "trace_id", trace_id);
    mg_log_end(&l);
}

void mg_log_msg(mg_log_level_t level, const char *request_id, const char *fmt, ...)
{
    if (!mg_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    log_msgv(level, request_id, NULL, fmt, ap);
    va_end(ap);
}

void mg_log_msg_traced(mg_log_level_t level, const char *request_id, const char *trace_id,
                       const char *fmt, ...)
{
    if (!mg_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    log_msgv(level, request_id, trace_id, fmt, ap);
    va_end(ap);
}
