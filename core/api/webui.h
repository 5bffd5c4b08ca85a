/* webui: the dashboard's static files (webui/: HTML, the page's script and style, the
 * vendored Alpine.js and Chart.js with their licences), read into memory once at start-up
 * so that serving them never touches the disk on the loop thread.
 *
 * Where they are: dashboard.dir when the config names it; else
 * <executable's directory>/../share/moongate/webui when it holds index.html (an installed
 * tree); else the source tree's webui/ (a build run from its checkout). Files are served
 * under /api/dashboard/<their path below that directory>, index.html as /api/dashboard. */
#ifndef MG_API_WEBUI_H
#define MG_API_WEBUI_H

#include <stddef.h>

typedef struct mg_webui_file_s {
    char *path; /* owned: relative, "index.html", "vendor/alpine.min.js" */
    char *data; /* owned */
    size_t len;
    const char *type; /* static: its Content-Type */
    char etag[24];    /* "\"<16 hex of its SHA-256>\"" */
} mg_webui_file_t;

typedef struct mg_webui_s {
    mg_webui_file_t *files; /* owned */
    size_t n;
    char dir[512]; /* where they were read from */
} mg_webui_t;

/* Read the files (blocking: start-up only). 0, or -1 with the reason in err (no index.html
 * in the directory, too many or too large files, a read error); w is then empty. */
int mg_webui_load(mg_webui_t *w, const char *configured_dir, char *err, size_t cap);
/* The file at rel (no leading '/'), or NULL. */
const mg_webui_file_t *mg_webui_find(const mg_webui_t *w, const char *rel);
void mg_webui_free(mg_webui_t *w);

#endif
