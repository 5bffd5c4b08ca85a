/* main: the command line and the process.
 *
 *   moongate [-c FILE]            run the gateway (FILE or $MOONGATE_CONFIG or config/moongate.yaml)
 *   moongate --check [-c FILE]    validate config, policies and adapters; exit 0 or 1
 *   moongate --help | --version */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "luavm.h"
#include "server.h"

#define DEFAULT_CONFIG "config/moongate.yaml"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moongate [options]\n"
            "\n"
            "A self-hosted AI gateway: an OpenAI-compatible API in front of model back-ends,\n"
            "with routing, adapters and policies in hot-reloadable Lua.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE   configuration file (default: $MOONGATE_CONFIG, else %s)\n"
            "      --check         validate the configuration, policies and adapters, then exit\n"
            "                      (0 = valid; otherwise FILE:LINE: reason on stderr, exit 1)\n"
            "  -h, --help          show this help\n"
            "      --version       print the version\n"
            "\n"
            "signals: SIGHUP reloads config, policies and adapters without dropping requests;\n"
            "SIGTERM/SIGINT stop accepting, let requests in flight finish, then exit.\n",
            DEFAULT_CONFIG);
}

static int check_config(const char *path)
{
    char err[1024];
    mg_gen_t *g = NULL;
    if (mg_gen_load(path, 1, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("%s: ok (%zu providers, %zu models)\n", path, g->cfg->n_providers, g->cfg->n_models);
    mg_gen_unref(g);
    return 0;
}

int main(int argc, char **argv)
{
    const char *config = getenv("MOONGATE_CONFIG");
    int check = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0) && i + 1 < argc) {
            config = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            config = a + 9;
        } else if (strcmp(a, "--check") == 0) {
            check = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("moongate 0.1.0\n");
            return 0;
        } else {
            fprintf(stderr, "moongate: unknown argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!config || !*config) config = DEFAULT_CONFIG;
    if (check) return check_config(config);

    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "moongate: libcurl initialisation failed\n");
        return 1;
    }
    uv_loop_t *loop = uv_default_loop();
    mg_server_t server;
    if (mg_server_init(&server, loop, config) != 0) return 1;
    int rc = mg_server_run(&server);
    uv_loop_close(loop);
    curl_global_cleanup();
    return rc;
}
