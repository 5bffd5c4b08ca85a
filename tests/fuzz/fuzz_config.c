/* fuzz_config: the YAML config loader (core/conf/config.c) on arbitrary bytes.
 *
 * A config file is the operator's, not an attacker's, but a loader that crashes, leaks or
 * reads past its input on a typo is a defect all the same: every input must either parse
 * (and then free cleanly) or fail with a message of the FILE:LINE: reason shape. A failed
 * check traps, so libFuzzer keeps the input. ${NAME} references see a small fixed
 * environment. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    setenv("FUZZ_KEY", "sk-fuzz-0123456789abcdef", 1);
    setenv("FUZZ_EMPTY", "", 1);
    unsetenv("SIDECAR_API_KEY"); /* the V1 provider would mask "no providers" cases */
    unsetenv("SIDECAR_UPSTREAM");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg_config_t *cfg = NULL;
    char err[1024];
    err[0] = '\0';
    int rc = mg_config_parse("f.yaml", (const char *)data, size, &cfg, err, sizeof(err));
    if (rc == 0) {
        if (!cfg || !cfg->listen || !cfg->storage_path) __builtin_trap();
        mg_config_free(cfg);
        return 0;
    }
    if (cfg) __builtin_trap();                            /* a failure hands out nothing */
    if (strncmp(err, "f.yaml", 6) != 0) __builtin_trap(); /* and says where */
    if (!memchr(err, '\0', sizeof(err))) __builtin_trap();
    return 0;
}
