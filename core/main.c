/* main: the command line and the process.
 *
 *   moongate [-c FILE]            run the gateway (FILE or $MOONGATE_CONFIG or
 * config/moongate.yaml) moongate --check [-c FILE]    validate config, policies and adapters; exit
 * 0 or 1 moongate keygen               print a fresh MOONGATE_ENCRYPTION_KEY moongate
 * rotate-encryption-key [-c FILE] re-encrypt the stored provider keys from $MOONGATE_ENCRYPTION_KEY
 * to $MOONGATE_NEW_ENCRYPTION_KEY moongate tokenize [--encoding NAME] [--ids] [--special]
 * [--data-dir DIR] count (or list) the tokens of stdin moongate check-ledger [-c FILE] verify the
 * prepaid ledger; exit 0 or 1 moongate --help | --version */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "cluster/migrate.h"
#include "cluster/rotate.h"
#include "conf/config.h"
#include "luavm/luavm.h"
#include "conf/providers.h"
#include "base/secret.h"
#include "server.h"
#include "store/store.h"
#include "obs/usage.h"
#include "store/upkeep.h"
#include "tenancy/wallet.h"
#include "token/encoding.h"
#include "token/tokenize.h"

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
            "commands:\n"
            "  keygen                  print a fresh encryption key for MOONGATE_ENCRYPTION_KEY\n"
            "                          (64 hex characters; provider keys added through the\n"
            "                          admin API are stored AES-256-GCM encrypted with it)\n"
            "  rotate-encryption-key   re-encrypt every stored provider key, in one transaction,\n"
            "                          from MOONGATE_ENCRYPTION_KEY (old) to\n"
            "                          MOONGATE_NEW_ENCRYPTION_KEY (new), in the store named by\n"
            "                          the config; then restart the gateway with the new key\n"
            "  backup DEST             an online, consistent copy of the store named by the\n"
            "                          config into the file DEST, while the gateway serves\n"
            "                          (SQLite's backup API; restore: stop, copy DEST back)\n"
            "  migrate-store --from sqlite:PATH --to postgres:URL [--force]\n"
            "                          move a single node's store into a cluster's PostgreSQL:\n"
            "                          its control plane into control_log, its usage events and\n"
            "                          prepaid wallets into the shared tables (idempotent);\n"
            "                          a non-empty control_log is refused unless --force\n"
            "  check-ledger            verify the prepaid ledger the config names (its store, or\n"
            "                          cluster.postgres when set):\n"
            "                          every wallet equals the sums of its entries, every request\n"
            "                          reserved once and ended at most once; prints each problem,\n"
            "                          exit 0 when consistent, 1 otherwise\n"
            "  tokenize [--encoding o200k_base|cl100k_base] [--ids] [--special] [--data-dir DIR]\n"
            "                          read stdin, print its token count (default o200k_base),\n"
            "                          or with --ids the token ids as one JSON array; --special\n"
            "                          recognises <|endoftext|> and the encoding's other special\n"
            "                          tokens (plain text otherwise); --data-dir names where the\n"
            "                          rank files are (default: as tokenizer.data_dir)\n"
            "\n"
            "signals: SIGHUP reloads config, policies and adapters without dropping requests;\n"
            "SIGTERM/SIGINT stop accepting, let requests in flight finish, then exit;\n"
            "SIGUSR1 reopens log.file (after logrotate moved it).\n",
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

static int keygen(void)
{
    char hex[MG_SECRET_KEY_HEX_LEN + 1];
    if (mg_secret_keygen_hex(hex) != 0) {
        fprintf(stderr, "moongate: the random generator failed\n");
        return 1;
    }
    printf("%s\n", hex);
    return 0;
}

/* moongate backup DEST: an online copy of the config's store, taken while the gateway runs. */
static int backup_store(const char *config, const char *dest)
{
    char err[1024];
    mg_config_t *cfg = NULL;
    if (mg_config_load(config, &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s\n", err);
        return 1;
    }
    int rc = mg_store_backup(cfg->storage_path, dest, mg_usage_journal_replay, err, sizeof(err));
    if (rc != 0) fprintf(stderr, "moongate: %s\n", err);
    else printf("backed up %s to %s\n", cfg->storage_path, dest);
    mg_config_free(cfg);
    return rc != 0;
}

/* The check over the books the config names: the cluster's PostgreSQL when configured (the
 * wallets live there), else the store. */
static long check_books(const mg_config_t *cfg, long *wallets, long *entries, char *err,
                        size_t errlen)
{
    long problems = -1;
    if (cfg->cluster.postgres.url) {
        mg_pg_t *pg = NULL;
        if (mg_pg_open(cfg->cluster.postgres.url, 1, 0, &pg, err, errlen) != 0) return -1;
        problems = mg_wallet_check_pg(pg, stdout, wallets, entries, err, errlen);
        mg_pg_close(pg);
        return problems;
    }
    mg_store_t *st = NULL;
    if (mg_store_open(cfg->storage_path, &st, err, errlen) != 0) return -1;
    problems = mg_wallet_check(st, stdout, wallets, entries, err, errlen);
    mg_store_close(st);
    return problems;
}

/* moongate check-ledger: mg_wallet_check over the books named by the config. */
static int check_ledger(const char *path)
{
    char err[1024];
    mg_config_t *cfg = NULL;
    long wallets = 0, entries = 0, problems = -1;
    if (mg_config_load(path, &cfg, err, sizeof(err)) != 0 ||
        (problems = check_books(cfg, &wallets, &entries, err, sizeof(err))) < 0)
        fprintf(stderr, "moongate check-ledger: %s\n", err);
    else if (problems == 0)
        printf("ledger: consistent: %ld wallet(s), %ld entries\n", wallets, entries);
    else
        printf("ledger: %ld problem(s) in %ld wallet(s), %ld entries\n", problems, wallets,
               entries);
    mg_config_free(cfg);
    return problems == 0 ? 0 : 1;
}

static int rotate_encryption_key(const char *path)
{
    char err[1024];
    mg_secret_key_t old_key, new_key;
    mg_config_t *cfg = NULL;
    mg_store_t *st = NULL;
    size_t n = 0;
    int rc = 1;
    if (mg_secret_key_from_env(&old_key, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: old key: %s\n", err);
        return 1;
    }
    const char *nk = getenv("MOONGATE_NEW_ENCRYPTION_KEY");
    if (mg_secret_key_parse_hex(nk ? nk : "", "MOONGATE_NEW_ENCRYPTION_KEY", &new_key, err,
                                sizeof(err)) != 0) {
        fprintf(stderr, "moongate: new key: %s\n", err);
        goto out;
    }
    if (mg_config_load(path, &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s (nothing changed)\n", err);
        goto out;
    }
    int shared = cfg->cluster.postgres.url != NULL; /* the cluster's: through control_log */
    if (shared ? mg_cluster_rotate_providers(cfg->cluster.postgres.url, cfg->cluster.node_id,
                                             &old_key, &new_key, &n, err, sizeof(err)) != 0
               : mg_store_open(cfg->storage_path, &st, err, sizeof(err)) != 0 ||
                     mg_providers_reencrypt(st, &old_key, &new_key, &n, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s (nothing changed)\n", err);
        goto out;
    }
    printf("re-encrypted %zu provider key(s)%s\n", n,
           shared ? " in the cluster's control log; every instance applies them and decrypts"
                    " them with the new key it holds"
                  : "; restart the gateway with MOONGATE_ENCRYPTION_KEY set to the new key");
    rc = 0;
out:
    if (st) mg_store_close(st);
    mg_config_free(cfg);
    mg_secret_key_wipe(&old_key);
    mg_secret_key_wipe(&new_key);
    return rc;
}

/* Read all of stdin into a malloc'd buffer (*len bytes); NULL when memory ran out. */
static char *read_stdin(size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *more = realloc(buf, cap *= 2);
            if (!more) free(buf);
            buf = more;
        }
    }
    *len = n;
    return buf;
}

static int tokenize(int argc, char **argv)
{
    const char *name = "o200k_base", *dir_opt = NULL;
    int ids = 0;
    unsigned flags = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--encoding") == 0 && i + 1 < argc) {
            name = argv[++i];
        } else if (strncmp(argv[i], "--encoding=", 11) == 0) {
            name = argv[i] + 11;
        } else if (strcmp(argv[i], "--data-dir") == 0 && i + 1 < argc) {
            dir_opt = argv[++i];
        } else if (strcmp(argv[i], "--ids") == 0) {
            ids = 1;
        } else if (strcmp(argv[i], "--special") == 0) {
            flags |= MG_TOKENIZE_SPECIAL;
        } else {
            fprintf(stderr, "moongate tokenize: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    int id = mg_encoding_lookup(name);
    if (id < 0) {
        fprintf(stderr, "moongate tokenize: unknown encoding '%s' (o200k_base, cl100k_base)\n",
                name);
        return 2;
    }
    char dir[4096], err[1024];
    mg_encoding_t *e = NULL;
    if (mg_encoding_data_dir(dir_opt, dir, sizeof(dir)) != 0 ||
        mg_encoding_load(id, dir, &e, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate tokenize: %s\n", err);
        return 1;
    }
    size_t len = 0;
    char *text = read_stdin(&len);
    int rc = 1;
    if (!text) {
        fprintf(stderr, "moongate tokenize: out of memory\n");
    } else if (!ids) {
        long n = mg_tokenize_count(e, text, len, flags);
        if (n >= 0) printf("%ld\n", n), rc = 0;
    } else {
        mg_token_ids_t out = {0};
        if (mg_tokenize_encode(e, text, len, flags, &out) == 0) {
            putchar('[');
            for (size_t i = 0; i < out.n; i++) printf(i ? ",%u" : "%u", out.ids[i]);
            printf("]\n");
            rc = 0;
        }
        mg_token_ids_free(&out);
    }
    if (rc && text) fprintf(stderr, "moongate tokenize: out of memory\n");
    free(text);
    mg_encoding_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    const char *config = getenv("MOONGATE_CONFIG");
    int check = 0, rotate = 0, ledger = 0;
    const char *backup = NULL;
    if (argc > 1 && strcmp(argv[1], "keygen") == 0) return argc == 2 ? keygen() : 2;
    if (argc > 1 && strcmp(argv[1], "tokenize") == 0) return tokenize(argc, argv);
    if (argc > 1 && strcmp(argv[1], "migrate-store") == 0)
        return mg_migrate_store_main(argc - 2, argv + 2);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i == 1 && strcmp(a, "rotate-encryption-key") == 0) {
            rotate = 1;
            continue;
        }
        if (i == 1 && strcmp(a, "backup") == 0) {
            if (i + 1 >= argc || argv[i + 1][0] == '-') {
                fprintf(stderr, "moongate: backup needs a destination file\n");
                return 2;
            }
            backup = argv[++i];
            continue;
        }
        if (i == 1 && strcmp(a, "check-ledger") == 0) {
            ledger = 1;
            continue;
        }
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
            printf("moongate %s\n", MOONGATE_VERSION);
            return 0;
        } else {
            fprintf(stderr, "moongate: unknown argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!config || !*config) config = DEFAULT_CONFIG;
    if (check) return check_config(config);
    if (rotate) return rotate_encryption_key(config);
    if (backup) return backup_store(config, backup);
    if (ledger) return check_ledger(config);

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
