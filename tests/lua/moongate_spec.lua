-- The gateway's moongate C module as busted loads it (build/lua/moongate.so: the same code the
-- gateway runs, core/luavm/lmod.c and order.c): what policies and adapters may call.
local h = dofile("tests/lua/helper.lua")
local moongate, util = h.moongate, h.util

describe("the moongate module", function()
    it("says its versions", function()
        assert.equal(1, moongate.api_version)
        assert.is_string(moongate.version)
    end)

    it("converts JSON with util.null and util.array_mt", function()
        local v = moongate.json_decode('{"a":null,"b":[],"c":[1,2]}')
        assert.equal(util.null, v.a)
        assert.equal(util.array_mt, getmetatable(v.b))
        local again = moongate.json_encode(v)
        assert.truthy(again:find('"a":null', 1, true) and again:find('"b":[]', 1, true)
                      and again:find('"c":[1,2]', 1, true))
        assert.is_nil((moongate.json_decode("{nope")))
    end)

    it("hashes", function()
        assert.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                     moongate.sha256_hex("abc"))
    end)

    it("draws: chance(p) is true for a share p of requests, the rest stays uniform", function()
        local yes, first_after = 0, { [true] = 0, [false] = 0 }
        for i = 1, 1000 do
            local d = moongate.draw({ random = (i - 0.5) / 1000 })
            local c = d:chance(0.2)
            yes = yes + (c and 1 or 0)
            -- the next weighted draw over two equal values is fair in both parts
            local o = moongate.weighted_order({ "a", "b" }, nil, d)
            if o[1] == "a" then first_after[c] = first_after[c] + 1 end
        end
        assert.equal(200, yes)
        assert.near(100, first_after[true], 5)
        assert.near(400, first_after[false], 10)
    end)

    it("orders by functions of the values, and keys only when every value has one", function()
        local l = { { n = "x", w = 0, k = 2 }, { n = "y", w = 1, k = 1 }, { n = "z", w = 1 } }
        local function names(list)
            local out = {}
            for i, v in ipairs(list) do out[i] = v.n end
            return table.concat(out)
        end
        local weight = function(v) return v.w end
        local key = function(v) return v.k end
        assert.equal("yx", names(moongate.sort_by({ l[1], l[2] }, key)))
        assert.equal("xyz", names(moongate.sort_by(l, key))) -- z has no key: list order
        for i = 1, 20 do
            local o = moongate.weighted_order(l, weight, moongate.draw({ random = i / 21 }))
            assert.equal("x", o[3].n) -- no weight: last
        end
        assert.has_error(function() moongate.sort_by(l, function() return "x" end) end)
    end)
end)
