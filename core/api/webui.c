/* webui: the dashboard's files in memory; see webui.h. */
#include "api/webui.h"

#include <dirent.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crypto.h"

#define MAX_FILES 64
#define MAX_BYTES (8u << 20) /* all of them together */
#define MAX_DEPTH 3

static const struct {
    const char *ext;
    const char *type;
} types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
    {".json", "application/json"},
    {".txt", "text/plain; charset=utf-8"},
    {".md", "text/plain; charset=utf-8"},
};

static const char *type_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof(types) / sizeof(types[0]); i++)
        if (strcmp(dot, types[i].ext) == 0) return types[i].type;
    return NULL;
}

/* The directory: configured, installed, or the source tree's. */
static void find_dir(const char *configured, char *out, size_t cap)
{
    if (configured && *configured) {
        snprintf(out, cap, "%s", configured);
        return;
    }
    char exe[4096], probe[4700];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        snprintf(out, cap, "%s/../share/moongate/webui", dirname(exe));
        snprintf(probe, sizeof(probe), "%s/index.html", out);
        if (access(probe, R_OK) == 0) return;
    }
#ifdef MG_SOURCE_DIR
    snprintf(out, cap, "%s/webui", MG_SOURCE_DIR);
#else
    snprintf(out, cap, "webui");
#endif
}

typedef struct loader_s {
    mg_webui_t *w;
    size_t bytes;
    char *err;
    size_t cap;
} loader_t;

static int read_one(loader_t *l, const char *full, const char *rel, const char *type, size_t size)
{
    if (l->w->n >= MAX_FILES || l->bytes + size > MAX_BYTES) {
        snprintf(l->err, l->cap, "%s: more than %d files or %u bytes", l->w->dir, MAX_FILES,
                 MAX_BYTES);
        return -1;
    }
    FILE *f = fopen(full, "rb");
    char *data = malloc(size ? size : 1);
    char *path = strdup(rel);
    if (!f || !data || !path || fread(data, 1, size, f) != size) {
        snprintf(l->err, l->cap, "%s: cannot read", full);
        if (f) fclose(f);
        free(data);
        free(path);
        return -1;
    }
    fclose(f);
    mg_webui_file_t *wf = &l->w->files[l->w->n++];
    char digest[65];
    mg_sha256_hex(data, size, digest);
    *wf = (mg_webui_file_t){.path = path, .data = data, .len = size, .type = type};
    snprintf(wf->etag, sizeof(wf->etag), "\"%.16s\"", digest);
    l->bytes += size;
    return 0;
}

/* Every servable file below dir/rel (dot files skipped), depth-bounded. */
static int walk(loader_t *l, const char *rel, int depth)
{
    char dir[1200];
    snprintf(dir, sizeof(dir), "%s%s%s", l->w->dir, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(l->err, l->cap, "%s: cannot open the directory", dir);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char full[1500], sub[600];
        struct stat st;
        snprintf(full, sizeof(full), "%s/%s", dir, e->d_name);
        snprintf(sub, sizeof(sub), "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        if (stat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) rc = walk(l, sub, depth + 1);
        else if (S_ISREG(st.st_mode) && type_of(e->d_name))
            rc = read_one(l, full, sub, type_of(e->d_name), (size_t)st.st_size);
    }
    closedir(d);
    return rc;
}

int mg_webui_load(mg_webui_t *w, const char *configured_dir, char *err, size_t cap)
{
    memset(w, 0, sizeof(*w));
    find_dir(configured_dir, w->dir, sizeof(w->dir));
    w->files = calloc(MAX_FILES, sizeof(*w->files));
    loader_t l = {w, 0, err, cap};
    if (!w->files) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    int rc = walk(&l, "", 0);
    if (rc == 0 && !mg_webui_find(w, "index.html")) {
        snprintf(err, cap, "%s: no index.html", w->dir);
        rc = -1;
    }
    if (rc != 0) {
        char keep[sizeof(w->dir)];
        memcpy(keep, w->dir, sizeof(keep));
        mg_webui_free(w);
        memcpy(w->dir, keep, sizeof(keep)); /* for the log line */
    }
    return rc;
}

const mg_webui_file_t *mg_webui_find(const mg_webui_t *w, const char *rel)
{
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->files[i].path, rel) == 0) return &w->files[i];
    return NULL;
}

void mg_webui_free(mg_webui_t *w)
{
    for (size_t i = 0; i < w->n; i++) {
        free(w->files[i].path);
        free(w->files[i].data);
    }
    free(w->files);
    memset(w, 0, sizeof(*w));
}
