dofile("tests/lua/helper.lua")

describe("policies/cooldown.lua", function()
    local cooldown
    local provider = { id = "nvidia-1", pool = "main", rpm_limit = 40, weight = 1 }

    local function state(n, observing)
        return { consecutive_429 = n, observing = observing or false }
    end

    before_each(function()
        cooldown = dofile("policies/cooldown.lua")
    end)

    it("is a module with name, version, backoff, on_response and selftest", function()
        assert.equal("cooldown", cooldown.name)
        assert.equal(1, cooldown.version)
        assert.is_function(cooldown.backoff)
        assert.is_function(cooldown.on_response)
        assert.is_function(cooldown.selftest)
    end)

    it("selftest passes", function()
        assert.has_no.errors(function()
            cooldown.selftest()
        end)
    end)

    describe("backoff", function()
        it("follows 30 s * 2^(n-1), at most 600 s", function()
            local got = {}
            for n = 1, 7 do
                got[n] = cooldown.backoff(n)
            end
            assert.same({ 30, 60, 120, 240, 480, 600, 600 }, got)
        end)

        it("stays at 600 s for long streaks", function()
            assert.equal(600, cooldown.backoff(50))
            assert.equal(600, cooldown.backoff(5000))
        end)

        it("returns whole seconds", function()
            assert.equal("integer", math.type(cooldown.backoff(3)))
            assert.equal("integer", math.type(cooldown.backoff(100)))
        end)

        it("treats a count below 1 as the first 429", function()
            assert.equal(30, cooldown.backoff(0))
            assert.equal(30, cooldown.backoff(nil))
        end)
    end)

    describe("on_response", function()
        it("cools a provider down on 429 by the backoff curve", function()
            for n, s in ipairs({ 30, 60, 120, 240, 480, 600, 600 }) do
                assert.same({ cooldown_s = s }, cooldown.on_response(provider, 429, {}, state(n)))
            end
        end)

        it("doubles after a 429 on the first request after a cooldown", function()
            local r = cooldown.on_response(provider, 429, {}, state(2, true))
            assert.same({ cooldown_s = 60 }, r)
        end)

        it("lets a larger Retry-After win", function()
            local r = cooldown.on_response(provider, 429, { ["retry-after"] = "120" }, state(1))
            assert.same({ cooldown_s = 120 }, r)
            r = cooldown.on_response(provider, 429, { ["retry-after"] = "3600" }, state(6))
            assert.same({ cooldown_s = 3600 }, r)
        end)

        it("keeps the backoff when Retry-After is smaller", function()
            local r = cooldown.on_response(provider, 429, { ["retry-after"] = "5" }, state(3))
            assert.same({ cooldown_s = 120 }, r)
        end)

        it("rounds a fractional Retry-After up and accepts surrounding spaces", function()
            local r = cooldown.on_response(provider, 429, { ["retry-after"] = " 45.2 " }, state(1))
            assert.same({ cooldown_s = 46 }, r)
        end)

        it("reads retry-after-ms too, the larger of the two winning", function()
            local r = cooldown.on_response(provider, 429, { ["retry-after-ms"] = "90500" }, state(1))
            assert.same({ cooldown_s = 91 }, r)
            r = cooldown.on_response(provider, 429,
                { ["retry-after"] = "100", ["retry-after-ms"] = "40000" }, state(1))
            assert.same({ cooldown_s = 100 }, r)
        end)

        it("ignores a Retry-After it cannot read (HTTP-date, garbage, negative)", function()
            for _, v in ipairs({ "Wed, 21 Oct 2015 07:28:00 GMT", "soon", "", "-10", "1e999" }) do
                local r = cooldown.on_response(provider, 429, { ["retry-after"] = v }, state(2))
                assert.same({ cooldown_s = 60 }, r)
            end
        end)

        it("follows the reset time of a rate-limit window the upstream says is used up", function()
            local r = cooldown.on_response(provider, 429,
                { ["x-ratelimit-reset-requests"] = "1m30s" }, state(1))
            assert.same({ cooldown_s = 90 }, r)
            r = cooldown.on_response(provider, 429, { ["x-ratelimit-reset-tokens"] = "6m0s",
                ["x-ratelimit-remaining-tokens"] = "0" }, state(1))
            assert.same({ cooldown_s = 360 }, r)
            r = cooldown.on_response(provider, 429, { ["x-ratelimit-reset-requests"] = "1h2m3.5s",
                ["retry-after"] = "10" }, state(1))
            assert.same({ cooldown_s = 3724 }, r)
            r = cooldown.on_response(provider, 429, { ["x-ratelimit-reset-requests"] = "45" }, state(1))
            assert.same({ cooldown_s = 45 }, r)
        end)

        it("ignores the reset time of a window with requests or tokens left, or unreadable", function()
            local r = cooldown.on_response(provider, 429, { ["x-ratelimit-reset-tokens"] = "5m",
                ["x-ratelimit-remaining-tokens"] = "1200" }, state(1))
            assert.same({ cooldown_s = 30 }, r)
            for _, v in ipairs({ "soon", "5x", "", "m", "1.2.3s" }) do
                r = cooldown.on_response(provider, 429, { ["x-ratelimit-reset-requests"] = v }, state(1))
                assert.same({ cooldown_s = 30 }, r)
            end
        end)

        it("works without headers or state", function()
            assert.same({ cooldown_s = 30 }, cooldown.on_response(provider, 429, nil, nil))
        end)

        it("returns nil for every status but 429", function()
            for _, status in ipairs({ 200, 201, 400, 401, 403, 404, 422, 500, 502, 503, 504 }) do
                assert.is_nil(cooldown.on_response(provider, status, { ["retry-after"] = "60" },
                                                   state(3)))
            end
        end)

        it("returns nil for the first success after a cooldown", function()
            assert.is_nil(cooldown.on_response(provider, 200, {}, state(0, true)))
        end)
    end)
end)
