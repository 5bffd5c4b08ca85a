local h = dofile("tests/lua/helper.lua")

local function cand(index, provider, extra)
    local c = { index = index, provider = provider, model = provider .. "-model", pool = "main",
                ["local"] = false, weight = 1, available = true, in_flight = 0 }
    for k, v in pairs(extra or {}) do
        c[k] = v
    end
    return c
end

local function providers(list)
    local out = {}
    for i, c in ipairs(list) do
        out[i] = c.provider
    end
    return out
end

describe("policies/routing.lua", function()
    local routing
    local req = { request_id = "r1", endpoint = "chat", model = "general-chat", stream = false,
                  created = 1700000000 }

    before_each(function()
        routing = dofile("policies/routing.lua")
    end)

    it("is a module with name, version and route", function()
        assert.equal("routing", routing.name)
        assert.equal(1, routing.version)
        assert.is_function(routing.route)
    end)

    it("keeps the configured order when all are available", function()
        local c = { cand(1, "a"), cand(2, "b"), cand(3, "c") }
        assert.same({ "a", "b", "c" }, providers(routing.route(req, c)))
    end)

    it("skips candidates with available == false", function()
        local c = { cand(1, "a", { available = false }), cand(2, "b"), cand(3, "c", { available = false }) }
        assert.same({ "b" }, providers(routing.route(req, c)))
    end)

    it("treats a missing available field as available", function()
        local c = { cand(1, "a"), cand(2, "b") }
        c[1].available = nil
        assert.same({ "a", "b" }, providers(routing.route(req, c)))
    end)

    it("orders by index even if given out of order", function()
        local c = { cand(3, "c"), cand(1, "a"), cand(2, "b") }
        assert.same({ "a", "b", "c" }, providers(routing.route(req, c)))
    end)

    it("returns the given tables themselves, not copies", function()
        local c = { cand(1, "a"), cand(2, "b") }
        local out = routing.route(req, c)
        assert.equal(c[1], out[1])
        assert.equal(c[2], out[2])
    end)

    it("returns an empty list when nothing is available", function()
        local c = { cand(1, "a", { available = false }) }
        assert.same({}, routing.route(req, c))
        assert.same({}, routing.route(req, {}))
    end)

    it("does not modify the candidates list", function()
        local c = { cand(2, "b"), cand(1, "a", { available = false }) }
        routing.route(req, c)
        assert.same({ "b", "a" }, providers(c))
    end)

    it("selftest passes", function()
        assert.has_no.errors(function()
            routing.selftest()
        end)
    end)
end)
