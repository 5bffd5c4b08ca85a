-- The three edits an operator is most likely to make, each one change of one line in one
-- file, applied to a copy of the shipped file: the comments at the top of policies/cooldown.lua
-- and policies/routing.lua name them. If a file no longer has the line an edit changes, or the
-- edited file misbehaves or fails its own selftest (the reload would be refused), this fails:
-- the files keep the shape these edits need. tests/e2e/operator_edits.test.mjs makes two of
-- them in a running gateway.
local h = dofile("tests/lua/helper.lua")

-- patched(path, old, new): the module of `path` with the one line `old` replaced by `new`
-- (old must be there exactly once), loaded as the core loads it, its selftest passed.
local function patched(path, old, new)
    assert(not old:find("\n", 1, true) and not new:find("\n", 1, true), "an edit is one line")
    local f = assert(io.open(path, "rb"))
    local src = f:read("a")
    f:close()
    local a, b = src:find(old, 1, true)
    assert(a, path .. " no longer has the line the edit changes: " .. old)
    assert(not src:find(old, b + 1, true), path .. " has the line twice: " .. old)
    local tmp = os.tmpname()
    f = assert(io.open(tmp, "wb"))
    f:write(src:sub(1, a - 1) .. new .. src:sub(b + 1))
    f:close()
    local ok, m = pcall(dofile, tmp)
    os.remove(tmp)
    assert(ok, m)
    assert(m.selftest == nil or pcall(m.selftest), path .. ": the edited file fails its selftest")
    return m
end

local provider = { id = "p", pool = "main" }

local function state(n)
    return { consecutive_429 = n, observing = false }
end

describe("an operator's edits", function()
    it("a gentler cooldown curve: BASE_S = 10", function()
        local cooldown = patched("policies/cooldown.lua", "local BASE_S = 30 ", "local BASE_S = 10 ")
        local got = {}
        for n = 1, 8 do
            got[n] = cooldown.on_response(provider, 429, {}, state(n)).cooldown_s
        end
        assert.same({ 10, 20, 40, 80, 160, 320, 600, 600 }, got)
        -- what the upstream asks for still wins when longer
        local r = cooldown.on_response(provider, 429, { ["retry-after"] = "45" }, state(1))
        assert.same({ cooldown_s = 45 }, r)
    end)

    it("cool down on 503 too", function()
        local shipped = dofile("policies/cooldown.lua")
        assert.is_nil(shipped.on_response(provider, 503, {}, state(0)))
        local cooldown = patched("policies/cooldown.lua", "local COOLS = { [429] = true }",
            "local COOLS = { [429] = true, [503] = true }")
        assert.same({ cooldown_s = 30 }, cooldown.on_response(provider, 503, {}, state(0)))
        assert.same({ cooldown_s = 120 },
            cooldown.on_response(provider, 503, { ["retry-after"] = "120" }, state(0)))
        assert.is_nil(cooldown.on_response(provider, 500, {}, state(0)))
        assert.same({ cooldown_s = 60 }, cooldown.on_response(provider, 429, {}, state(2)))
    end)

    it("ignore the engines' load: make M.load_factor return 1", function()
        local routing = patched("policies/routing.lua",
            '    if type(load) ~= "table" then return 1 end',
            "    do return 1 end")
        local function engines(busy_waiting)
            local base = { model = "m", pool = "main", ["local"] = true, smaller = false,
                           priority = 0, weight = 1, available = true, cooling = false,
                           headroom = 1, in_flight = 0, avail_samples = 0, ttft_samples = 0 }
            local idle, busy = {}, {}
            for k, v in pairs(base) do
                idle[k], busy[k] = v, v
            end
            idle.index, idle.provider, idle.load = 1, "idle", { running = 1, waiting = 0 }
            busy.index, busy.provider = 2, "busy"
            busy.load = { running = 4, waiting = busy_waiting }
            return { idle, busy }
        end
        local function firsts(r, busy_waiting)
            local n = 0
            for i = 1, 1000 do
                local req = { request_id = "r", random = (i - 0.5) / 1000, local_first = true,
                              allow_cloud = true }
                n = n + (r.route(req, engines(busy_waiting))[1].provider == "idle" and 1 or 0)
            end
            return n / 1000
        end
        -- edited: the load is not looked at
        assert.near(0.5, firsts(routing, 9), 0.03)
        assert.near(0.5, firsts(routing, 0), 0.03)
        -- the shipped policy prefers the idle engine: shares 1/2 and 1/(1 + 4 + 18)
        assert.near(0.5 / (0.5 + 1 / 23), firsts(dofile("policies/routing.lua"), 9), 0.03)
    end)
end)

