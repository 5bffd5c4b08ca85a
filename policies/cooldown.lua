-- policies/cooldown.lua: how long a provider rests after it said "too many requests".
--
-- The core calls on_response(provider, status, headers, state) after the response headers of
-- an upstream answer arrived, when the status is >= 400, and on the first success after a
-- cooldown (state.observing = true). It returns nil (no cooldown) or { cooldown_s = N }: the
-- provider is then cooling for N seconds. While cooling it stays in its pool; the routing
-- policy sees cooling = true and cooldown_remaining_ms and decides whether to wait for it, go
-- to the fallback pool, or use it as the emergency route at 10% of its RPM.
--
-- It receives:
--   provider  the provider's config: id, pool, rpm_limit, tpm_limit, weight, local, ...
--   status    the upstream's HTTP status (429, 500, 200, ...)
--   headers   the upstream's response headers, names in lower case: headers["retry-after"]
--   state     { consecutive_429 = n (counting this answer when it is a 429),
--               observing = true when this is the first answer after a cooldown ended }
--
-- Default behaviour (Sidecar ADR 3.5):
--   * a 429 cools the provider for backoff(consecutive_429) seconds: 30, 60, 120, 240, 480,
--     then 600 at most; if the upstream's Retry-After (seconds) or retry-after-ms asks for
--     longer, that wins. An HTTP-date Retry-After is ignored (no clock here): backoff applies.
--   * a 429 on the first request after a cooldown counts on (consecutive_429 was not reset),
--     so the next cooldown is twice as long. The first success after a cooldown makes the core
--     reset the count; nothing to return for it.
--   * any other status: nil. 5xx, timeouts and connect errors feed the circuit breaker
--     instead, whose thresholds are in the config, not in this file.
--
-- To change it, edit this file and send SIGHUP; selftest() must pass for the reload to be
-- taken. For example:
--   * a gentler curve:               BASE_S = 10, MAX_S = 300;
--   * distrust huge Retry-After:     return math.min(..., 3600) in on_response;
--   * cool down on 503 as well:      treat status == 503 like 429 in on_response.
-- Keep it a pure function of its arguments: no I/O, no clock, no global state.

local M = { name = "cooldown", version = 1 }

local BASE_S = 30 -- cooldown after the first 429
local MAX_S = 600 -- longest cooldown backoff() gives

-- backoff(consecutive): seconds of cooldown after the n-th 429 in a row (n >= 1).
function M.backoff(consecutive)
    local n = math.max(tonumber(consecutive) or 1, 1)
    return math.floor(math.min(BASE_S * 2 ^ (n - 1), MAX_S))
end

-- seconds(v): a non-negative number of seconds from a header value, rounded up; nil for
-- anything else (an HTTP-date, garbage).
local function seconds(v)
    local n = tonumber(type(v) == "string" and v:match("^%s*(.-)%s*$") or v)
    if n == nil or n ~= n or n < 0 or n == math.huge then
        return nil
    end
    return math.ceil(n)
end

-- retry_after_s(headers): what the upstream asked for, in whole seconds, or nil.
-- Retry-After is delta-seconds; retry-after-ms (OpenAI) is milliseconds.
local function retry_after_s(headers)
    if type(headers) ~= "table" then
        return nil
    end
    local s = seconds(headers["retry-after"])
    local ms = seconds(headers["retry-after-ms"])
    if ms then
        ms = math.ceil(ms / 1000)
    end
    if s and ms then
        return math.max(s, ms)
    end
    return s or ms
end

function M.on_response(provider, status, headers, state)
    if status ~= 429 then
        return nil
    end
    local n = state and state.consecutive_429 or 1
    local cooldown = M.backoff(n)
    local asked = retry_after_s(headers)
    if asked and asked > cooldown then
        cooldown = asked
    end
    return { cooldown_s = cooldown }
end

-- selftest(): run at every load and reload; an error() here rejects the reload.
function M.selftest()
    local want = { 30, 60, 120, 240, 480, 600, 600 }
    for n, s in ipairs(want) do
        if M.backoff(n) ~= s then
            error("cooldown selftest: backoff(" .. n .. ") = " .. tostring(M.backoff(n))
                  .. ", expected " .. s, 0)
        end
    end
    local p = { id = "selftest", pool = "main" }
    local r = M.on_response(p, 429, { ["retry-after"] = "90" }, { consecutive_429 = 1 })
    if not r or r.cooldown_s ~= 90 then
        error("cooldown selftest: a 429 with Retry-After: 90 must cool for 90 s", 0)
    end
    if M.on_response(p, 200, {}, { consecutive_429 = 0, observing = true }) ~= nil then
        error("cooldown selftest: a 200 must not cool a provider down", 0)
    end
end

return M
