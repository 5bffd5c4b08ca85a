-- policies/routing.lua: which upstream routes a request tries, and in what order.
--
-- The core calls route(req, candidates) for every request once the logical model is known
-- (attempt 1), and again (attempt 2, 3, ...) after it waited because this policy asked it to.
-- It tries the entries of the plan one after the other: a failure before the first byte
-- reached the client (connect error, 429, 5xx, garbage) moves on to the next entry, up to
-- upstream.max_retries attempts in all. The core itself skips an entry whose provider is at
-- its rpm_limit / tpm_limit, so this file never has to count requests.
--
-- It receives (full field list in lua/README.md):
--   req         request_id, endpoint, model, stream, max_tokens, created, priority ("P0".."P4"),
--               pool (X-Sidecar-Pool: "main" | "fallback" | nil, the pool to start from),
--               pin (a provider id the client insisted on, or nil), local_only,
--               allow_smaller_model, allow_cloud, local_first, attempt,
--               random (a number in [0,1) drawn by the core for this request)
--   candidates  one fresh table per route of the model in config/moongate.yaml: index,
--               provider, model, pool, local (write c["local"]), smaller, priority, weight,
--               available (enabled, not "down", breaker lets a request through),
--               cooling + cooldown_remaining_ms, headroom (0..1 of the RPM limit left),
--               in_flight, success_rate + avail_samples, ttft_ms + ttft_samples, load, ...
--
-- It returns a plan, one of:
--   { c1, c2, ... }   the candidate tables to try, in order. An entry may carry
--                     degraded = "fallback" | "smaller" | "cloud" | "emergency" (the client
--                     then sees X-Sidecar-Degraded: <value>) and emergency = true (the core lets
--                     it through at 10% of its rpm_limit although it is cooling down).
--   { wait_ms = N }   nothing good now, but a main provider is back within N ms: the core waits
--                     (at most the queue timeout) and calls route() again.
--   {}                nothing can serve: the client gets 503 MODEL_UNAVAILABLE + Retry-After.
--
-- Default behaviour, rule by rule, in the order applied (each rule is one function below):
--   1. pinning     req.pin: only that provider's routes, never another provider; {} if none of
--                  them is usable right now.
--   2. local_only  req.local_only: never a route with local == false.
--   3. smaller     routes marked `smaller: true` only with req.allow_smaller_model; they come
--                  after the full-size routes and say degraded = "smaller".
--   4. cloud       routes with local == false only when req.allow_cloud (default true); when
--                  local routes exist they say degraded = "cloud" (local ones go first, or
--                  none of them was usable).
--   5. local first req.local_first (default true): local routes before cloud routes.
--   6. priority    the route's `priority` group, lower first.
--   7. pools       the start pool (req.pool, default "main") before the other one. In the main
--                  pool a weighted random order, weight = headroom * weight, drawn from
--                  req.random; in the fallback pool the least busy (in_flight) first.
--                  Fallback routes say degraded = "fallback" (unless the client asked to start
--                  there).
--   8. adaptive    within one group (same locality, size, priority and pool), routes with
--                  at least 5 availability samples or 3 TTFT samples go first, better success
--                  rate first, then lower time to first token; routes without enough samples
--                  follow in the order of rule 7. One request in 20 (req.random < 0.05)
--                  skips this rule, so every route keeps getting some traffic (exploration).
--   9. chain       (Sidecar ADR 3.7) a usable route in the start pool: the plan is every
--                  usable route, ordered as above. Otherwise a start-pool route that stops
--                  cooling within 10 s: { wait_ms }. Otherwise the usable routes of the other
--                  pool. Otherwise emergency: the one cooling route with the shortest
--                  remaining cooldown. Otherwise {}.
-- "Usable" means available and not cooling. Cooldown is a state, not a place: a cooling main
-- route stays a main route and comes back on its own.
--
-- To change it, edit this file and send SIGHUP (kill -HUP <pid>). The new file is loaded and
-- selftest() run before it is used; if either fails the reload is rejected, nothing changes,
-- and the reason is logged and shown in /status. For example:
--   * no exploration:             set EXPLORE_ONE_IN = 0;
--   * wait longer for main:       raise RECOVERY_WAIT_MS;
--   * prefer idle local engines:  in share(), divide by (1 + c.load.waiting) when c.load is set;
--   * batch work never degrades:  in route(), return {} when req.priority == "P4" and the
--                                 plan's first entry has a degraded value.
-- Keep it a pure function of its arguments: no I/O, no global state, no math.random or
-- os.time (random_sequence below derives all the numbers it needs from req.random);
-- moongate.log() is there for debugging.

local M = { name = "routing", version = 1 }

-- Tunables.
local RECOVERY_WAIT_MS = 10000 -- wait for a start-pool route that is back within this long
local ADAPTIVE_MIN_AVAIL = 5 -- availability samples that make success_rate count
local ADAPTIVE_MIN_TTFT = 3 -- TTFT samples that make ttft_ms count
local EXPLORE_ONE_IN = 20 -- 1 request in N ignores rule 8 (0 = never)
local RATE_STEP = 0.05 -- success rates within the same 5-point step count as equal
local TTFT_STEP = 1.1 -- TTFTs within the same 10% step count as equal

------------------------------------------------------------------------------------------------
-- Small helpers
------------------------------------------------------------------------------------------------

local function is_local(c)
    return c["local"] == true
end

-- usable: the route could take this request now.
local function is_usable(c)
    return c.available ~= false and not c.cooling
end

local function filter(list, keep)
    local out = {}
    for _, c in ipairs(list) do
        if keep(c) then
            out[#out + 1] = c
        end
    end
    return out
end

local function copy_list(list)
    return filter(list, function()
        return true
    end)
end

local function any(list, pred)
    for _, c in ipairs(list) do
        if pred(c) then
            return true
        end
    end
    return false
end

local function by_index(a, b)
    return a.index < b.index
end

-- pool_of(c), start_pool(req): "fallback" or "main" (anything else counts as main).
local function pool_of(c)
    return c.pool == "fallback" and "fallback" or "main"
end

local function start_pool(req)
    return req.pool == "fallback" and "fallback" or "main"
end

-- request_random(req): req.random, or 0 when it is missing or outside [0,1).
local function request_random(req)
    local r = tonumber(req.random) or 0
    if r ~= r or r < 0 or r >= 1 then
        return 0
    end
    return r
end

------------------------------------------------------------------------------------------------
-- Rules 1-4: which routes may serve this request at all
------------------------------------------------------------------------------------------------

-- Rule 1: a pinned request sees only its provider's routes.
local function apply_pin(req, list)
    if req.pin == nil then
        return list
    end
    return filter(list, function(c)
        return c.provider == req.pin
    end)
end

-- Rule 2: local_only is a hard data-policy constraint.
local function apply_local_only(req, list)
    if not req.local_only then
        return list
    end
    return filter(list, is_local)
end

-- Rule 3: a smaller model only when the client accepts one.
local function apply_smaller(req, list)
    if req.allow_smaller_model then
        return list
    end
    return filter(list, function(c)
        return not c.smaller
    end)
end

-- Rule 4: cloud routes only when the data policy allows them.
local function apply_cloud(req, list)
    if req.allow_cloud ~= false then
        return list
    end
    return filter(list, is_local)
end

local function eligible(req, candidates)
    -- one pass over the candidates with rules 1-4 (the apply_* functions above say
    -- the same thing one rule at a time; this is the hot path of every request)
    local out, n = {}, 0
    local pin, local_only = req.pin, req.local_only
    local allow_smaller, allow_cloud = req.allow_smaller_model, req.allow_cloud ~= false
    for _, c in ipairs(candidates) do
        local loc = is_local(c)
        if (pin == nil or c.provider == pin) and (loc or (not local_only and allow_cloud))
            and (allow_smaller or not c.smaller) then
            n = n + 1
            out[n] = c
        end
    end
    for i = 2, n do -- the core passes them in index order; sort only if someone did not
        if out[i].index < out[i - 1].index then
            table.sort(out, by_index)
            break
        end
    end
    return out
end

------------------------------------------------------------------------------------------------
-- Rules 5-7: groups, and the order inside a group
------------------------------------------------------------------------------------------------

-- Rule 5: local before cloud (0 first).
local function locality_rank(req, c)
    if req.local_first ~= false and not is_local(c) then
        return 1
    end
    return 0
end

-- Rule 3 again: full-size before smaller (0 first).
local function size_rank(c)
    return c.smaller and 1 or 0
end

-- Rule 6: the route's priority group, lower first.
local function priority_rank(c)
    return tonumber(c.priority) or 0
end

-- Rule 7: the start pool first.
local function pool_rank(req, c)
    return pool_of(c) == start_pool(req) and 0 or 1
end

-- group_key(req, c): routes with equal keys form one group; groups are tried in key order.
local function group_key(req, c)
    return { locality_rank(req, c), size_rank(c), priority_rank(c), pool_rank(req, c) }
end

local function key_less(a, b)
    for i = 1, #a do
        if a[i] ~= b[i] then
            return a[i] < b[i]
        end
    end
    return false
end

-- Rule 7, main pool: the share of a route is its weight times its RPM headroom.
local function share(c)
    local s = (tonumber(c.weight) or 1) * (tonumber(c.headroom) or 1)
    return s > 0 and s or 0
end

-- draw_one(left, u): the position in `left` that u in [0,1) falls on, each route covering a
-- stretch proportional to its share. All shares 0: the first route.
local function draw_one(left, u)
    local total = 0
    for _, c in ipairs(left) do
        total = total + share(c)
    end
    if total <= 0 then
        return 1
    end
    local x, pick = u * total, 1
    for i, c in ipairs(left) do
        if share(c) > 0 then
            pick = i -- the last route with a share, should rounding leave x >= 0
            x = x - share(c)
            if x < 0 then
                break
            end
        end
    end
    return pick
end

-- Rule 7, main pool: weighted random order without replacement.
local function main_pool_order(group, rand)
    -- the first pick is one weighted draw (exact shares); the rest follow in a
    -- weighted random order too, drawn all at once (Efraimidis-Spirakis keys:
    -- u^(1/share), largest first), so a group of n costs n log n, not n^2
    local first = draw_one(group, rand())
    local rest, keys = {}, {}
    for i, c in ipairs(group) do
        if i ~= first then
            local w = share(c)
            rest[#rest + 1] = c
            keys[c] = w > 0 and rand() ^ (1 / w) or -1
        end
    end
    table.sort(rest, function(a, b)
        if keys[a] ~= keys[b] then
            return keys[a] > keys[b]
        end
        return a.index < b.index
    end)
    table.insert(rest, 1, group[first])
    return rest
end

-- Rule 7, fallback pool: least in_flight first, then configured order.
local function fallback_pool_order(group)
    local out = copy_list(group)
    table.sort(out, function(a, b)
        local fa, fb = a.in_flight or 0, b.in_flight or 0
        if fa ~= fb then
            return fa < fb
        end
        return a.index < b.index
    end)
    return out
end

------------------------------------------------------------------------------------------------
-- Rule 8: adaptive preference with exploration
------------------------------------------------------------------------------------------------

-- The request explores when req.random falls in the lowest 1/EXPLORE_ONE_IN of [0,1).
local EXPLORE_CUT = EXPLORE_ONE_IN > 0 and 1 / EXPLORE_ONE_IN or 0

local function exploring(req)
    return request_random(req) < EXPLORE_CUT
end

local function has_enough_samples(c)
    return (c.avail_samples or 0) >= ADAPTIVE_MIN_AVAIL
        or (c.ttft_samples or 0) >= ADAPTIVE_MIN_TTFT
end

-- score(c): success-rate step (higher is better) and TTFT step (lower is better), from the
-- success_rate and ttft_ms the core reports. No success_rate yet counts as no failure seen;
-- no ttft_ms yet (no success seen) as slowest.
local function score(c)
    local rate = c.success_rate or 1
    local rate_step = math.floor(rate / RATE_STEP + 0.5) -- nearest step: 0.99 is with 1.0
    local ttft_step = math.huge
    if c.ttft_ms then
        ttft_step = math.floor(math.log(math.max(c.ttft_ms, 1)) / math.log(TTFT_STEP) + 0.5)
    end
    return rate_step, ttft_step
end

-- adaptive_order(group): routes with enough samples first, best score first; ties and routes
-- without enough samples keep their rule-7 position.
local function adaptive_order(group)
    local pos = {}
    for i, c in ipairs(group) do
        pos[c] = i
    end
    local out = copy_list(group)
    table.sort(out, function(a, b)
        local sa, sb = has_enough_samples(a), has_enough_samples(b)
        if sa ~= sb then
            return sa
        end
        if sa then
            local ra, ta = score(a)
            local rb, tb = score(b)
            if ra ~= rb then
                return ra > rb
            end
            if ta ~= tb then
                return ta < tb
            end
        end
        return pos[a] < pos[b]
    end)
    return out
end

------------------------------------------------------------------------------------------------
-- Putting rules 5-8 together
------------------------------------------------------------------------------------------------

-- random_sequence(req): a function that returns a number in [0,1) at each call, all derived
-- from req.random, so one request always gets the same order. The first is req.random itself,
-- stretched back over [0,1) inside its part (exploring or not), so the top pick follows the
-- shares exactly; the next ones come from a splitmix64 generator seeded with it.
local function random_sequence(req)
    local r = request_random(req)
    local first = r < EXPLORE_CUT and r / EXPLORE_CUT or (r - EXPLORE_CUT) / (1 - EXPLORE_CUT)
    local state = math.floor(r * 2 ^ 53)
    return function()
        if first then
            local u = first
            first = nil
            return u
        end
        state = state + 0x9E3779B97F4A7C15
        local z = state
        z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ~ (z >> 27)) * 0x94D049BB133111EB
        z = z ~ (z >> 31)
        return (z >> 11) * 2.0 ^ -53
    end
end

-- order(req, list): rules 5-8 applied to `list`; returns a new list.
-- Rules 5-7 folded into one number: smaller ranks sort first.
local function group_rank(req, c)
    local rank = locality_rank(req, c)
    rank = rank * 2 + size_rank(c)
    rank = rank * 100000 + priority_rank(c)
    return rank * 2 + pool_rank(req, c)
end

-- Adaptive ordering needs every route of the group to have enough samples: ranking a
-- measured route above an unmeasured one would starve the unmeasured one of the very
-- traffic that would measure it.
local function needs_adaptive(group)
    for _, c in ipairs(group) do
        if not has_enough_samples(c) then
            return false
        end
    end
    return true
end

local function order(req, list)
    if #list == 1 then
        return { list[1] }
    end
    local groups, ranks = {}, {}
    for _, c in ipairs(list) do
        local rank = group_rank(req, c)
        local g = groups[rank]
        if not g then
            g = {}
            groups[rank] = g
            ranks[#ranks + 1] = rank
        end
        g[#g + 1] = c
    end
    table.sort(ranks)
    local rand, explore, out = random_sequence(req), exploring(req), {}
    for _, rank in ipairs(ranks) do
        local group = groups[rank]
        if #group > 1 then
            if pool_of(group[1]) == "main" then
                group = main_pool_order(group, rand)
            else
                group = fallback_pool_order(group)
            end
            if not explore and needs_adaptive(group) then
                group = adaptive_order(group)
            end
        end
        for _, c in ipairs(group) do
            out[#out + 1] = c
        end
    end
    return out
end

------------------------------------------------------------------------------------------------
-- Degraded markers (rules 3, 4, 7)
------------------------------------------------------------------------------------------------

-- cloud_is_degradation(req, list): a cloud route stands in for local ones that exist and are
-- tried first (local_first) or cannot serve now.
local function cloud_is_degradation(req, list)
    local locals = filter(list, is_local)
    return #locals > 0 and (req.local_first ~= false or not any(locals, is_usable))
end

-- One value per entry; the most telling one wins: data leaving the machine, then a smaller
-- model, then the fallback pool.
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

local function mark(req, plan, all)
    local cloud_degraded = cloud_is_degradation(req, all)
    for _, c in ipairs(plan) do
        c.degraded = degradation(req, c, cloud_degraded)
        c.emergency = nil
    end
    return plan
end

------------------------------------------------------------------------------------------------
-- Rule 9: the degradation chain (Sidecar ADR 3.7)
------------------------------------------------------------------------------------------------

-- cooling_routes(list, pool): available routes that are cooling, in `pool` (nil = any),
-- shortest remaining cooldown first.
local function cooling_routes(list, pool)
    local out = filter(list, function(c)
        return c.available ~= false and c.cooling and (pool == nil or pool_of(c) == pool)
    end)
    table.sort(out, function(a, b)
        local ra, rb = a.cooldown_remaining_ms or 0, b.cooldown_remaining_ms or 0
        if ra ~= rb then
            return ra < rb
        end
        return a.index < b.index
    end)
    return out
end

-- recovery_wait(req, list): ms until a start-pool route stops cooling, if within
-- RECOVERY_WAIT_MS; nil otherwise.
local function recovery_wait(req, list)
    local first = cooling_routes(list, start_pool(req))[1]
    if first and (first.cooldown_remaining_ms or 0) <= RECOVERY_WAIT_MS then
        return math.max(first.cooldown_remaining_ms or 0, 1)
    end
    return nil
end

-- emergency(list): the cooling route that is back soonest, let through at 10% of its RPM.
local function emergency(list)
    local c = cooling_routes(list, nil)[1]
    if not c then
        return {}
    end
    c.emergency = true
    c.degraded = "emergency"
    return { c }
end

-- chain(req, list): the plan for the routes that passed rules 1-4.
local function chain(req, list)
    local usable = filter(list, is_usable)
    local function in_start_pool(c)
        return pool_of(c) == start_pool(req)
    end
    -- 1. a usable route in the start pool: every usable route, best first
    if any(usable, in_start_pool) then
        return mark(req, order(req, usable), list)
    end
    -- 2. the start pool is back soon: wait for it rather than degrade
    local wait_ms = recovery_wait(req, list)
    if wait_ms then
        return { wait_ms = wait_ms }
    end
    -- 3. the other pool
    if #usable > 0 then
        return mark(req, order(req, usable), list)
    end
    -- 4. emergency, or {} when nothing is even cooling
    return emergency(list)
end

-- A pinned request gets its provider's usable routes and nothing else: no waiting, no
-- emergency, no other provider. The client chose it, so only "smaller" is a degradation.
local function pinned_plan(req, list)
    local plan = order(req, filter(list, is_usable))
    for _, c in ipairs(plan) do
        c.degraded = c.smaller and "smaller" or nil
        c.emergency = nil
    end
    return plan
end

function M.route(req, candidates)
    local list = eligible(req, candidates)
    if req.pin ~= nil then
        return pinned_plan(req, list)
    end
    if #list == 1 and is_usable(list[1]) then
        -- the common case, one usable route: the chain would pick it too (rules 5-8
        -- order several routes; there is nothing to order)
        return mark(req, list, list)
    end
    return chain(req, list)
end

------------------------------------------------------------------------------------------------
-- selftest(): run at every load and reload; an error() here rejects the reload.
------------------------------------------------------------------------------------------------

local function selftest_cand(index, provider, pool, extra)
    local c = { index = index, provider = provider, model = provider, pool = pool,
                ["local"] = false, smaller = false, priority = 0, weight = 1, available = true,
                cooling = false, cooldown_remaining_ms = 0, headroom = 1, in_flight = 0,
                avail_samples = 0, ttft_samples = 0 }
    for k, v in pairs(extra or {}) do
        c[k] = v
    end
    return c
end

local function describe_plan(plan)
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
    local cooling = function(ms)
        return { cooling = true, cooldown_remaining_ms = ms }
    end
    local cases = {
        { "main,backup(fallback)", { selftest_cand(1, "main", "main"),
            selftest_cand(2, "backup", "fallback") } },
        { "wait 4000", { selftest_cand(1, "main", "main", cooling(4000)),
            selftest_cand(2, "backup", "fallback") } },
        { "backup(fallback)", { selftest_cand(1, "main", "main", cooling(60000)),
            selftest_cand(2, "backup", "fallback") } },
        { "backup(emergency)", { selftest_cand(1, "main", "main", cooling(60000)),
            selftest_cand(2, "backup", "fallback", cooling(20000)) } },
        { "", { selftest_cand(1, "main", "main", { available = false }) } },
    }
    for _, case in ipairs(cases) do
        local got = describe_plan(M.route(req, case[2]))
        if got ~= case[1] then
            error("routing selftest: expected '" .. case[1] .. "', got '" .. got .. "'", 0)
        end
    end
end

return M
