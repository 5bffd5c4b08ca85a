-- policies/routing.lua: which upstream routes a request tries, and in what order.
--
-- The core calls route(req, candidates) once per request, after the logical model name has
-- been resolved, and tries the routes it returns one after the other: a route that fails
-- before the first byte reached the client (connect error, 429, 5xx, garbage) moves on to the
-- next one, up to upstream.max_retries attempts in all.
--
-- It receives:
--   req         the request: request_id, endpoint ("chat" | "completions" | "embeddings"),
--               model (the logical name), stream (bool), max_tokens (number or nil),
--               created (unix seconds)
--   candidates  the routes of that model from config/moongate.yaml, one table each:
--                 index      position in the model's `routes:` list (1, 2, ...)
--                 provider   provider id
--                 model      the upstream model name
--                 pool       "main" or "fallback"
--                 local      true for on-device providers (read it as c["local"])
--                 weight     the provider's weight (default 1)
--                 available  false while the provider is cooling down or at its limits
--                 in_flight  requests running on the provider right now
--
-- It returns: the candidates to try, in order, as a list of the given tables (not copies).
-- An empty list means "nothing can serve this now": the client gets 503 MODEL_UNAVAILABLE.
--
-- Default behaviour: the configured order, skipping unavailable providers.
--
-- To change it, edit route() below and send SIGHUP (kill -HUP <pid>). The new file is
-- loaded and selftest() run before it is used; if either fails, the reload is rejected,
-- nothing changes, and the reason is logged and shown in /status. For example:
--   * main pool before fallback: sort by (c.pool == "fallback"), then by c.index;
--   * least busy first:          sort by c.in_flight, then by c.index;
--   * local only:                also skip candidates where not c["local"].
-- Keep it a pure function: no I/O, no global state; moongate.log() is there for debugging.

local M = { name = "routing", version = 1 }

function M.route(req, candidates)
    local chosen = {}
    for _, c in ipairs(candidates) do
        if c.available ~= false then
            chosen[#chosen + 1] = c
        end
    end
    -- The core passes candidates in configured order; sorting by index keeps that promise even
    -- if it did not. (table.sort is not stable, but indexes are unique.)
    table.sort(chosen, function(a, b)
        return a.index < b.index
    end)
    return chosen
end

-- selftest(): run at every load and reload; an error() here rejects the reload.
function M.selftest()
    local function cand(index, provider, available)
        return { index = index, provider = provider, model = provider, pool = "main",
                 ["local"] = false, weight = 1, available = available, in_flight = 0 }
    end
    local req = { request_id = "selftest", endpoint = "chat", model = "selftest",
                  stream = false, created = 0 }
    local got = M.route(req, {
        cand(1, "first", true),
        cand(2, "cooling", false),
        cand(3, "third", true),
    })
    local names = {}
    for i, c in ipairs(got) do
        names[i] = c.provider
    end
    local s = table.concat(names, ",")
    if s ~= "first,third" then
        error("routing selftest: expected first,third, got " .. s)
    end
end

return M
