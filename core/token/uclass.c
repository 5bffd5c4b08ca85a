/* uclass: the generated class table (uclass_table.inc, written by scripts/gen-uclass.mjs from
 * the Unicode Character Database) and the version it came from. */
#include "token/uclass.h"

#include "token/uclass_table.inc"

const char *mg_uclass_unicode_version(void)
{
    return UCLASS_UNICODE_VERSION;
}
