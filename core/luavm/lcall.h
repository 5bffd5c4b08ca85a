/* lcall: calling into Lua safely, and the small stack helpers every part of luavm uses.
 *
 * Every call into policy or adapter code goes through mg_lcall(): lua_pcall with a message
 * handler that keeps the "file:line:" prefix of the error, so a broken file fails one request
 * (or one reload) with a useful message and never unwinds through C. */
#ifndef MG_LCALL_H
#define MG_LCALL_H

#include <stddef.h>

#include "conf/config.h"

typedef struct lua_State lua_State;

/* lua_pcall(L, nargs, nres) with the message handler; on error the message goes to err and
 * the stack is as before the function and its arguments were pushed. 0 or -1. */
int mg_lcall(lua_State *L, int nargs, int nres, char *err, size_t errlen);

/* An adapter's deliberate refusal of a request (moongate.util.not_for_route /
 * invalid_request raise it as a table { refusal = "...", message = "...", param = "..." }). */
typedef enum {
    MG_LREFUSAL_NONE = 0,      /* a plain error, or none */
    MG_LREFUSAL_NOT_FOR_ROUTE, /* this route cannot serve the request; another may */
    MG_LREFUSAL_INVALID,       /* the request itself is invalid: no route is to be tried */
} mg_lrefusal_kind_t;

typedef struct {
    mg_lrefusal_kind_t kind;
    char param[128]; /* the request field the refusal names ("" = none) */
} mg_lrefusal_t;

/* mg_lcall that also reads a refusal: on error *r says which kind (NONE for an ordinary
 * error) and the refusal's message goes to err. r may be NULL. */
int mg_lcall_refusal(lua_State *L, int nargs, int nres, char *err, size_t errlen, mg_lrefusal_t *r);

/* Push the field `name` of the table in the registry at ref (a module table); returns its
 * Lua type. */
int mg_lpush_field(lua_State *L, int ref, const char *name);

/* Set field k of the table on top of the stack. */
void mg_lset_int(lua_State *L, const char *k, long long v);
void mg_lset_num(lua_State *L, const char *k, double v);
void mg_lset_bool(lua_State *L, const char *k, int v);
void mg_lset_str(lua_State *L, const char *k, const char *v);
void mg_lset_nil(lua_State *L, const char *k);

/* Push a provider's config as the table adapters' check() and cooldown's on_response() get:
 * id, adapter, base_url, api_key (when set), pool, rpm_limit, tpm_limit, weight, local. */
void mg_lpush_provider(lua_State *L, const mg_provider_conf_t *p);

#endif
