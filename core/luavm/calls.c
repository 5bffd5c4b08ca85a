/* calls: the calls into policies and adapters a request makes: route(), on_response(),
 * encode(), decode(), decode_event(); and the two an upstream model list makes (list_models(),
 * decode_models(): route/upmodels.h). See luavm.h and lua/README.md for the contract.
 *
 * route() and encode() go through the keep (keep.h): an answer that holds for this request is
 * given without calling Lua, and an answer Lua gives is recorded (trace.h) and kept when it
 * may be. The decoders are called every time: their input is the upstream's answer. */
#include "luavm/luavm.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "luavm/keep.h"
#include "luavm/lcall.h"
#include "luavm/trace.h"
#include "upstream/headers.h"

/* ------------------------------------------------------------------------ */
/* route                                                                     */
/* ------------------------------------------------------------------------ */

/* Read the plan route() returned (on top of the stack) into plan, and its entries into items
 * (room for n_items) for the trace: returns wait_ms as the plan said it. */
static int read_plan(mg_gen_t *g, int n, mg_plan_t *plan, mg_titem_t *items, int n_items)
{
    lua_State *L = g->L;
    int wait_ms = 0;
    lua_getfield(L, -1, "wait_ms");
    if (lua_isnumber(L, -1)) {
        double w = lua_tonumber(L, -1);
        wait_ms = w < 1 ? 1 : w > 3600000 ? 3600000 : (int)w;
    }
    lua_pop(L, 1);
    unsigned char small[256];
    unsigned char *seen = n <= (int)sizeof(small) ? small : calloc((size_t)n, 1);
    if (seen == small) memset(small, 0, sizeof(small));
    for (int i = 0; i < n_items; i++) {
        lua_rawgeti(L, -1, (lua_Integer)i + 1);
        int pos = mg_trace_plan_item(g->trace, n, &items[i]);
        lua_pop(L, 1);
        if (pos < 0 || !seen || seen[pos] || plan->n >= n) continue;
        seen[pos] = 1;
        plan->entries[plan->n++] = (mg_plan_entry_t){pos, items[i].degraded, items[i].emergency};
    }
    if (seen != small) free(seen);
    plan->wait_ms = plan->n > 0 ? 0 : wait_ms;
    return wait_ms;
}

/* routing.route(req, candidates) itself, recorded when keepable. */
static int route_call(mg_gen_t *g, int req_ref, const mg_treq_t *rq, const mg_candidate_t *cands,
                      int n, const long *slots, int keepable, mg_plan_t *plan, char *err,
                      size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    lua_checkstack(L, 8);
    mg_lpush_field(L, g->routing_ref, "route");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    mg_lset_int(L, "attempt", rq->attempt);
    if (rq->plan_limit > 0) mg_lset_int(L, "plan_limit", rq->plan_limit);
    else if (rq->attempt > 1) mg_lset_nil(L, "plan_limit"); /* the request's fill cleared it */
    lua_pop(L, 1);
    mg_trace_begin_route(g->trace, rq, req_ref, cands, n, slots, keepable);
    if (mg_lcall(L, 2, 1, err, errlen) != 0) {
        mg_trace_end(g->trace, 1, 0, 0, NULL, 0, NULL);
        lua_settop(L, top);
        return -1;
    }
    if (!lua_istable(L, -1)) {
        mg_trace_end(g->trace, 1, 0, 0, NULL, 0, NULL);
        lua_settop(L, top);
        snprintf(err, errlen, "routing.route must return a plan (a list, {wait_ms = N} or {})");
        return -1;
    }
    int n_items = (int)lua_rawlen(L, -1);
    mg_titem_t small[16];
    mg_titem_t *items = n_items <= 16 ? small : malloc((size_t)n_items * sizeof(*items));
    if (!items) {
        mg_trace_end(g->trace, 1, 0, 0, NULL, 0, NULL);
        lua_settop(L, top);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int wait_ms = read_plan(g, n, plan, items, n_items);
    mg_tentry_t *e = mg_trace_end(g->trace, 0, 1, wait_ms, items, n_items, NULL);
    if (e) mg_keep_plan_put(g->keep, L, slots, n, e);
    if (items != small) free(items);
    lua_settop(L, top);
    return 0;
}

int mg_gen_route(mg_gen_t *g, const mg_lua_req_t *info, int *req_ref, int attempt,
                 const mg_candidate_t *cands, int n, mg_plan_t *plan, char *err, size_t errlen)
{
    plan->n = plan->wait_ms = plan->kept = 0;
    mg_treq_t rq = {info, attempt, plan->limit > 0 ? plan->limit : 0};
    long *slots = mg_keep_slots_scratch(g->keep, n > 0 ? n : 1);
    int keepable =
        slots && mg_keep_slots_of(g->keep, cands, n, slots) && g->routing_cache && !plan->fresh;
    if (keepable && mg_keep_plan_find(g->keep, g->trace, &rq, cands, n, slots, plan)) {
        plan->kept = 1;
        return 0;
    }
    int req = mg_gen_req_table(g, info, req_ref);
    return route_call(g, req, &rq, cands, n, slots, keepable, plan, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* on_response                                                               */
/* ------------------------------------------------------------------------ */

/* The default curve when no cooldown policy is loaded: 30 s doubling, at most 600 s. */
static double default_backoff(int n)
{
    double s = 30;
    for (int i = 1; i < n && s < 600; i++) s *= 2;
    return s > 600 ? 600 : s;
}

/* The headers table of on_response: every pair of the block, names lower case; a name that
 * comes twice gets its values joined with ", " (as HTTP allows). */
static void push_headers(lua_State *L, const char *block, size_t len)
{
    lua_createtable(L, 0, 8);
    size_t pos = 0;
    const char *name, *value;
    while (mg_headers_next(block, len, &pos, &name, &value)) {
        if (lua_getfield(L, -1, name) == LUA_TSTRING) {
            lua_pushliteral(L, ", ");
            lua_pushstring(L, value);
            lua_concat(L, 3);
        } else {
            lua_pop(L, 1);
            lua_pushstring(L, value);
        }
        lua_setfield(L, -2, name);
    }
}

int mg_gen_cooldown(mg_gen_t *g, const mg_provider_conf_t *p, int status, const char *headers,
                    size_t headers_len, int consecutive_429, int observing, double *cooldown_s,
                    char *err, size_t errlen)
{
    *cooldown_s = 0;
    if (g->cooldown_ref == LUA_NOREF) {
        if (status == 429) {
            const char *retry_after = mg_headers_find(headers, headers_len, "retry-after");
            double ra = retry_after ? atof(retry_after) : 0;
            double b = default_backoff(consecutive_429);
            *cooldown_s = ra > b ? ra : b;
        }
        return 0;
    }
    lua_State *L = g->L;
    int top = lua_gettop(L);
    lua_checkstack(L, 8);
    mg_lpush_field(L, g->cooldown_ref, "on_response");
    mg_lpush_provider(L, p);
    lua_pushinteger(L, status);
    push_headers(L, headers, headers_len);
    lua_createtable(L, 0, 2);
    mg_lset_int(L, "consecutive_429", consecutive_429);
    mg_lset_bool(L, "observing", observing);
    if (mg_lcall(L, 4, 1, err, errlen) != 0) return -1;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "cooldown_s");
        double v = lua_tonumber(L, -1);
        *cooldown_s = v > 0 ? (v > 86400 ? 86400 : v) : 0;
    }
    lua_settop(L, top);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* encode                                                                    */
/* ------------------------------------------------------------------------ */

static void push_route(lua_State *L, const mg_provider_conf_t *p, const char *model)
{
    lua_createtable(L, 0, 6);
    mg_lset_str(L, "provider", p->id);
    if (model) mg_lset_str(L, "model", model);
    mg_lset_str(L, "base_url", p->base_url);
    if (p->api_key) mg_lset_str(L, "api_key", p->api_key);
    mg_lset_str(L, "pool", p->pool);
    mg_lset_bool(L, "local", p->local);
}

/* Read the headers table at the top of the stack into a curl list. */
static int read_headers(lua_State *L, struct curl_slist **list, char *err, size_t errlen)
{
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) != LUA_TSTRING || !lua_isstring(L, -1)) {
            lua_pop(L, 2);
            snprintf(err, errlen, "encode: headers must map names to strings");
            return -1;
        }
        const char *name = lua_tostring(L, -2);
        const char *value = lua_tostring(L, -1);
        if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n")) {
            lua_pop(L, 2);
            snprintf(err, errlen, "encode: header '%s' contains a forbidden character", name);
            return -1;
        }
        size_t len = strlen(name) + strlen(value) + 3;
        char *line = malloc(len);
        if (!line) {
            lua_pop(L, 2);
            return -1;
        }
        snprintf(line, len, "%s: %s", name, value);
        struct curl_slist *nl = curl_slist_append(*list, line);
        free(line);
        if (!nl) {
            lua_pop(L, 2);
            return -1;
        }
        *list = nl;
        lua_pop(L, 1);
    }
    return 0;
}

/* adapter.encode(req, route) itself; with rq, req is the request's view (trace.h), and the
 * caller ends the trace. */
static int encode_call(mg_gen_t *g, int adapter, int req_ref, const mg_treq_t *rq,
                       const mg_provider_conf_t *p, const char *upstream_model, mg_encoded_t *out,
                       char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    memset(out, 0, sizeof(*out));
    lua_checkstack(L, 8);
    mg_lpush_field(L, g->adapters[adapter].ref, "encode");
    if (rq) mg_trace_begin_encode(g->trace, rq, req_ref);
    else lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_route(L, p, upstream_model);
    mg_lrefusal_t refusal;
    if (mg_lcall_refusal(L, 2, 1, err, errlen, &refusal) != 0) {
        out->refusal = refusal;
        return -1;
    }
    if (!lua_istable(L, -1)) {
        snprintf(err, errlen, "%s.encode must return a table", g->adapters[adapter].name);
        goto fail;
    }
    lua_getfield(L, -1, "method");
    const char *method = lua_isstring(L, -1) ? lua_tostring(L, -1) : "POST";
    if (strcmp(method, "POST") != 0 && strcmp(method, "GET") != 0) {
        snprintf(err, errlen, "%s.encode: method must be POST or GET", g->adapters[adapter].name);
        goto fail;
    }
    snprintf(out->method, sizeof(out->method), "%s", method);
    lua_pop(L, 1);
    if (lua_getfield(L, -1, "path") != LUA_TSTRING) {
        snprintf(err, errlen, "%s.encode: path must be a string", g->adapters[adapter].name);
        goto fail;
    }
    out->path = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    int t = lua_getfield(L, -1, "headers");
    if (t == LUA_TTABLE && read_headers(L, &out->headers, err, errlen) != 0) goto fail;
    lua_pop(L, 1);
    t = lua_getfield(L, -1, "body");
    if (t != LUA_TNIL) {
        out->body = mg_ljson_to(L, &g->json, -1, err, errlen);
        if (!out->body) goto fail;
    }
    lua_pop(L, 1);
    lua_getfield(L, -1, "stream_format");
    const char *fmt = lua_tostring(L, -1);
    out->ndjson = fmt && strcmp(fmt, "ndjson") == 0;
    lua_settop(L, top);
    if (!out->path) {
        snprintf(err, errlen, "out of memory");
        mg_encoded_free(out);
        return -1;
    }
    return 0;
fail:
    lua_settop(L, top);
    mg_encoded_free(out);
    return -1;
}

/* The request fields whose answers may not be kept (the attempt's own). */
#define ENCODE_UNKEPT ((1u << RF_ATTEMPT) | (1u << RF_PLAN_LIMIT))

int mg_gen_encode(mg_gen_t *g, int adapter, const mg_lua_req_t *info, int *req_ref,
                  const mg_provider_conf_t *p, const char *upstream_model, mg_encoded_t *out,
                  char *err, size_t errlen)
{
    mg_adapter_t *a = &g->adapters[adapter];
    mg_treq_t rq = {info, 1, 0};
    if (!a->encode_untraced) {
        int found = mg_keep_encode_find(g->keep, adapter, p, upstream_model, &rq, out, err, errlen);
        if (found != 0) return found > 0 ? 0 : -1;
    }
    int req = mg_gen_req_table(g, info, req_ref);
    if (a->encode_untraced)
        return encode_call(g, adapter, req, NULL, p, upstream_model, out, err, errlen);
    int rc = encode_call(g, adapter, req, &rq, p, upstream_model, out, err, errlen);
    uint32_t read;
    mg_trace_end(g->trace, rc != 0, 0, 0, NULL, 0, &read);
    if (rc != 0) return rc;
    if (read == UINT32_MAX) a->encode_untraced = 1; /* it reads the request's own fields */
    else if (!(read & ENCODE_UNKEPT) && !out->body)
        mg_keep_encode_put(g->keep, adapter, p, upstream_model, read, &rq, out);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* decode, decode_event                                                      */
/* ------------------------------------------------------------------------ */

void mg_encoded_free(mg_encoded_t *e)
{
    free(e->path);
    curl_slist_free_all(e->headers);
    cJSON_Delete(e->body);
    mg_lrefusal_t refusal = e->refusal;
    memset(e, 0, sizeof(*e));
    e->refusal = refusal;
}

int mg_gen_decode(mg_gen_t *g, int adapter, int req_ref, const cJSON *resp, cJSON **out, char *err,
                  size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *out = NULL;
    mg_lpush_field(L, g->adapters[adapter].ref, "decode");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    mg_ljson_push(L, &g->json, resp);
    if (mg_lcall(L, 2, 1, err, errlen) != 0) return -1;
    if (lua_istable(L, -1)) *out = mg_ljson_to(L, &g->json, -1, err, errlen);
    else snprintf(err, errlen, "%s.decode must return a table", g->adapters[adapter].name);
    lua_settop(L, top);
    return *out ? 0 : -1;
}

int mg_gen_decode_event(mg_gen_t *g, int adapter, int req_ref, int state_ref, const cJSON *data,
                        cJSON **out, int *done, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *out = NULL;
    mg_lpush_field(L, g->adapters[adapter].ref, "decode_event");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    mg_ljson_push(L, &g->json, data);
    lua_rawgeti(L, LUA_REGISTRYINDEX, state_ref);
    if (mg_lcall(L, 3, 1, err, errlen) != 0) return -1;
    if (lua_isnil(L, -1)) {
        *out = cJSON_CreateArray();
    } else if (lua_istable(L, -1)) {
        /* always an array of chunks, even if the adapter returned a single empty table */
        size_t len = lua_rawlen(L, -1);
        *out = cJSON_CreateArray();
        for (size_t i = 1; *out && i <= len; i++) {
            lua_rawgeti(L, -1, (lua_Integer)i);
            cJSON *chunk = mg_ljson_to(L, &g->json, -1, err, errlen);
            lua_pop(L, 1);
            if (!chunk) {
                cJSON_Delete(*out);
                *out = NULL;
                break;
            }
            cJSON_AddItemToArray(*out, chunk);
        }
    } else {
        snprintf(err, errlen, "%s.decode_event must return a list", g->adapters[adapter].name);
    }
    lua_settop(L, top);
    lua_rawgeti(L, LUA_REGISTRYINDEX, state_ref);
    lua_getfield(L, -1, "done");
    *done = lua_toboolean(L, -1);
    lua_settop(L, top);
    return *out ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* list_models, decode_models                                                */
/* ------------------------------------------------------------------------ */

int mg_gen_models_request(mg_gen_t *g, int adapter, const mg_provider_conf_t *p, mg_encoded_t *out,
                          char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    memset(out, 0, sizeof(*out));
    lua_checkstack(L, 8);
    if (mg_lpush_field(L, g->adapters[adapter].ref, "list_models") != LUA_TFUNCTION) {
        lua_settop(L, top);
        return 1; /* the adapter has no list */
    }
    push_route(L, p, NULL);
    if (mg_lcall(L, 1, 1, err, errlen) != 0) return -1;
    if (lua_isnil(L, -1)) {
        lua_settop(L, top);
        return 1;
    }
    const char *name = g->adapters[adapter].name;
    if (!lua_istable(L, -1) || lua_getfield(L, -1, "path") != LUA_TSTRING) {
        snprintf(err, errlen, "%s.list_models must return nil or {path = ..., headers = ...}",
                 name);
        lua_settop(L, top);
        return -1;
    }
    snprintf(out->method, sizeof(out->method), "GET");
    out->path = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (lua_getfield(L, -1, "headers") == LUA_TTABLE &&
        read_headers(L, &out->headers, err, errlen) != 0) {
        lua_settop(L, top);
        mg_encoded_free(out);
        return -1;
    }
    lua_settop(L, top);
    if (!out->path) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void mg_model_ids_free(char **ids, size_t n)
{
    for (size_t i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
}

/* The list of strings on top of the stack into *ids (others are skipped). 0 or -1. */
static int read_ids(lua_State *L, char ***ids, size_t *n)
{
    size_t len = lua_rawlen(L, -1);
    *ids = calloc(len ? len : 1, sizeof(**ids));
    if (!*ids) return -1;
    for (size_t i = 1; i <= len; i++) {
        lua_rawgeti(L, -1, (lua_Integer)i);
        if (lua_type(L, -1) == LUA_TSTRING && lua_rawlen(L, -1) > 0) {
            if (!((*ids)[*n] = strdup(lua_tostring(L, -1)))) {
                lua_pop(L, 1);
                return -1;
            }
            (*n)++;
        }
        lua_pop(L, 1);
    }
    return 0;
}

int mg_gen_models_decode(mg_gen_t *g, int adapter, const cJSON *resp, char ***ids, size_t *n,
                         char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *ids = NULL;
    *n = 0;
    lua_checkstack(L, 8);
    if (mg_lpush_field(L, g->adapters[adapter].ref, "decode_models") != LUA_TFUNCTION) {
        lua_settop(L, top);
        snprintf(err, errlen, "%s has list_models but no decode_models", g->adapters[adapter].name);
        return -1;
    }
    mg_ljson_push(L, &g->json, resp);
    if (mg_lcall(L, 1, 1, err, errlen) != 0) return -1;
    int rc = 0;
    if (!lua_istable(L, -1)) {
        snprintf(err, errlen, "%s.decode_models must return a list of model ids",
                 g->adapters[adapter].name);
        rc = -1;
    } else if (read_ids(L, ids, n) != 0) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    lua_settop(L, top);
    if (rc != 0) {
        mg_model_ids_free(*ids, *n);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}
