dofile("tests/lua/helper.lua")

-- cand(index, provider, extra): a candidate as the core builds it: a main-pool cloud route,
-- available, not cooling, no samples yet; `extra` overrides fields.
local function cand(index, provider, extra)
    local c = { index = index, provider = provider, model = provider .. "-model", pool = "main",
                ["local"] = false, smaller = false, priority = 0, weight = 1, available = true,
                cooling = false, cooldown_remaining_ms = 0, consecutive_429 = 0,
                observing = false, rpm_limit = 0, rpm_used = 0, tpm_limit = 0, tpm_used = 0,
                headroom = 1, in_flight = 0, health = "healthy", breaker = "closed",
                avail_samples = 0, ttft_samples = 0 }
    for k, v in pairs(extra or {}) do
        c[k] = v
    end
    return c
end

local function req_with(extra)
    local r = { request_id = "r1", endpoint = "chat", model = "general-chat", stream = false,
                created = 1700000000, priority = "P2", local_only = false,
                allow_smaller_model = false, allow_cloud = true, local_first = true,
                random = 0.5, attempt = 1 }
    for k, v in pairs(extra or {}) do
        r[k] = v
    end
    return r
end

local function providers(plan)
    local out = {}
    for i, c in ipairs(plan) do
        out[i] = c.provider
    end
    return out
end

local function degraded(plan)
    local out = {}
    for i, c in ipairs(plan) do
        out[i] = c.degraded or "-"
    end
    return out
end

local function cooling(ms, extra)
    local t = { cooling = true, cooldown_remaining_ms = ms }
    for k, v in pairs(extra or {}) do
        t[k] = v
    end
    return t
end

-- draws(routing, n, build, extra, lo, hi): route n requests with req.random spread evenly over
-- [lo, hi) (default [0, 1)) and fresh candidates from build(); returns how often each provider
-- came first.
local function draws(routing, n, build, extra, lo, hi)
    lo, hi = lo or 0, hi or 1
    local first = {}
    for i = 1, n do
        local r = req_with(extra)
        r.random = lo + (i - 0.5) / n * (hi - lo)
        local plan = routing.route(r, build())
        local p = plan[1] and plan[1].provider or "none"
        first[p] = (first[p] or 0) + 1
    end
    return first
end

describe("policies/routing.lua", function()
    local routing

    before_each(function()
        routing = dofile("policies/routing.lua")
    end)

    describe("module", function()
        it("has name, version, route and selftest", function()
            assert.equal("routing", routing.name)
            assert.equal(1, routing.version)
            assert.is_function(routing.route)
            assert.is_function(routing.selftest)
        end)

        it("selftest passes", function()
            assert.has_no.errors(function()
                routing.selftest()
            end)
        end)

        it("returns the given tables themselves, not copies", function()
            local c = { cand(1, "a"), cand(2, "b") }
            local plan = routing.route(req_with(), c)
            assert.equal(2, #plan)
            for _, e in ipairs(plan) do
                assert.is_true(e == c[1] or e == c[2])
                assert.equal(e.provider == "a" and 1 or 2, e.index)
            end
        end)

        it("does not reorder or shrink the candidates list", function()
            local c = { cand(2, "b"), cand(1, "a", { available = false }), cand(3, "c") }
            routing.route(req_with(), c)
            assert.same({ "b", "a", "c" }, providers(c))
        end)

        it("is deterministic for one req.random", function()
            local build = function()
                return { cand(1, "a"), cand(2, "b"), cand(3, "c"), cand(4, "d") }
            end
            for _, r in ipairs({ 0, 0.13, 0.5, 0.77, 0.999 }) do
                local one = providers(routing.route(req_with({ random = r }), build()))
                local two = providers(routing.route(req_with({ random = r }), build()))
                assert.same(one, two)
            end
        end)

        it("never calls math.random or os.time", function()
            local saved_random, saved_time = math.random, os.time
            math.random = function()
                error("math.random called")
            end
            os.time = function()
                error("os.time called")
            end
            local ok, err = pcall(function()
                routing.route(req_with(), { cand(1, "a"), cand(2, "b", { pool = "fallback" }) })
                routing.selftest()
            end)
            math.random, os.time = saved_random, saved_time
            assert.is_true(ok, err)
        end)

        it("tolerates a request without the optional fields", function()
            local plan = routing.route({ request_id = "x" }, { cand(1, "a"), cand(2, "b") })
            assert.equal(2, #plan)
        end)
    end)

    describe("availability", function()
        it("skips unavailable candidates", function()
            local c = { cand(1, "a", { available = false }), cand(2, "b"),
                        cand(3, "c", { available = false }) }
            assert.same({ "b" }, providers(routing.route(req_with(), c)))
        end)

        it("treats a missing available field as available", function()
            local c = { cand(1, "a") }
            c[1].available = nil
            assert.same({ "a" }, providers(routing.route(req_with(), c)))
        end)

        it("returns {} for no candidates, or none available and none cooling", function()
            assert.same({}, routing.route(req_with(), {}))
            assert.same({}, routing.route(req_with(), { cand(1, "a", { available = false }) }))
        end)

        it("leaves healthy main routes without degraded or emergency marks", function()
            local plan = routing.route(req_with(), { cand(1, "a"), cand(2, "b") })
            for _, c in ipairs(plan) do
                assert.is_nil(c.degraded)
                assert.is_nil(c.emergency)
            end
        end)
    end)

    describe("the engines' own load (c.load) prefers the idle engine", function()
        local N = 1000

        it("load_factor: 1 idle or unknown, less per running and twice per waiting request", function()
            assert.equal(1, routing.load_factor(nil))
            assert.equal(1, routing.load_factor({ running = 0, waiting = 0, kv_cache = 0 }))
            assert.equal(0.5, routing.load_factor({ running = 1, waiting = 0, kv_cache = 0.2 }))
            assert.equal(1 / 7, routing.load_factor({ running = 2, waiting = 2, kv_cache = 0.5 }))
            assert.equal(0.25, routing.load_factor({ running = 1, waiting = 0, kv_cache = 0.95 }))
        end)

        it("an idle engine gets most of the traffic beside a queueing one", function()
            local first = draws(routing, N, function()
                return { cand(1, "busy", { load = { running = 4, waiting = 2, kv_cache = 0.5 } }),
                         cand(2, "idle", { load = { running = 0, waiting = 0, kv_cache = 0 } }) }
            end)
            -- shares 1/9 and 1: the idle engine first 90% of the time
            assert.near(0.9, (first.idle or 0) / N, 0.04)
        end)

        it("fallback pool: the engine with fewer waiting requests first", function()
            local plan = routing.route(req_with({ pool = "fallback" }), {
                cand(1, "a", { pool = "fallback", load = { running = 1, waiting = 3, kv_cache = 0 } }),
                cand(2, "b", { pool = "fallback", load = { running = 1, waiting = 0, kv_cache = 0 } }) })
            assert.same({ "b", "a" }, providers(plan))
        end)
    end)

    describe("main pool: weighted by headroom * weight", function()
        local N = 1000

        it("splits evenly between equal routes", function()
            local first = draws(routing, N, function()
                return { cand(1, "a"), cand(2, "b") }
            end)
            assert.near(0.5, (first.a or 0) / N, 0.05)
            assert.near(0.5, (first.b or 0) / N, 0.05)
        end)

        it("follows configured weights", function()
            local first = draws(routing, N, function()
                return { cand(1, "a", { weight = 3 }), cand(2, "b", { weight = 1 }) }
            end)
            assert.near(0.75, (first.a or 0) / N, 0.05)
        end)

        it("follows RPM headroom", function()
            local first = draws(routing, N, function()
                return { cand(1, "a", { headroom = 0.2 }), cand(2, "b", { headroom = 0.8 }),
                         cand(3, "c", { headroom = 1.0 }) }
            end)
            assert.near(0.1, (first.a or 0) / N, 0.04)
            assert.near(0.4, (first.b or 0) / N, 0.05)
            assert.near(0.5, (first.c or 0) / N, 0.05)
        end)

        it("multiplies headroom by weight", function()
            -- shares: a 2 * 0.5 = 1, b 1 * 1 = 1, c 4 * 0.5 = 2
            local first = draws(routing, N, function()
                return { cand(1, "a", { weight = 2, headroom = 0.5 }), cand(2, "b"),
                         cand(3, "c", { weight = 4, headroom = 0.5 }) }
            end)
            assert.near(0.25, (first.a or 0) / N, 0.05)
            assert.near(0.25, (first.b or 0) / N, 0.05)
            assert.near(0.5, (first.c or 0) / N, 0.05)
        end)

        it("puts a route with no headroom last", function()
            for i = 1, 50 do
                local plan = routing.route(req_with({ random = (i - 0.5) / 50 }),
                    { cand(1, "full", { headroom = 0 }), cand(2, "a"), cand(3, "b") })
                assert.equal("full", plan[3].provider)
            end
        end)

        it("weighs the second place too (draw without replacement)", function()
            local second = {}
            for i = 1, N do
                local plan = routing.route(req_with({ random = (i - 0.5) / N }),
                    { cand(1, "a", { weight = 8 }), cand(2, "b"), cand(3, "c") })
                if plan[1].provider == "a" then
                    second[plan[2].provider] = (second[plan[2].provider] or 0) + 1
                end
            end
            local total = (second.b or 0) + (second.c or 0)
            assert.near(0.5, (second.b or 0) / total, 0.07)
        end)

        it("lists every usable route once", function()
            local plan = routing.route(req_with({ random = 0.42 }),
                { cand(1, "a"), cand(2, "b", { weight = 5 }), cand(3, "c", { headroom = 0 }) })
            local seen = providers(plan)
            table.sort(seen)
            assert.same({ "a", "b", "c" }, seen)
        end)
    end)

    describe("req.plan_limit", function()
        local function five(extra_of)
            local list = {}
            for i, p in ipairs({ "a", "b", "c", "d", "e" }) do
                list[i] = cand(i, p, extra_of and extra_of(i) or nil)
            end
            return list
        end
        local function first_of(plan, n)
            local out = {}
            for i = 1, n do
                out[i] = plan[i].provider
            end
            return out
        end

        it("stops the plan there: in priority groups and the fallback pool, the first entries of the full plan", function()
            for _, build in ipairs({
                function() return five(function(i) return { priority = i % 2 } end) end, -- two groups
                function() return five(function(i) return { pool = "fallback", in_flight = 5 - i } end) end,
            }) do
                for _, r in ipairs({ 0.03, 0.42, 0.9 }) do
                    local full = routing.route(req_with({ random = r }), build())
                    for limit = 1, 6 do
                        local plan = routing.route(req_with({ random = r, plan_limit = limit }), build())
                        local n = math.min(limit, 5)
                        assert.equal(n, #plan)
                        assert.same(first_of(full, n), providers(plan))
                    end
                end
            end
        end)

        it("draws a limited main-pool plan one entry after the other, by weight", function()
            local first, seen_twice = {}, false
            for i = 1, 400 do
                local plan = routing.route(req_with({ random = (i - 0.5) / 400, plan_limit = 2 }),
                    five(function(k) return { weight = k } end))
                assert.equal(2, #plan)
                seen_twice = seen_twice or plan[1] == plan[2]
                first[plan[1].provider] = (first[plan[1].provider] or 0) + 1
            end
            assert.is_false(seen_twice)
            -- weights 1..5 (sum 15); 1 request in 20 explores, with the same weights
            assert.near(5 / 15, first.e / 400, 0.05)
            assert.near(1 / 15, first.a / 400, 0.03)
        end)
    end)

    describe("fallback pool: least in_flight first", function()
        it("orders by in_flight, then by index", function()
            local c = { cand(1, "m", { cooling = true, cooldown_remaining_ms = 60000 }),
                        cand(2, "f1", { pool = "fallback", in_flight = 5 }),
                        cand(3, "f2", { pool = "fallback", in_flight = 1 }),
                        cand(4, "f3", { pool = "fallback", in_flight = 3 }),
                        cand(5, "f4", { pool = "fallback", in_flight = 1 }) }
            local plan = routing.route(req_with(), c)
            assert.same({ "f2", "f4", "f3", "f1" }, providers(plan))
            assert.same({ "fallback", "fallback", "fallback", "fallback" }, degraded(plan))
        end)

        it("ignores weights in the fallback pool", function()
            for _, r in ipairs({ 0.01, 0.3, 0.6, 0.99 }) do
                local plan = routing.route(req_with({ random = r }), {
                    cand(1, "m", { available = false }),
                    cand(2, "heavy", { pool = "fallback", weight = 100, in_flight = 2 }),
                    cand(3, "idle", { pool = "fallback", weight = 1, in_flight = 0 }) })
                assert.same({ "idle", "heavy" }, providers(plan))
            end
        end)

        it("comes after the main pool, marked degraded = fallback", function()
            local plan = routing.route(req_with(), { cand(1, "f", { pool = "fallback" }),
                                                     cand(2, "m") })
            assert.same({ "m", "f" }, providers(plan))
            assert.same({ "-", "fallback" }, degraded(plan))
        end)
    end)

    describe("priority groups", function()
        it("tries lower groups first, whatever the weights", function()
            for _, r in ipairs({ 0.01, 0.25, 0.5, 0.75, 0.99 }) do
                local plan = routing.route(req_with({ random = r }), {
                    cand(1, "p1a", { priority = 1, weight = 100 }),
                    cand(2, "p0", { priority = 0 }),
                    cand(3, "p1b", { priority = 1 }),
                    cand(4, "p2", { priority = 2, weight = 100 }) })
                local got = providers(plan)
                assert.equal("p0", got[1])
                assert.equal("p2", got[4])
            end
        end)

        it("ranks above the pool: a group-0 fallback before a group-1 main", function()
            local plan = routing.route(req_with(), { cand(1, "m1", { priority = 1 }),
                                                     cand(2, "f0", { pool = "fallback" }) })
            assert.same({ "f0", "m1" }, providers(plan))
        end)

        it("treats a missing priority as group 0", function()
            local c = { cand(1, "p1", { priority = 1 }), cand(2, "none") }
            c[2].priority = nil
            assert.same({ "none", "p1" }, providers(routing.route(req_with(), c)))
        end)
    end)

    describe("adaptive preference", function()
        local function sampled(rate, ttft, extra)
            local t = { avail_samples = 20, success_rate = rate, ttft_samples = 10, ttft_ms = ttft }
            for k, v in pairs(extra or {}) do
                t[k] = v
            end
            return t
        end

        it("puts the better success rate first once samples suffice", function()
            for i = 2, 20 do -- never the exploring twentieth
                local plan = routing.route(req_with({ random = i / 20 - 0.01 }), {
                    cand(1, "flaky", sampled(0.6, 100, { weight = 10 })),
                    cand(2, "solid", sampled(0.99, 100)) })
                assert.same({ "solid", "flaky" }, providers(plan))
            end
        end)

        it("puts the lower TTFT first when success rates are alike", function()
            for i = 2, 20 do
                local plan = routing.route(req_with({ random = i / 20 - 0.01 }), {
                    cand(1, "slow", sampled(1.0, 900, { weight = 10 })),
                    cand(2, "fast", sampled(0.99, 150)) })
                assert.same({ "fast", "slow" }, providers(plan))
            end
        end)

        it("needs 5 availability samples", function()
            local function build(n)
                return function()
                    return { cand(1, "a", { avail_samples = n, success_rate = 0.2 }),
                             cand(2, "b", { avail_samples = n, success_rate = 1.0 }) }
                end
            end
            local before = draws(routing, 400, build(4))
            assert.near(0.5, (before.a or 0) / 400, 0.08)
            local after = draws(routing, 400, build(5), nil, 0.05, 1) -- no exploring draws
            assert.equal(400, after.b or 0)
        end)

        it("needs 3 TTFT samples", function()
            local function build(n)
                return function()
                    return { cand(1, "a", { ttft_samples = n, ttft_ms = 2000 }),
                             cand(2, "b", { ttft_samples = n, ttft_ms = 100 }) }
                end
            end
            local before = draws(routing, 400, build(2))
            assert.near(0.5, (before.a or 0) / 400, 0.08)
            local after = draws(routing, 400, build(3), nil, 0.05, 1)
            assert.equal(400, after.b or 0)
        end)

        it("keeps the weighted order while a route of the group has no samples yet", function()
            -- ranking the measured route first would starve the new one of the traffic
            -- that would measure it
            local plan = routing.route(req_with({ random = 0.5 }), {
                cand(1, "new", { weight = 50 }),
                cand(2, "known", sampled(0.9, 300)) })
            assert.same({ "new", "known" }, providers(plan))
        end)

        it("explores for exactly the 1-in-20 draws (req.random < 0.05)", function()
            local N = 1000
            local explored = 0
            for i = 1, N do
                local r = (i - 0.5) / N
                local plan = routing.route(req_with({ random = r }), {
                    cand(1, "good", sampled(1.0, 100, { weight = 1 })),
                    cand(2, "bad", sampled(0.5, 100, { weight = 1000 })) })
                if plan[1].provider == "bad" then
                    explored = explored + 1
                    assert.is_true(r < 0.05, "explored at random = " .. r)
                end
            end
            -- the exploring requests keep the weighted order, where "bad" has 1000/1001 share
            assert.is_true(explored >= 45 and explored <= 50, "explored " .. explored)
        end)

        it("explores with the configured-weight order", function()
            local N = 2000
            local first = {}
            for i = 1, N do
                local r = (i - 0.5) / N * 0.05 -- only exploring draws
                local plan = routing.route(req_with({ random = r }), {
                    cand(1, "a", sampled(1.0, 100, { weight = 3 })),
                    cand(2, "b", sampled(0.5, 900, { weight = 1 })) })
                first[plan[1].provider] = (first[plan[1].provider] or 0) + 1
            end
            assert.near(0.75, (first.a or 0) / N, 0.05)
        end)

        it("has adaptive_key: success-rate steps before TTFT steps, nil without samples", function()
            local key = routing.adaptive_key
            assert.is_nil(key(1.0, 4, 100, 2))
            assert.is_number(key(nil, 0, 100, 3)) -- 3 TTFT samples are enough
            assert.is_true(key(0.99, 20, 900, 10) < key(0.9, 20, 100, 10)) -- rate first
            assert.equal(key(0.99, 20, 100, 10), key(1.0, 20, 100, 10)) -- same 5-point step
            assert.equal(key(1.0, 20, 95, 10), key(1.0, 20, 100, 10)) -- same 10% step
            assert.is_true(key(1.0, 20, 100, 10) < key(1.0, 20, 150, 10))
            assert.is_true(key(1.0, 20, 5000, 10) < key(1.0, 20, nil, 10)) -- no TTFT: slowest
        end)

        it("stays inside the group: does not lift a route over a lower priority", function()
            local plan = routing.route(req_with(), {
                cand(1, "p0", sampled(0.5, 2000)),
                cand(2, "p1", sampled(1.0, 50, { priority = 1 })) })
            assert.same({ "p0", "p1" }, providers(plan))
        end)
    end)

    describe("pinning", function()
        it("keeps only the pinned provider's routes", function()
            local plan = routing.route(req_with({ pin = "b" }), {
                cand(1, "a"), cand(2, "b"), cand(3, "c", { pool = "fallback" }),
                cand(4, "b", { model = "other" }) })
            assert.same({ "b", "b" }, providers(plan))
        end)

        it("returns {} when the pinned provider is unavailable, without falling back", function()
            assert.same({}, routing.route(req_with({ pin = "b" }),
                { cand(1, "a"), cand(2, "b", { available = false }) }))
            assert.same({}, routing.route(req_with({ pin = "b" }),
                { cand(1, "a"), cand(2, "b", cooling(2000)) }))
            assert.same({}, routing.route(req_with({ pin = "zzz" }), { cand(1, "a") }))
        end)

        it("can pin a fallback provider without calling it degraded", function()
            local plan = routing.route(req_with({ pin = "f" }),
                { cand(1, "a"), cand(2, "f", { pool = "fallback" }) })
            assert.same({ "f" }, providers(plan))
            assert.is_nil(plan[1].degraded)
        end)

        it("still honours local_only", function()
            assert.same({}, routing.route(req_with({ pin = "cloud", local_only = true }),
                { cand(1, "cloud"), cand(2, "loc", { ["local"] = true }) }))
        end)
    end)

    describe("X-Sidecar-Pool", function()
        it("starts from the fallback pool when req.pool = fallback", function()
            local plan = routing.route(req_with({ pool = "fallback" }), {
                cand(1, "m1"), cand(2, "m2"), cand(3, "f", { pool = "fallback" }) })
            assert.equal("f", plan[1].provider)
            assert.equal(3, #plan)
            assert.same({ "-", "-", "-" }, degraded(plan))
        end)

        it("starts from main for req.pool = main or nil", function()
            local c = function()
                return { cand(1, "f", { pool = "fallback" }), cand(2, "m") }
            end
            assert.same({ "m", "f" }, providers(routing.route(req_with({ pool = "main" }), c())))
            assert.same({ "m", "f" }, providers(routing.route(req_with({ pool = nil }), c())))
        end)

        it("waits for the start pool before using the other one", function()
            local plan = routing.route(req_with({ pool = "fallback" }),
                { cand(1, "m"), cand(2, "f", cooling(3000, { pool = "fallback" })) })
            assert.same({ wait_ms = 3000 }, plan)
        end)
    end)

    describe("local_only", function()
        it("never returns a cloud route", function()
            for i = 1, 200 do
                local r = req_with({ local_only = true, random = (i - 0.5) / 200 })
                local plan = routing.route(r, {
                    cand(1, "cloud", { weight = 100 }),
                    cand(2, "loc1", { ["local"] = true, cooling = i % 2 == 0,
                                      cooldown_remaining_ms = 60000 }),
                    cand(3, "cloudfb", { pool = "fallback" }),
                    cand(4, "loc2", { ["local"] = true, pool = "fallback",
                                      available = i % 3 ~= 0 }) })
                for _, c in ipairs(plan) do
                    assert.is_true(c["local"], "cloud route " .. c.provider .. " returned")
                end
            end
        end)

        it("waits for or uses a cooling local route rather than going to the cloud", function()
            local c = function(ms)
                return { cand(1, "cloud"), cand(2, "loc", cooling(ms, { ["local"] = true })) }
            end
            assert.same({ wait_ms = 5000 }, routing.route(req_with({ local_only = true }), c(5000)))
            local plan = routing.route(req_with({ local_only = true }), c(50000))
            assert.same({ "loc" }, providers(plan))
            assert.equal("emergency", plan[1].degraded)
        end)

        it("returns {} when there is no local route", function()
            assert.same({}, routing.route(req_with({ local_only = true }), { cand(1, "cloud") }))
        end)
    end)

    describe("smaller models", function()
        it("are left out without allow_smaller_model", function()
            local plan = routing.route(req_with(), { cand(1, "big", { available = false }),
                                                     cand(2, "small", { smaller = true }) })
            assert.same({}, plan)
        end)

        it("come after full-size routes with allow_smaller_model, degraded = smaller", function()
            for _, r in ipairs({ 0.01, 0.5, 0.99 }) do
                local plan = routing.route(req_with({ allow_smaller_model = true, random = r }), {
                    cand(1, "small", { smaller = true, weight = 100 }), cand(2, "big") })
                assert.same({ "big", "small" }, providers(plan))
                assert.same({ "-", "smaller" }, degraded(plan))
            end
        end)

        it("serve when the full-size route cannot", function()
            local plan = routing.route(req_with({ allow_smaller_model = true }), {
                cand(1, "big", { available = false }), cand(2, "small", { smaller = true }) })
            assert.same({ "small" }, providers(plan))
            assert.equal("smaller", plan[1].degraded)
        end)
    end)

    describe("cloud routes", function()
        local function mixed(local_extra)
            return { cand(1, "cloud"), cand(2, "loc", local_extra or { ["local"] = true }) }
        end

        it("are left out when allow_cloud is false", function()
            local plan = routing.route(req_with({ allow_cloud = false }), mixed())
            assert.same({ "loc" }, providers(plan))
            assert.same({}, routing.route(req_with({ allow_cloud = false }),
                mixed({ ["local"] = true, available = false })))
        end)

        it("are allowed when allow_cloud is missing (default true)", function()
            local plan = routing.route(req_with({ allow_cloud = nil }), { cand(1, "cloud") })
            assert.same({ "cloud" }, providers(plan))
        end)

        it("say degraded = cloud when the local ones are unusable", function()
            local plan = routing.route(req_with(), mixed({ ["local"] = true, available = false }))
            assert.same({ "cloud" }, providers(plan))
            assert.equal("cloud", plan[1].degraded)
            plan = routing.route(req_with({ local_first = false }),
                mixed({ ["local"] = true, available = false }))
            assert.equal("cloud", plan[1].degraded)
        end)

        it("say degraded = cloud behind usable local ones with local_first", function()
            local plan = routing.route(req_with(), mixed())
            assert.same({ "loc", "cloud" }, providers(plan))
            assert.same({ "-", "cloud" }, degraded(plan))
        end)

        it("are not degraded when there is no local route", function()
            local plan = routing.route(req_with(), { cand(1, "c1"), cand(2, "c2") })
            assert.same({ "-", "-" }, degraded(plan))
        end)
    end)

    describe("local first", function()
        it("puts local routes first when local_first", function()
            for _, r in ipairs({ 0.01, 0.3, 0.7, 0.99 }) do
                local plan = routing.route(req_with({ random = r }), {
                    cand(1, "cloud", { weight = 100 }),
                    cand(2, "loc", { ["local"] = true }),
                    cand(3, "locfb", { ["local"] = true, pool = "fallback" }) })
                assert.same({ "loc", "locfb", "cloud" }, providers(plan))
            end
        end)

        it("also when local_first is missing (default true)", function()
            local plan = routing.route(req_with({ local_first = nil }), {
                cand(1, "cloud", { weight = 100 }), cand(2, "loc", { ["local"] = true }) })
            assert.same({ "loc", "cloud" }, providers(plan))
        end)

        it("mixes local and cloud by weight when local_first is false", function()
            local first = draws(routing, 1000, function()
                return { cand(1, "cloud", { weight = 3 }), cand(2, "loc", { ["local"] = true }) }
            end, { local_first = false })
            assert.near(0.75, (first.cloud or 0) / 1000, 0.05)
        end)
    end)

    describe("degradation chain", function()
        it("uses the usable main routes first", function()
            local plan = routing.route(req_with(), {
                cand(1, "m1", cooling(5000)), cand(2, "m2"), cand(3, "f", { pool = "fallback" }) })
            assert.same({ "m2", "f" }, providers(plan))
        end)

        it("waits when all main routes cool and one is back within 10 s", function()
            local c = { cand(1, "m1", cooling(60000)), cand(2, "m2", cooling(7000)),
                        cand(3, "m3", cooling(9000)), cand(4, "f", { pool = "fallback" }) }
            assert.same({ wait_ms = 7000 }, routing.route(req_with(), c))
            c = { cand(1, "m1", cooling(10000)), cand(2, "f", { pool = "fallback" }) }
            assert.same({ wait_ms = 10000 }, routing.route(req_with(), c))
        end)

        it("waits again on a later attempt while the route still cools", function()
            local c = { cand(1, "m1", cooling(120)), cand(2, "f", { pool = "fallback" }) }
            assert.same({ wait_ms = 120 }, routing.route(req_with({ attempt = 2 }), c))
        end)

        it("never asks for a zero wait", function()
            local c = { cand(1, "m1", cooling(0)) }
            local plan = routing.route(req_with(), c)
            assert.is_true(plan.wait_ms >= 1)
        end)

        it("does not wait for an unavailable cooling route", function()
            local plan = routing.route(req_with(), {
                cand(1, "m1", cooling(2000, { available = false })),
                cand(2, "f", { pool = "fallback" }) })
            assert.same({ "f" }, providers(plan))
        end)

        it("goes to fallback, degraded = fallback, when main is back later than 10 s", function()
            local plan = routing.route(req_with(), {
                cand(1, "m1", cooling(10001)), cand(2, "m2", { available = false }),
                cand(3, "f1", { pool = "fallback", in_flight = 2 }),
                cand(4, "f2", { pool = "fallback" }) })
            assert.same({ "f2", "f1" }, providers(plan))
            assert.same({ "fallback", "fallback" }, degraded(plan))
            for _, c in ipairs(plan) do
                assert.is_nil(c.emergency)
            end
        end)

        it("uses the route with the shortest remaining cooldown as emergency", function()
            local plan = routing.route(req_with(), {
                cand(1, "m1", cooling(300000)), cand(2, "m2", cooling(45000)),
                cand(3, "f1", cooling(30000, { pool = "fallback" })),
                cand(4, "f2", cooling(90000, { pool = "fallback" })),
                cand(5, "off", cooling(1000, { pool = "fallback", available = false })) })
            assert.equal(1, #plan)
            assert.equal("f1", plan[1].provider)
            assert.equal(3, plan[1].index)
            assert.is_true(plan[1].emergency)
            assert.equal("emergency", plan[1].degraded)
        end)

        it("breaks emergency ties by configured order", function()
            local plan = routing.route(req_with(), {
                cand(1, "m1", cooling(40000)), cand(2, "m2", cooling(40000)) })
            assert.same({ "m1" }, providers(plan))
        end)

        it("returns {} when nothing is usable or cooling", function()
            local plan = routing.route(req_with(), {
                cand(1, "m1", { available = false }),
                cand(2, "f1", { pool = "fallback", available = false }),
                cand(3, "m2", cooling(20000, { available = false })) })
            assert.same({}, plan)
            assert.is_nil(plan.wait_ms)
        end)

        it("applies the chain after the request's filters", function()
            -- the only usable route is a smaller one the client did not accept
            local plan = routing.route(req_with(), {
                cand(1, "big", cooling(4000)), cand(2, "small", { smaller = true }) })
            assert.same({ wait_ms = 4000 }, plan)
        end)
    end)

    describe("plans that read nothing that moves", function()
        -- The core keeps a plan for as long as every field route() read is unchanged
        -- (luavm/keep.h; tests/unit/test_keep.c); these are the plans it can keep without
        -- asking again, and the ones it cannot: what the policy gives must not change with
        -- the numbers that move (req.random, headroom, in_flight, samples) where it did not
        -- read them.
        local function plan_of(req, list)
            local plan = routing.route(req, list)
            return { providers(plan), degraded(plan), plan.wait_ms }
        end

        it("one usable route, or one route per group: the same plan whatever moves", function()
            local moves = { {}, { headroom = 0.25 }, { in_flight = 7 },
                { avail_samples = 50, success_rate = 0.5, ttft_samples = 9, ttft_ms = 800 } }
            local builds = {
                function(x) return { cand(1, "a", x), cand(2, "b", { available = false }) } end,
                function(x) return { cand(1, "a", x), cand(2, "b", { priority = 1 }),
                    cand(3, "f", { pool = "fallback" }) } end,
                function(x) return { cand(1, "cloud", x), cand(2, "lan", { ["local"] = true }) } end,
            }
            for _, build in ipairs(builds) do
                local first = plan_of(req_with(), build({}))
                for _, r in ipairs({ 0.01, 0.3, 0.99 }) do
                    for _, x in ipairs(moves) do
                        assert.same(first, plan_of(req_with({ random = r }), build(x)))
                    end
                end
            end
        end)

        it("a wait, the other pool while the start pool cools, an emergency", function()
            assert.same({ wait_ms = 4000 }, routing.route(req_with(), { cand(1, "m", cooling(4000)),
                cand(2, "f", { pool = "fallback" }) }))
            assert.same({ "f" }, providers(routing.route(req_with(), { cand(1, "m", cooling(60000)),
                cand(2, "f", { pool = "fallback" }) })))
            assert.same({ "m" }, providers(routing.route(req_with(), { cand(1, "m", cooling(60000)) })))
        end)
    end)
end)
