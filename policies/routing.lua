-- policies/routing.lua: which upstream routes a request tries, and in what order.
--
-- The core calls route(req, candidates) for every request once the logical model is known
-- (attempt 1; unless a plan this file marked reuse holds for it, see below), and again
-- (attempt 2, 3, ...) after it waited because this policy asked it to.
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
--               random (a number in [0,1) drawn by the core for this request),
--               plan_limit (the plan entries the core needs before it asks again, or nil:
--               the plan may stop there; should they all fail, route() is called again)
--   candidates  one table per route of the model in config/moongate.yaml, in index order:
--               index, provider, model, pool, local (write c["local"]), smaller, priority,
--               weight, available (enabled, not "down", the provider's and the route's
--               breakers let a request through), breaker, route_breaker,
--               cooling + cooldown_remaining_ms, headroom (0..1 of the RPM limit left),
--               in_flight, success_rate + avail_samples, ttft_ms + ttft_samples, load,
--               adaptive_key (adaptive_key() below of the route's samples, kept by the
--               core; false when it has too few), share (share() below of the candidate,
--               kept by the core), ...
--               The list may say alike = true: every candidate has the same pool, local,
--               smaller, priority and weight; adaptive_keys = the adaptive_key of every
--               candidate, in list order, when every one of them is a number;
--               shares = the share of every candidate, in list order; and all_usable =
--               true: every candidate is available and not cooling.
--
-- The core keeps the candidate tables (and the list) from one request to the next and only
-- rewrites the fields that changed: treat them as read-only. The one exception are the
-- markers below, degraded and emergency, on the entries of the plan you return: the core
-- reads them and clears them, so every call starts with unmarked candidates.
--
-- It returns a plan, one of:
--   { c1, c2, ... }   the candidate tables to try, in order (a new list, never `candidates`).
--                     An entry may carry degraded = "fallback" | "smaller" | "cloud" |
--                     "emergency" (the client then sees X-Sidecar-Degraded: <value>) and
--                     emergency = true (the core lets it through at 10% of its rpm_limit
--                     although it is cooling down). unmarked = true on the list tells the
--                     core that no entry carries either, so it need not look. reuse = true
--                     on the list says the plan holds for every request with the same
--                     routing fields while no candidate's state changes (lua/README.md,
--                     "Plans that hold"): the core then keeps it and calls route() again
--                     only when one of those changes. This file says so when the plan was
--                     decided without a draw or a number that moves (req.random, headroom,
--                     in_flight, samples, cooldown times): one usable route, or one route
--                     per group.
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
--   8. adaptive    within one group (same locality, size, priority and pool) whose routes
--                  all have at least 5 availability samples or 3 TTFT samples: better success
--                  rate first (in 5-point steps), then lower time to first token (in 10%
--                  steps), equal ones in the order of rule 7. While a route of the group has
--                  fewer samples, the whole group keeps the order of rule 7 (ranking the
--                  measured routes first would starve it of the traffic that measures it).
--                  One request in 20 (req.random < 0.05) skips this rule, so every route
--                  keeps getting some traffic (exploration).
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
--   * prefer idle local engines:  in share(), divide by (1 + c.load.waiting) when c.load is set,
--                                 and have same_shares() say false when a route has c.load;
--   * batch work never degrades:  in route(), return {} when req.priority == "P4" and the
--                                 plan's first entry has a degraded value.
-- Keep it a pure function of its arguments: no I/O, no global state, no math.random or
-- os.time (new_rng below derives all the numbers it needs from req.random); moongate.log()
-- is there for debugging.

local M = { name = "routing", version = 1 }

-- Tunables (<const>: compiled into the loops that use them).
local RECOVERY_WAIT_MS <const> = 10000 -- wait for a start-pool route back within this long
local ADAPTIVE_MIN_AVAIL <const> = 5 -- availability samples that make success_rate count
local ADAPTIVE_MIN_TTFT <const> = 3 -- TTFT samples that make ttft_ms count
local EXPLORE_ONE_IN <const> = 20 -- 1 request in N ignores rule 8 (0 = never)
local RATE_STEP <const> = 0.05 -- success rates within the same 5-point step count as equal
local TTFT_STEP <const> = 1.1 -- TTFTs within the same 10% step count as equal

------------------------------------------------------------------------------------------------
-- Small helpers
------------------------------------------------------------------------------------------------

-- This file runs for every request, over every route of the model: at 100 routes every Lua
-- instruction in a loop over the routes counts. Those loops (scan, usable_of, same_shares,
-- adaptive_keys) read each field once, call no function and build no table per route, and
-- the usual request builds no list at all; sorting and weighted draws are the core's
-- (moongate.sort_by and moongate.weighted_order), and so is keeping rule 8's key of each
-- route (c.adaptive_key: see adaptive_key). The per-rule functions say what the loops do,
-- one rule at a time.

local tonumber, floor, log = tonumber, math.floor, math.log

local function is_local(c)
    return c["local"] == true
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
-- Mechanism: sorting and weighted draws
------------------------------------------------------------------------------------------------

-- splitmix64(state): the next state and output of a splitmix64 stream (64-bit integers).
local function splitmix64(state)
    state = state + 0x9E3779B97F4A7C15
    local z = state
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    return state, z ~ (z >> 31)
end

-- sort_by(list, keys): a new list of list's entries by ascending keys[i] (numbers), entries
-- with equal keys in their order in `list`.
local function lua_sort_by(list, keys)
    local pos = {}
    for i = 1, #list do
        pos[i] = i
    end
    table.sort(pos, function(a, b)
        local ka, kb = keys[a], keys[b]
        local na, nb = ka ~= ka, kb ~= kb -- NaN, after every number
        if na ~= nb then
            return nb
        elseif not na and ka ~= kb then
            return ka < kb
        end
        return a < b
    end)
    local out = {}
    for i, p in ipairs(pos) do
        out[i] = list[p]
    end
    return out
end

-- draw_one(weights, total, u): the position that u in [0,1) falls on, each entry covering a
-- stretch proportional to its weight (> 0). No weight at all: the first.
local function draw_one(weights, total, u)
    if total <= 0 then
        return 1
    end
    local x, pick = u * total, 1
    for i = 1, #weights do
        local w = weights[i]
        if w > 0 then
            pick = i -- the last entry with a weight, should rounding leave x >= 0
            x = x - w
            if x < 0 then
                break
            end
        end
    end
    return pick
end

-- shuffle_after(list, first, seed): list[first] first, the others after it in a uniformly
-- random order (a Fisher-Yates shuffle from the splitmix64 stream seeded with `seed`).
local function shuffle_after(list, first, seed)
    local out, n, state, z = { list[first] }, 1, seed, nil
    for i = 1, #list do
        if i ~= first then
            n = n + 1
            out[n] = list[i]
        end
    end
    for i = n, 3, -1 do
        state, z = splitmix64(state)
        local j = 2 + floor((z >> 11) * 2.0 ^ -53 * (i - 1))
        out[i], out[j] = out[j], out[i]
    end
    return out
end

-- weighted_order(list, weights, u, seed, keys): a new list of list's entries in a weighted
-- random order without replacement (weights nil: all 1; a weight <= 0 counts as none). The
-- first is one weighted draw with u (exact shares); the others follow by Efraimidis-Spirakis
-- keys r^(1/w), largest first, computed as -log(r)/w, smallest first (a weighted order drawn
-- all at once, n log n; a log costs half a pow), r from the splitmix64 stream seeded with
-- `seed`, one per entry with a weight but the first; entries
-- without a weight come last, in list order. With equal weights the keys would order like r:
-- the others are shuffled instead (same distribution, no sort). With keys (numbers, one per
-- entry of list; nil: none) the list is ordered by ascending keys first, entries with equal
-- keys in that weighted order: sort_by of the weighted order, in one call. With a limit
-- below the list's length, see lua_weighted_order.
local function draw_order(list, weights, u, seed)
    local keys, total, equal = {}, 0, true
    for i = 1, #list do
        local w = weights and weights[i] or 1
        if not (w > 0) then
            w = 0
        end
        keys[i] = w
        total = total + w
        equal = equal and w > 0 and w == keys[1]
    end
    local first, state, z = draw_one(keys, total, u), seed, nil
    if equal and #list > 1 then
        return shuffle_after(list, first, seed)
    end
    for i = 1, #list do -- sort_by sorts ascending: the first before all, no weight after all
        local w = keys[i]
        if i == first then
            keys[i] = -1
        elseif w > 0 then
            state, z = splitmix64(state)
            local r = (z >> 11) * 2.0 ^ -53
            keys[i] = -log(r) / w
        else
            keys[i] = 0 / 0 -- NaN: after every number, an infinite key (r = 0) too
        end
    end
    return lua_sort_by(list, keys)
end

local function keyed_order(list, weights, u, seed, keys)
    if not keys then
        return draw_order(list, weights, u, seed)
    end
    local pos, by, out = {}, {}, {}
    for i = 1, #list do
        pos[i] = i
    end
    pos = draw_order(pos, weights, u, seed)
    for i, p in ipairs(pos) do
        by[i] = keys[p]
    end
    for i, p in ipairs(lua_sort_by(pos, by)) do
        out[i] = list[p]
    end
    return out
end

-- a < b, NaN after every number (two NaN: neither is less).
local function less_nan_last(a, b)
    if a ~= a then
        return false
    elseif b ~= b then
        return true
    end
    return a < b
end

-- draw_next(n, w, keys, taken, x): the next entry of a limited order (below): the group of
-- the smallest key left, and in it a draw with x in [0,1) over the weights left (none: the
-- first entry left by position; x is not called then).
local function draw_next(n, w, keys, taken, x)
    local first, best, total = nil, 0, 0
    for i = 1, n do
        if not taken[i] then
            local k = keys and keys[i] or 0
            if first == nil or less_nan_last(k, best) then
                first, best, total = i, k, w[i]
            elseif not less_nan_last(best, k) then
                total = total + w[i]
            end
        end
    end
    if not (total > 0) then
        return first
    end
    local pick, left = first, x() * total
    for i = first, n do
        local k = keys and keys[i] or 0
        if not taken[i] and w[i] > 0 and not less_nan_last(k, best)
            and not less_nan_last(best, k) then
            pick = i -- the last with a weight, should rounding leave x >= 0
            left = left - w[i]
            if left < 0 then
                break
            end
        end
    end
    return pick
end

-- With limit < #list: only `limit` entries, drawn one after the other (n * limit steps, no
-- sort, no logarithm): each a draw among the entries left in the group of the smallest key
-- left (no keys: all in one), over their weights, the first draw with u, the next ones
-- with the splitmix64 stream seeded with `seed`; a group with no weight left gives its
-- entries in list order. The same distribution as the first entries of the full order,
-- not the same draws.
local function lua_weighted_order(list, weights, u, seed, keys, limit)
    local n = #list
    if not limit or limit >= n then
        return keyed_order(list, weights, u, seed, keys)
    end
    local w, taken, out, state, drawn = {}, {}, {}, seed, false
    for i = 1, n do
        local x = weights and weights[i] or 1
        w[i] = x > 0 and x or 0
    end
    local function x()
        if not drawn then
            drawn = true
            return u
        end
        local z
        state, z = splitmix64(state)
        return (z >> 11) * 2.0 ^ -53
    end
    for m = 1, limit do
        local i = draw_next(n, w, keys, taken, x)
        taken[i] = true
        out[m] = list[i]
    end
    return out
end

-- The gateway's moongate module does both in C: the same results, at a fraction of the cost
-- (a Lua comparator call per comparison, a dozen instructions per random number). The Lua
-- versions above serve busted and anyone running this file outside the gateway.
local has_core, core = pcall(require, "moongate")
local sort_by = has_core and type(core) == "table" and core.sort_by or lua_sort_by
local weighted_order = has_core and type(core) == "table" and core.weighted_order
    or lua_weighted_order

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

-- eligible(req, candidates): the routes rules 1-4 let through, in index order. Only the
-- chain's later steps need them (waiting, emergency): not the hot path.
local function eligible(req, candidates)
    local list = apply_cloud(req, apply_smaller(req, apply_local_only(req,
        apply_pin(req, candidates))))
    for i = 2, #list do -- the core passes index order; sort only if someone did not
        if list[i].index < list[i - 1].index then
            list = filter(list, function()
                return true
            end)
            table.sort(list, by_index)
            break
        end
    end
    return list
end

-- summarize(req, usable, locals, one_group, like_first, c1, same_weight, full_headroom): the
-- facts scan returns (see there). like_first: every usable route has the locality, size and
-- pool of the first candidate c1, so the facts are c1's. Every field is in the constructor:
-- a field added later costs a table resize.
local function summarize(req, usable, locals, one_group, like_first, c1, same_weight,
                         full_headroom)
    local start_fallback = req.pool == "fallback"
    if like_first and usable[1] ~= nil then
        local loc, fallback = is_local(c1), c1.pool == "fallback"
        return { locals = locals or loc, one_group = one_group, usable_local = loc,
                 usable_cloud = not loc,
                 usable_smaller = req.allow_smaller_model and c1.smaller and true or false,
                 usable_fallback = fallback, start_usable = fallback == start_fallback,
                 same_weight = same_weight, full_headroom = full_headroom }
    end
    local facts = { locals = locals, one_group = one_group, usable_local = false,
                    usable_cloud = false, usable_smaller = false, usable_fallback = false,
                    start_usable = false, same_weight = same_weight,
                    full_headroom = full_headroom }
    for i = 1, #usable do
        local c = usable[i]
        if is_local(c) then
            facts.usable_local = true
        else
            facts.usable_cloud = true
        end
        facts.usable_smaller = facts.usable_smaller or c.smaller and true or false
        local fallback = c.pool == "fallback"
        facts.usable_fallback = facts.usable_fallback or fallback
        facts.start_usable = facts.start_usable or fallback == start_fallback
    end
    facts.locals = locals or facts.usable_local
    return facts
end

-- usable_of(candidates): the usable routes of an alike list (all let through by rules 1-4):
-- `candidates` itself when that is all of them; and whether every one of them has a headroom
-- of 1 (for same_shares). An alike list comes from the core, in index order: unlike scan,
-- this does not check. `not available and available ~= nil` is `available == false` with
-- the usual true settled by a truth test.
local function usable_of(candidates)
    local usable, n, copied, full_headroom = candidates, 0, false, true
    for i = 1, #candidates do
        local c = candidates[i]
        local available = c.available
        if not available and available ~= nil or c.cooling then
            if not copied then -- the first route left out: from here on build the list
                copied = true
                usable = table.move(candidates, 1, n, 1, {})
            end
        else
            n = n + 1
            if copied then
                usable[n] = c
            end
            if full_headroom and c.headroom ~= 1 then
                full_headroom = false
            end
        end
    end
    return usable, full_headroom
end

-- Rules 2-4 for one route (rule 1 is per provider).
local function passes_rules_2_4(req, c)
    local loc = is_local(c)
    return (loc or (req.allow_cloud ~= false and not req.local_only))
        and (req.allow_smaller_model or not c.smaller)
end

-- scan_alike(req, candidates): scan when the core says that every candidate has the same
-- pool, local, smaller, priority and weight (candidates.alike) and the request is not pinned:
-- rules 2-4 then decide for all of them at once, and rules 5-7 see one group, in which
-- every route has the same weight (facts.same_weight).
local function scan_alike(req, candidates)
    local c1 = candidates[1]
    if c1 == nil or not passes_rules_2_4(req, c1) then
        return {}, summarize(req, {}, false, false, false, c1)
    end
    local usable, full_headroom = candidates, false -- (false: not known, see same_shares)
    if not candidates.all_usable then
        usable, full_headroom = usable_of(candidates)
    end
    -- (a weight of 0 or less is no share at all: not the same as equal shares)
    local same_weight = (tonumber(c1.weight) or 1) > 0
    return usable, summarize(req, usable, is_local(c1), true, true, c1, same_weight,
                             full_headroom)
end

-- scan(req, candidates): rules 1-4 in one pass, the hot path of every request (the apply_*
-- functions above say the same one rule at a time). Returns the usable routes among those the
-- rules let through, in index order (`candidates` itself when that is all of them: the usual
-- case, which then builds no list), and facts about them:
--   locals          some route the rules let through is local, usable or not
--   usable_local    some usable route is local; usable_cloud: some is not
--   usable_smaller  some usable route is a smaller model
--   usable_fallback some usable route is in the fallback pool
--   start_usable    some usable route is in the start pool
--   one_group       rules 5-7 see one group (false may still be one: order() finds out)
--   same_weight, full_headroom   (scan_alike only) every usable route has the same weight,
--                   above 0, and a headroom of 1
-- Written for the Lua VM, as usable_of: a truth test before an equality test wherever the
-- usual value lets it skip the latter (== and ~= on anything but a small integer constant
-- cost a function call in the VM).

local function scan(req, candidates)
    local pin, allow_smaller = req.pin, req.allow_smaller_model
    if candidates.alike and pin == nil then
        return scan_alike(req, candidates)
    end
    local pinned = pin ~= nil
    local cloud_ok = req.allow_cloud ~= false and not req.local_only
    local check_locality = req.local_first ~= false -- else rule 5 does not split groups
    local usable, n, copied, sorted, last = candidates, 0, false, true, -math.huge
    local locals, one_group = false, true
    local c1 = candidates[1] or {}
    local loc1, smaller1, priority1, pool1 = c1["local"], c1.smaller, c1.priority, c1.pool
    for i = 1, #candidates do
        local c = candidates[i]
        local loc, smaller = c["local"], c.smaller
        if not cloud_ok and loc ~= true or smaller and not allow_smaller
            or pinned and c.provider ~= pin then
            goto skip -- rules 1-4 leave it out
        end
        do
            local available = c.available
            if not available and available ~= nil or c.cooling then
                if loc == true then
                    locals = true
                end
                goto skip -- not usable
            end
        end
        n = n + 1
        if copied then
            usable[n] = c
        end
        do
            local index = c.index
            if index < last then
                sorted = false
            end
            last = index
        end
        -- one group when every usable route has the first candidate's fields (raw values:
        -- nil against false says two groups, and order() then finds it is one after all)
        if c.pool ~= pool1 or c.priority ~= priority1
            or allow_smaller and not smaller ~= not smaller1
            or check_locality and loc ~= loc1 then
            one_group = false
        end
        goto next
        ::skip::
        if not copied then -- the first route left out: from here on build the list
            copied = true
            usable = table.move(candidates, 1, n, 1, {})
        end
        ::next::
    end
    if not sorted then
        table.sort(usable, by_index)
    end
    one_group = one_group and n > 0
    return usable, summarize(req, usable, locals, one_group, one_group and check_locality, c1)
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

-- group_rank(req, c): rules 5-7 folded into one number, smaller ranks first; routes with
-- equal ranks form one group.
local function group_rank(req, c)
    local rank = locality_rank(req, c)
    rank = rank * 2 + size_rank(c)
    rank = rank * 100000 + priority_rank(c)
    return rank * 2 + pool_rank(req, c)
end

-- Rule 7, main pool: the share of a route is its weight times its RPM headroom. The core
-- calls it too (M.share) when a candidate is made and when its headroom or load changes, and
-- keeps the result in c.share and, for its whole list, in candidates.shares: keep it a
-- function of those two and of the config fields (weight, pool, local, ...).
local function share(c)
    local s = (tonumber(c.weight) or 1) * (tonumber(c.headroom) or 1)
    return s > 0 and s or 0
end
M.share = share

-- same_shares(group, facts): whether share() gives every route of the group the same share,
-- told from the fields it reads without calling it: the same weight and a headroom of 1
-- everywhere, the usual case (scan may have seen that already: facts). Keep it in step with
-- share().
local function same_shares(group, facts)
    if facts and facts.same_weight and facts.full_headroom then
        return true
    end
    for i = 1, #group do
        local c = group[i]
        if c.weight ~= 1 or c.headroom ~= 1 then
            return false
        end
    end
    return true
end

-- shares_of(group, facts): share(c) for each route, or nil when they are all the same
-- (weighted_order then needs no weights). The core's c.share and, when the group is its
-- whole candidates list, candidates.shares are those numbers already.
local function shares_of(group, facts)
    local shares = group.shares -- (the core's weighted_order sees equal ones itself)
    if shares then
        return shares
    end
    if same_shares(group, facts) then
        return nil
    end
    shares = {}
    for i = 1, #group do
        local c = group[i]
        shares[i] = c.share or share(c)
    end
    return shares
end

-- The randomness of one request: req.random first, stretched back over [0,1) inside its part
-- (exploring or not), so that the top pick of the first main group follows the shares
-- exactly; then a splitmix64 stream seeded with req.random. next_random(rng) is the next
-- number in [0,1); next_seed(rng) the next raw 64-bit output, which seeds weighted_order.
local EXPLORE_CUT = EXPLORE_ONE_IN > 0 and 1 / EXPLORE_ONE_IN or 0

local function stretch(r)
    return r < EXPLORE_CUT and r / EXPLORE_CUT or (r - EXPLORE_CUT) / (1 - EXPLORE_CUT)
end

local function new_rng(req)
    local r = request_random(req)
    return { first = stretch(r), state = floor(r * 2 ^ 53) }
end

local function next_seed(rng)
    local z
    rng.state, z = splitmix64(rng.state)
    return z
end

local function next_random(rng)
    local u = rng.first
    if u then
        rng.first = nil
        return u
    end
    return (next_seed(rng) >> 11) * 2.0 ^ -53
end

-- Rule 7, main pool: weighted random order without replacement, weight = share(c). facts:
-- what scan saw of the group, when the group is every usable route (or nil). keys: rule 8's
-- (see below) or nil: weighted_order orders by them first, its weighted order deciding
-- among equal keys, in one call.
local function main_pool_order(group, rng, facts, keys)
    return weighted_order(group, shares_of(group, facts), next_random(rng), next_seed(rng), keys)
end

-- Rule 7, fallback pool: least in_flight first, then configured order.
local function fallback_pool_order(group)
    local keys = {}
    for i = 1, #group do
        keys[i] = group[i].in_flight or 0
    end
    return sort_by(group, keys)
end

------------------------------------------------------------------------------------------------
-- Rule 8: adaptive preference with exploration
------------------------------------------------------------------------------------------------

-- The request explores when req.random falls in the lowest 1/EXPLORE_ONE_IN of [0,1).
local function exploring(req)
    return request_random(req) < EXPLORE_CUT
end

-- adaptive_key(success_rate, avail_samples, ttft_ms, ttft_samples): rule 8's preference for
-- one route as one number, smaller first, from the candidate fields of the same names; nil
-- when the route lacks samples (at least ADAPTIVE_MIN_AVAIL availability or ADAPTIVE_MIN_TTFT
-- TTFT samples).
-- The number: the success-rate step (higher is better; no success_rate yet counts as no
-- failure seen) before the TTFT step (lower is better; no ttft_ms yet, no success seen, as
-- slowest). A TTFT step stays below 2^20 (that would be 1.1^(2^20) ms), so rate_step * 2^21
-- keeps the steps apart.
-- The gateway calls it too, as M.adaptive_key, whenever one of the four facts of a route
-- changes, and hands the answer to route() as c.adaptive_key (false for nil): in steady state
-- one route's samples move per request, so a request reads one field per route instead of
-- computing a logarithm for each. Keep it a pure function of its four arguments.
local LOG_TTFT_STEP = log(TTFT_STEP)
local SLOWEST_TTFT_STEP <const> = 2 ^ 20 - 1

local function adaptive_key(success_rate, avail_samples, ttft_ms, ttft_samples)
    if (avail_samples or 0) < ADAPTIVE_MIN_AVAIL and (ttft_samples or 0) < ADAPTIVE_MIN_TTFT then
        return nil
    end
    local rate_step = ((success_rate or 1) / RATE_STEP + 0.5) // 1 -- 0.99 is with 1.0
    local ttft_step = SLOWEST_TTFT_STEP
    if ttft_ms then
        ttft_step = (log(ttft_ms > 1 and ttft_ms or 1) / LOG_TTFT_STEP + 0.5) // 1
        if ttft_step > SLOWEST_TTFT_STEP then
            ttft_step = SLOWEST_TTFT_STEP
        end
    end
    return ttft_step - rate_step * 2 ^ 21
end

M.adaptive_key = adaptive_key

-- adaptive_keys(group): adaptive_key for every route of the group, or nil when a route lacks
-- samples: ranking a measured route above an unmeasured one would starve the unmeasured one
-- of the very traffic that would measure it. c.adaptive_key when the core gave it (a number,
-- or false: too few samples), computed here for a table without it (busted, selftest). When
-- the group is the core's whole candidates list, the core may have the list already:
-- candidates.adaptive_keys, there when every candidate has a number.
local function adaptive_keys(group)
    local keys = group.adaptive_keys
    if keys then
        return keys
    end
    keys = {}
    for i = 1, #group do
        local c = group[i]
        local key = c.adaptive_key
        if not key then -- nil (not given) or false (too few samples): a truth test is cheaper
            if key == nil then
                key = adaptive_key(c.success_rate, c.avail_samples, c.ttft_ms, c.ttft_samples)
            end
            if not key then
                return nil
            end
        end
        keys[i] = key
    end
    return keys
end

------------------------------------------------------------------------------------------------
-- Putting rules 5-8 together
------------------------------------------------------------------------------------------------

-- order_group(group, rng, explore, facts): rules 7 and 8 inside one group (facts: see
-- main_pool_order).
local function order_group(group, rng, explore, facts)
    if #group == 1 then
        return group
    end
    if pool_of(group[1]) == "main" then -- best first; equal keys keep their rule-7 order
        return main_pool_order(group, rng, facts, not explore and adaptive_keys(group) or nil)
    end
    group = fallback_pool_order(group)
    local keys = not explore and adaptive_keys(group)
    if keys then -- the same: a stable sort of the rule-7 order
        group = sort_by(group, keys)
    end
    return group
end

-- groups_of(req, list): the groups of rules 5-7 in the order they are tried, each a list in
-- the order of `list`.
local function groups_of(req, list)
    local by_rank, ranks = {}, {}
    for i = 1, #list do
        local c = list[i]
        local rank = group_rank(req, c)
        local g = by_rank[rank]
        if not g then
            g = {}
            by_rank[rank] = g
            ranks[#ranks + 1] = rank
        end
        g[#g + 1] = c
    end
    table.sort(ranks)
    local groups = {}
    for i, rank in ipairs(ranks) do
        groups[i] = by_rank[rank]
    end
    return groups
end

-- cut(plan, limit): the plan without its entries past `limit` (req.plan_limit: the core
-- never reaches them). plan is a new list, never the core's.
local function cut(plan, limit)
    for i = #plan, limit + 1, -1 do
        plan[i] = nil
    end
    return plan
end

-- order(req, list, facts): rules 5-8 applied to `list`, the usable routes scan found (facts);
-- returns a new list (the plan: never `list`, which may be the core's candidates list), at
-- most req.plan_limit long.
local function order(req, list, facts)
    if #list <= 1 then -- (unmarked: room for mark's plan.unmarked, no rehash)
        return { list[1], unmarked = nil, reuse = list[1] ~= nil or nil } -- ({} stays {})
    end
    local r = request_random(req)
    local explore = r < EXPLORE_CUT -- exploring(req)
    if facts.one_group and list[1].pool ~= "fallback" then -- pool_of(list[1]) == "main"
        -- the usual plan, one main group: order_group's main_pool_order with the first two
        -- numbers of new_rng(req)'s stream, drawn without making the stream; the core's
        -- kept lists of shares and keys read without a call when it gave them
        local _, seed = splitmix64(floor(r * 2 ^ 53))
        local keys = not explore and (list.adaptive_keys or adaptive_keys(list)) or nil
        return weighted_order(list, list.shares or shares_of(list, facts), stretch(r), seed,
                              keys, req.plan_limit)
    end
    local rng, limit = new_rng(req), req.plan_limit or #list
    if facts.one_group then
        return cut(order_group(list, rng, explore, facts), limit)
    end
    -- groups of one route each (a failover order) give the same plan every time
    local out, n, reuse = {}, 0, true
    for _, group in ipairs(groups_of(req, list)) do
        if n == limit then
            break
        end
        reuse = reuse and #group == 1
        for _, c in ipairs(order_group(group, rng, explore)) do
            if n == limit then
                break
            end
            n = n + 1
            out[n] = c
        end
    end
    out.reuse = reuse or nil
    return out
end

------------------------------------------------------------------------------------------------
-- Degraded markers (rules 3, 4, 7)
------------------------------------------------------------------------------------------------

-- cloud_is_degradation(req, facts): a cloud route stands in for local ones that exist and are
-- tried first (local_first) or cannot serve now.
local function cloud_is_degradation(req, facts)
    return facts.locals and (req.local_first ~= false or not facts.usable_local)
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

-- set_marks(c, degraded, emergency): write the markers, touching the table only when they
-- change.
local function set_marks(c, degraded, emergency)
    if c.degraded ~= degraded then
        c.degraded = degraded
    end
    if c.emergency ~= emergency then
        c.emergency = emergency
    end
end

-- mark(req, plan, facts): the degraded marker of every entry. Candidates arrive unmarked (see
-- the top of the file): when no usable route can be degraded there is nothing to write, and
-- plan.unmarked = true tells the core it need not look either.
local function mark(req, plan, facts)
    local cloud_degraded = cloud_is_degradation(req, facts)
    if not (facts.usable_smaller or (facts.usable_fallback and start_pool(req) == "main")
            or (cloud_degraded and facts.usable_cloud)) then
        plan.unmarked = plan[1] ~= nil or nil -- {} stays {}
        return plan
    end
    for i = 1, #plan do
        local c = plan[i]
        set_marks(c, degradation(req, c, cloud_degraded), nil)
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
    local keys = {}
    for i, c in ipairs(out) do
        keys[i] = c.cooldown_remaining_ms or 0
    end
    return sort_by(out, keys) -- `list` is in index order: so are equal remaining times
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
    set_marks(c, "emergency", true)
    return { c }
end

-- chain(req, candidates, usable, facts): the plan for the routes that pass rules 1-4, of
-- which `usable` are the usable ones.
local function chain(req, candidates, usable, facts)
    -- 1. a usable route in the start pool: every usable route, best first
    if facts.start_usable then
        return mark(req, order(req, usable, facts), facts)
    end
    -- 2. the start pool is back soon: wait for it rather than degrade
    local list = eligible(req, candidates)
    local wait_ms = recovery_wait(req, list)
    if wait_ms then
        return { wait_ms = wait_ms }
    end
    -- 3. the other pool (the plan depends on how long the start pool still cools)
    if #usable > 0 then
        local plan = mark(req, order(req, usable, facts), facts)
        plan.reuse = nil
        return plan
    end
    -- 4. emergency, or {} when nothing is even cooling
    return emergency(list)
end

-- A pinned request gets its provider's usable routes and nothing else: no waiting, no
-- emergency, no other provider. The client chose it, so only "smaller" is a degradation.
local function pinned_plan(req, usable, facts)
    local plan = order(req, usable, facts)
    if not facts.usable_smaller then
        plan.unmarked = plan[1] ~= nil or nil -- {} stays {}
        return plan
    end
    for i = 1, #plan do
        local c = plan[i]
        set_marks(c, c.smaller and "smaller" or nil, nil)
    end
    return plan
end

-- The usual request, decided without the general path's bookkeeping (summarize's table,
-- chain, mark): not pinned, starting from the main pool, every candidate alike
-- (candidates.alike), usable (candidates.all_usable), in the main pool and not a smaller
-- model, and rules 2-4 letting them through. The plan is then rules 5-8's order of all of
-- them, and nothing in it is degraded: what scan, chain and mark give for it
-- (tests/lua/routing_spec.lua checks that the two agree). nil for any other request.
local ALIKE_WEIGHED <const> = { one_group = true, same_weight = true, full_headroom = false }
local ALIKE_UNWEIGHED <const> = { one_group = true, same_weight = false, full_headroom = false }

local function usual_plan(req, candidates)
    local c1 = candidates[1]
    if c1 == nil or req.pin ~= nil or not candidates.all_usable or not candidates.alike
        or req.pool == "fallback" or c1.pool == "fallback" or c1.smaller
        or not passes_rules_2_4(req, c1) then
        return nil
    end
    local facts = (tonumber(c1.weight) or 1) > 0 and ALIKE_WEIGHED or ALIKE_UNWEIGHED
    local plan = order(req, candidates, facts)
    plan.unmarked = true
    return plan
end

function M.route(req, candidates)
    local plan = usual_plan(req, candidates)
    if plan then
        return plan
    end
    local usable, facts = scan(req, candidates)
    if req.pin ~= nil then
        return pinned_plan(req, usable, facts)
    end
    return chain(req, candidates, usable, facts)
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
