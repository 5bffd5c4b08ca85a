local h = dofile("tests/lua/helper.lua")

describe("adapters/openai_responses.lua", function()
    local a
    local route = { provider = "openai-responses", model = "gpt-5-mini",
                    base_url = "https://api.openai.com/v1", pool = "fallback" }

    local req = h.req

    before_each(function()
        a = h.adapter("openai_responses")
    end)

    it("is a passthrough module that speaks the Responses wire natively", function()
        assert.equal("openai_responses", a.name)
        assert.equal(1, a.version)
        assert.is_true(a.passthrough)
        assert.equal("responses", a.entry_wire)
    end)

    it("sends a Responses client's request to /responses, the body the core's", function()
        local out = a.encode(req("chat", { entry = { wire = "responses" }, stream = true }), route)
        assert.equal("POST", out.method)
        assert.equal("/responses", out.path)
        assert.is_nil(out.body)
        assert.equal("sse", out.stream_format)
    end)

    it("serves the other endpoints as the openai adapter", function()
        local want = { chat = "/chat/completions", completions = "/completions",
                       embeddings = "/embeddings" }
        for endpoint, path in pairs(want) do
            assert.equal(path, a.encode(req(endpoint), route).path)
        end
        -- another wire's entry (a Messages client) is not a Responses request
        assert.equal("/chat/completions", a.encode(req("chat", { entry = { wire = "anthropic" } }), route).path)
    end)

    it("refuses an endpoint it has no path for, as not for this route", function()
        local ok, err = pcall(a.encode, req("rerank"), route)
        assert.is_false(ok)
        assert.matches("unsupported endpoint rerank", tostring(type(err) == "table" and err.message or err))
    end)

    it("sends the key as a Bearer token only when set", function()
        assert.same({}, a.encode(req("chat"), route).headers)
        local keyed = h.util.copy(route)
        keyed.api_key = "sk-test"
        assert.same({ Authorization = "Bearer sk-test" }, a.encode(req("chat", { entry = { wire = "responses" } }), keyed).headers)
    end)

    it("checks base_url", function()
        assert.is_nil(a.check({ base_url = "https://api.openai.com/v1" }))
        assert.matches("required", a.check({}))
        assert.matches("http", a.check({ base_url = "api.openai.com/v1" }))
        assert.matches("must not end", a.check({ base_url = "https://api.openai.com/v1/" }))
    end)
end)
