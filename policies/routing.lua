-- policies/routing.lua: which upstream routes a request tries, and in what order.
--
-- The core calls route(req, candidates) when a request has a slot to run in, and again
-- (req.attempt = 2, 3, ...) after a wait this file asked for or when every entry of a plan
-- failed. It tries the entries one after the other: a failure before the first byte reached
-- the client (connect error, 429, 5xx, garbage) moves on to the next entry, up to
-- upstream.max_retries attempts in all. The core itself skips an entry whose provider is at
-- its rpm_limit / tpm_limit, so this file never counts requests. Every field of req and of
-- the candidates is described in lua/README.md.
--
-- It returns a plan, one of:
--   { c1, c2, ... }   candidates to try, in order (a new list). An entry may say
--                     degraded = "fallback" | "smaller" | "cloud" | "emergency" (the client
--                     then sees X-Sidecar-Degraded) and emergency = true (let through at 10%
--                     of its rpm_limit although it is cooling down).
--   { wait_ms = N }   nothing good now, but a main route is back within N ms: the core waits
--                     (at most the queue timeout) and asks again.
--   {}                nothing can serve: the client gets 503 MODEL_UNAVAILABLE.
--
-- The rules, in the order they apply (one function each below):
--   1. pinning     req.pin: only that provider's routes, nothing else; {} if none is usable.
--   2. local_only  req.local_only: never a route with local = false.
--   3. smaller     routes marked smaller only with req.allow_smaller_model; they come after
--                  the full-size ones and say degraded = "smaller".
--   4. cloud       routes with local = false only when req.allow_cloud (default true); when
--                  local routes exist they say degraded = "cloud".
--   5. local first req.local_first (default true): local routes before cloud routes.
--   6. priority    the route's priority group, lower first.
--   7. pools       the start pool (req.pool, default "main") before the other one. In the
--                  main pool a weighted random order, weight = weight * headroom; in the
--                  fallback pool the least busy (in_flight, plus the engine's own waiting
--                  requests) first. Fallback routes say degraded = "fallback" unless the
--                  client asked to start there.
--   7b. load       the engine's own signals (c.load, read by the load probes) prefer the
--                  idle engine: its share is multiplied by M.load_factor(c.load).
--   8. adaptive    in a group whose routes all have 5 availability or 3 TTFT samples, the
--                  better success rate first (5-point steps), then the lower time to first
--                  token (10% steps); ties keep rule 7's order. One request in 20 skips this
--                  rule (exploration), so every route keeps getting measured.
--   8b. trial      a route whose provider is down by passive health but whose one trial
--                  request is due (c.trial; one per health.retry_down_ms) goes first in its
--                  group: that request is how it comes back when no probe can tell.
--   9. chain       (Sidecar ADR 3.7) a usable route in the start pool: every usable route,
--                  ordered as above. Otherwise a start-pool route back within 10 s: wait.
--                  Otherwise the usable routes of the other pool. Otherwise the cooling route
--                  back soonest, as emergency. Otherwise {}.
-- "Usable" means available and not cooling. Cooldown is a state, not a place: a cooling main
-- route stays a main route and comes back on its own.
--
-- To change it, edit this file and send SIGHUP (kill -HUP <pid>); the new file is loaded and
-- selftest() run first, and if either fails nothing changes. For example:
--   * no exploration:             EXPLORE_ONE_IN = 0;
--   * wait longer for main:       raise RECOVERY_WAIT_MS;
--   * ignore the engines' load:   make M.load_factor return 1;
--   * batch work never degrades:  in route(), return {} for req.priority == "P4" when the
--                                 plan's first entry says degraded.
-- Keep it a pure function of its arguments (no I/O, no clock, no state kept between calls):
-- the core then keeps its answers and calls it only when something it read has changed.
-- All randomness comes from moongate.draw(req) (never math.random).

local moongate = require("moongate")

local M = { name = "routing", version = 1 }

local RECOVERY_WAIT_MS = 10000 -- wait for a start-pool route back within this long
local ADAPTIVE_MIN_AVAIL = 5 -- availability samples that make success_rate count
local ADAPTIVE_MIN_TTFT = 3 -- TTFT samples that make ttft_ms count
local EXPLORE_ONE_IN = 20 -- 1 request in N ignores rule 8 (0 = never)
local RATE_STEP = 0.05 -- success rates within the same 5-point step count as equal
local TTFT_STEP = 1.1 -- TTFTs within the same 10% step count as equal

local function is_local(c)
    return c["local"] == true
end

local function pool_of(c)
    return c.pool == "fallback" and "fallback" or "main"
end

local function start_pool(req)
    return req.pool == "fallback" and "fallback" or "main"
end

local function usable(c)
    return c.available ~= false and not c.cooling
end

-- Rules 1-4: may route c serve this request at all?
local function allowed(req, c)
    if req.pin ~= nil and c.provider ~= req.pin then
        return false -- 1. pinned to another provider
    elseif req.local_only and not is_local(c) then
        return false -- 2. the data must not leave this machine
    elseif c.smaller and not req.allow_smaller_model then
        return false -- 3. a smaller model the client did not accept
    elseif req.allow_cloud == false and not is_local(c) then
        return false -- 4. the data policy keeps it off cloud providers
    end
    return true
end

-- Rules 5-7 as one number: routes with the same rank form a group, lower ranks first.
local function group_rank(req, c)
    local cloud = (req.local_first ~= false and not is_local(c)) and 1 or 0 -- 5
    local smaller = c.smaller and 1 or 0 -- 3: full-size before smaller
    local other_pool = pool_of(c) == start_pool(req) and 0 or 1 -- 7
    return ((cloud * 2 + smaller) * 100000 + (tonumber(c.priority) or 0)) * 2 + other_pool -- 6
end

-- Rule 7b: what the engine itself says of its load (c.load: vLLM /metrics, llama.cpp /slots,
-- Ollama /api/ps, Triton's metrics port), as a factor of its share: 1 for an idle engine,
-- 1 / (1 + running + 2 * waiting) for a busy one (a queued request costs more than a running
-- one: it waits for all of them), halved again when its KV cache is over 90% full (new
-- requests will preempt). 1 when the engine reports nothing.
function M.load_factor(load)
    if type(load) ~= "table" then return 1 end
    local running, waiting = tonumber(load.running) or 0, tonumber(load.waiting) or 0
    local f = 1 / (1 + math.max(running, 0) + 2 * math.max(waiting, 0))
    if (tonumber(load.kv_cache) or 0) > 0.9 then f = f / 2 end
    return f
end

-- Rule 7, main pool: a route's share of the traffic.
local function share(c)
    local s = (tonumber(c.weight) or 1) * (tonumber(c.headroom) or 1) * M.load_factor(c.load)
    return s > 0 and s or 0
end

-- Rule 7, fallback pool: how busy a route is: requests in flight through us, plus what the
-- engine says it runs and queues for others.
local function busy(c)
    local load = c.load
    if type(load) ~= "table" then return c.in_flight or 0 end
    return (c.in_flight or 0) + (tonumber(load.waiting) or 0) + (tonumber(load.running) or 0) / 1000
end

-- Rule 8: a route's preference as one number, smaller first, or nil while it has too few
-- samples. The success-rate step counts before the TTFT step (a TTFT step stays below 2^20,
-- so rate_step * 2^21 keeps them apart); no success_rate yet counts as no failure seen, no
-- ttft_ms yet as the slowest.
local LOG_TTFT_STEP = math.log(TTFT_STEP)
local SLOWEST_TTFT_STEP = 2 ^ 20 - 1

function M.adaptive_key(success_rate, avail_samples, ttft_ms, ttft_samples)
    if (avail_samples or 0) < ADAPTIVE_MIN_AVAIL and (ttft_samples or 0) < ADAPTIVE_MIN_TTFT then
        return nil
    end
    local rate_step = ((success_rate or 1) / RATE_STEP + 0.5) // 1 -- 0.99 is with 1.0
    local ttft_step = SLOWEST_TTFT_STEP
    if ttft_ms then
        ttft_step = math.min((math.log(math.max(ttft_ms, 1)) / LOG_TTFT_STEP + 0.5) // 1,
                             SLOWEST_TTFT_STEP)
    end
    return ttft_step - rate_step * 2 ^ 21
end

local function rank(c)
    return M.adaptive_key(c.success_rate, c.avail_samples, c.ttft_ms, c.ttft_samples)
end

-- Whether test(x) holds for some x of list.
local function any(list, test)
    for _, x in ipairs(list) do
        if test(x) then
            return true
        end
    end
    return false
end

local function is_trial(c)
    return c.trial == true
end

-- Rules 7 and 8 inside one group, at most `limit` entries (nil: all). moongate orders by
-- rank first only when every route of the group has one: ranking the measured routes first
-- would starve an unmeasured one of the traffic that measures it. Rule 8b: trials first.
local function order_group(group, draw, explore, limit)
    local by = not explore and rank or nil
    if #group == 1 then
        return group
    elseif any(group, is_trial) then
        local plan, rest = {}, {}
        for _, c in ipairs(group) do
            table.insert(is_trial(c) and plan or rest, c)
        end
        for _, c in ipairs(#rest > 0 and order_group(rest, draw, explore) or {}) do
            plan[#plan + 1] = c
        end
        for i = #plan, (limit or #plan) + 1, -1 do
            plan[i] = nil
        end
        return plan
    elseif pool_of(group[1]) == "main" then
        return moongate.weighted_order(group, share, draw, by, limit)
    end
    local order = moongate.sort_by(moongate.sort_by(group, busy), by)
    for i = #order, (limit or #order) + 1, -1 do
        order[i] = nil
    end
    return order
end

-- The groups of rules 5-7, in the order they are tried.
local function groups_of(req, list)
    local by_rank, ranks = {}, {}
    for _, c in ipairs(list) do
        local r = group_rank(req, c)
        if not by_rank[r] then
            by_rank[r] = {}
            ranks[#ranks + 1] = r
        end
        table.insert(by_rank[r], c)
    end
    table.sort(ranks)
    local groups = {}
    for i, r in ipairs(ranks) do
        groups[i] = by_rank[r]
    end
    return groups
end

-- Rules 5-8: the usable routes in the order to try them, at most req.plan_limit of them (the
-- core asks again should they all fail).
local function order(req, list)
    if #list <= 1 then
        return { list[1] }
    end
    local groups = groups_of(req, list)
    -- rule 8's exploration, drawn only when some group has a choice to make
    local draw = moongate.draw(req)
    local explore = EXPLORE_ONE_IN > 0 and any(groups, function(g) return #g > 1 end)
        and draw:chance(1 / EXPLORE_ONE_IN)
    if #groups == 1 then
        return order_group(groups[1], draw, explore, req.plan_limit)
    end
    local plan, limit = {}, req.plan_limit or #list
    for _, group in ipairs(groups) do
        for _, c in ipairs(order_group(group, draw, explore)) do
            if #plan == limit then
                return plan
            end
            plan[#plan + 1] = c
        end
    end
    return plan
end

-- The degraded marks (rules 3, 4, 7): the most telling one wins.
local function degradation(req, c, cloud_degraded)
    if not is_local(c) and cloud_degraded then
        return "cloud"
    elseif c.smaller then
        return "smaller"
    elseif pool_of(c) == "fallback" and start_pool(req) == "main" then
        return "fallback"
    end
    return nil
end

local function mark(req, plan, cloud_degraded)
    for _, c in ipairs(plan) do
        c.degraded = degradation(req, c, cloud_degraded)
    end
    return plan
end

-- The available routes that are cooling, in `pool` (nil: any), back soonest first.
local function cooling(list, pool)
    local out = {}
    for _, c in ipairs(list) do
        if c.available ~= false and c.cooling and (pool == nil or pool_of(c) == pool) then
            out[#out + 1] = c
        end
    end
    return moongate.sort_by(out, function(c)
        return c.cooldown_remaining_ms or 0
    end)
end

function M.route(req, candidates)
    local eligible, ok = {}, {} -- the routes rules 1-4 let through; the usable ones of them
    for _, c in ipairs(candidates) do
        if allowed(req, c) then
            eligible[#eligible + 1] = c
            if usable(c) then
                ok[#ok + 1] = c
            end
        end
    end
    -- A pinned request gets its provider's usable routes and nothing else; the client chose
    -- it, so only a smaller model is a degradation.
    if req.pin ~= nil then
        local plan = order(req, ok)
        for _, c in ipairs(plan) do
            c.degraded = c.smaller and "smaller" or nil
        end
        return plan
    end
    -- A cloud route stands in for local ones that exist and come first or cannot serve.
    local cloud_degraded = any(eligible, is_local) and (req.local_first ~= false or not any(ok, is_local))
    -- 9. the degradation chain
    if any(ok, function(c) return pool_of(c) == start_pool(req) end) then
        return mark(req, order(req, ok), cloud_degraded)
    end
    local back = cooling(eligible, start_pool(req))[1]
    if back and (back.cooldown_remaining_ms or 0) <= RECOVERY_WAIT_MS then
        return { wait_ms = math.max(back.cooldown_remaining_ms or 0, 1) }
    end
    if #ok > 0 then
        return mark(req, order(req, ok), cloud_degraded)
    end
    local emergency = cooling(eligible, nil)[1]
    if not emergency then
        return {}
    end
    emergency.degraded, emergency.emergency = "emergency", true
    return { emergency }
end

------------------------------------------------------------------------------------------------
-- selftest(): run at every load and reload; an error() here rejects the reload.
------------------------------------------------------------------------------------------------

local function candidate(index, provider, pool, extra)
    local c = { index = index, provider = provider, model = provider, pool = pool,
                ["local"] = false, smaller = false, priority = 0, weight = 1, available = true,
                cooling = false, cooldown_remaining_ms = 0, headroom = 1, in_flight = 0,
                avail_samples = 0, ttft_samples = 0 }
    for k, v in pairs(extra or {}) do
        c[k] = v
    end
    return c
end

local function describe(plan)
    if plan.wait_ms then
        return "wait " .. plan.wait_ms
    end
    local parts = {}
    for i, c in ipairs(plan) do
        parts[i] = c.provider .. (c.degraded and ("(" .. c.degraded .. ")") or "")
    end
    return table.concat(parts, ",")
end

function M.selftest()
    local req = { request_id = "selftest", endpoint = "chat", model = "selftest", stream = false,
                  created = 0, random = 0.5, attempt = 1, local_first = true, allow_cloud = true }
    local function cooling_for(ms)
        return { cooling = true, cooldown_remaining_ms = ms }
    end
    local cases = {
        { "main,backup(fallback)", { candidate(1, "main", "main"),
            candidate(2, "backup", "fallback") } },
        { "wait 4000", { candidate(1, "main", "main", cooling_for(4000)),
            candidate(2, "backup", "fallback") } },
        { "backup(fallback)", { candidate(1, "main", "main", cooling_for(60000)),
            candidate(2, "backup", "fallback") } },
        { "backup(emergency)", { candidate(1, "main", "main", cooling_for(60000)),
            candidate(2, "backup", "fallback", cooling_for(20000)) } },
        { "", { candidate(1, "main", "main", { available = false }) } },
        { "down,main", { candidate(1, "main", "main"),
            candidate(2, "down", "main", { health = "down", trial = true }) } },
    }
    for _, case in ipairs(cases) do
        local got = describe(M.route(req, case[2]))
        if got ~= case[1] then
            error("routing selftest: expected '" .. case[1] .. "', got '" .. got .. "'", 0)
        end
    end
end

return M
