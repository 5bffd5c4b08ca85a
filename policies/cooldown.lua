-- policies/cooldown.lua: how long a provider rests after it said "too many requests".
--
-- The core calls on_response(provider, status, headers, state) once for every attempt whose
-- upstream answered with a status of 400 or more, when the attempt ends (a success is never
-- passed here). It returns nil (no cooldown) or { cooldown_s = N }: the provider is then
-- cooling for N seconds. While cooling it stays in its pool; the routing policy sees
-- cooling = true and cooldown_remaining_ms and decides whether to wait for it, go to the
-- fallback pool, or use it as the emergency route at 10% of its RPM.
--
-- It receives:
--   provider  the provider's config: id, pool, rpm_limit, tpm_limit, weight, local, ...
--   status    the upstream's HTTP status (429, 500, 503, ...)
--   headers   every response header of that answer, names in lower case:
--             headers["retry-after"], headers["x-ratelimit-reset-requests"], ...
--   state     { consecutive_429 = n (counting this answer when it is a 429),
--               observing = true when this is the first answer after a cooldown ended }
--
-- Default behaviour (Sidecar ADR 3.5):
--   * a 429 cools the provider for backoff(consecutive_429) seconds: 30, 60, 120, 240, 480,
--     then 600 at most. If the upstream asks for longer, that wins: Retry-After (seconds),
--     retry-after-ms, or the reset time of a rate-limit window it says is used up
--     (x-ratelimit-reset-requests / -tokens, as "20ms", "1s", "6m0s", when the matching
--     x-ratelimit-remaining-* is 0 or not given). An HTTP-date Retry-After is ignored (no
--     clock here): backoff applies.
--   * a 429 on the first request after a cooldown counts on (consecutive_429 was not reset),
--     so the next cooldown is twice as long. The first success after a cooldown makes the core
--     reset the count.
--   * any other status: nil. 5xx, timeouts and connect errors feed the circuit breaker
--     instead, whose thresholds are in the config, not in this file.
--
-- To change it, edit this file and send SIGHUP; selftest() must pass for the reload to be
-- taken. For example:
--   * a gentler curve:               BASE_S = 10 (10, 20, 40, ... s; MAX_S caps it);
--   * distrust huge Retry-After:     return math.min(..., 3600) in on_response;
--   * cool down on 503 as well:      COOLS = { [429] = true, [503] = true }.
-- Keep it a pure function of its arguments: no I/O, no clock, no global state.

local M = { name = "cooldown", version = 1 }

local BASE_S = 30 -- cooldown after the first 429
local MAX_S = 600 -- longest cooldown backoff() gives
local COOLS = { [429] = true } -- the statuses that cool a provider down

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

-- duration_s(v): whole seconds (rounded up) of a duration such as "20ms", "1s", "6m0s",
-- "1h2m3.5s" or a plain number of seconds; nil for anything else.
local UNIT_S = { h = 3600, m = 60, s = 1, ms = 0.001 }
local function duration_s(v)
    if type(v) ~= "string" then
        return nil
    end
    v = v:match("^%s*(.-)%s*$")
    if v:match("^[%d.]+$") then
        return seconds(v)
    end
    local total, rest = 0, v
    while rest ~= "" do
        local n, unit, after = rest:match("^([%d.]+)(%a+)(.*)$")
        if not n or not UNIT_S[unit] or not tonumber(n) then
            return nil
        end
        total, rest = total + tonumber(n) * UNIT_S[unit], after
    end
    return v ~= "" and math.ceil(total) or nil
end

-- reset_s(headers, window): when a rate-limit window ("requests" or "tokens") the upstream
-- says is used up resets, in whole seconds, or nil.
local function reset_s(headers, window)
    local left = tonumber(headers["x-ratelimit-remaining-" .. window])
    if left and left > 0 then
        return nil
    end
    return duration_s(headers["x-ratelimit-reset-" .. window])
end

-- asked_s(headers): the longest wait the upstream asked for, in whole seconds, or nil.
-- Retry-After is delta-seconds; retry-after-ms (OpenAI) is milliseconds.
local function asked_s(headers)
    if type(headers) ~= "table" then
        return nil
    end
    local ms = seconds(headers["retry-after-ms"])
    local asks = { seconds(headers["retry-after"]), ms and math.ceil(ms / 1000),
                   reset_s(headers, "requests"), reset_s(headers, "tokens") }
    local most
    for i = 1, 4 do
        if asks[i] and (not most or asks[i] > most) then
            most = asks[i]
        end
    end
    return most
end

function M.on_response(provider, status, headers, state)
    if not COOLS[status] then
        return nil
    end
    local n = state and state.consecutive_429 or 1
    local cooldown = M.backoff(n)
    local asked = asked_s(headers)
    if asked and asked > cooldown then
        cooldown = asked
    end
    return { cooldown_s = cooldown }
end

-- selftest(): run at every load and reload; an error() here rejects the reload. It checks
-- the shape of the rules, not the numbers above, so a tuned curve still passes.
function M.selftest()
    local last = 0
    for n = 1, 30 do
        local s = M.backoff(n)
        if s < last or s > MAX_S or (n == 1 and s ~= math.min(BASE_S, MAX_S)) then
            error("cooldown selftest: backoff(" .. n .. ") = " .. tostring(s) .. " does not rise"
                  .. " from BASE_S to MAX_S", 0)
        end
        last = s
    end
    if last ~= MAX_S then
        error("cooldown selftest: backoff never reaches MAX_S", 0)
    end
    local p = { id = "selftest", pool = "main" }
    local asked = tostring(MAX_S + 90)
    local r = M.on_response(p, 429, { ["retry-after"] = asked }, { consecutive_429 = 1 })
    if not r or r.cooldown_s ~= MAX_S + 90 then
        error("cooldown selftest: a 429 with Retry-After: " .. asked .. " must cool for " .. asked
              .. " s", 0)
    end
    if M.on_response(p, 200, {}, { consecutive_429 = 0, observing = true }) ~= nil then
        error("cooldown selftest: a 200 must not cool a provider down", 0)
    end
end

return M
