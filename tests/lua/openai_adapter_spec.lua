local h = dofile("tests/lua/helper.lua")

describe("adapters/openai.lua", function()
    local openai
    local route = { provider = "local-vllm", model = "qwen3-8b-int4",
                    base_url = "http://127.0.0.1:8001/v1", pool = "main", ["local"] = true }

    local req = h.req

    before_each(function()
        openai = h.adapter("openai")
    end)

    it("is a passthrough module with name and version", function()
        assert.equal("openai", openai.name)
        assert.equal(1, openai.version)
        assert.is_true(openai.passthrough)
        assert.is_function(openai.encode)
    end)

    it("maps every endpoint to its path", function()
        local want = { chat = "/chat/completions", completions = "/completions",
                       embeddings = "/embeddings" }
        for endpoint, path in pairs(want) do
            local out = openai.encode(req(endpoint), route)
            assert.equal("POST", out.method)
            assert.equal(path, out.path)
            assert.is_nil(out.body)
            assert.equal("sse", out.stream_format)
        end
    end)

    it("uses the same path and format for streams", function()
        local out = openai.encode(req("chat", { stream = true, max_tokens = 64 }), route)
        assert.equal("/chat/completions", out.path)
        assert.equal("sse", out.stream_format)
        assert.is_nil(out.body) -- max_tokens travels in the core's canonical body
    end)

    it("sends no Authorization header without a key", function()
        assert.same({}, openai.encode(req("chat"), route).headers)
        local empty = h.util.copy(route)
        empty.api_key = ""
        assert.same({}, openai.encode(req("chat"), empty).headers)
    end)

    it("sends a Bearer token when a key is set, and no Content-Type", function()
        local keyed = h.util.copy(route)
        keyed.api_key = "sk-test"
        local headers = openai.encode(req("embeddings"), keyed).headers
        assert.same({ Authorization = "Bearer sk-test" }, headers)
    end)

    it("raises on an unknown endpoint", function()
        assert.has_error(function()
            openai.encode(req("audio"), route)
        end, "openai: unsupported endpoint audio")
    end)

    describe("check", function()
        it("accepts an http(s) base_url", function()
            assert.is_nil(openai.check({ id = "a", base_url = "http://127.0.0.1:8001/v1" }))
            assert.is_nil(openai.check({ id = "b", base_url = "https://api.openai.com/v1",
                                         api_key = "sk" }))
        end)

        it("returns an error string when base_url is missing or malformed", function()
            assert.matches("base_url is required", openai.check({ id = "a" }))
            assert.matches("base_url is required", openai.check({ id = "a", base_url = "" }))
            assert.matches("http", openai.check({ id = "a", base_url = "127.0.0.1:8001" }))
            assert.matches("must not end", openai.check({ id = "a", base_url = "http://x/v1/" }))
        end)
    end)

    describe("model list (GET /v1/models of a model_prefix provider)", function()
        it("asks {base_url}/models with the route's key, none without one", function()
            local keyed = { provider = "nim", base_url = "https://integrate.api.nvidia.com/v1", api_key = "nvapi-k" }
            local out = openai.list_models(keyed)
            assert.equal("/models", out.path)
            assert.equal("Bearer nvapi-k", out.headers.Authorization)
            assert.is_nil(next(openai.list_models(route).headers))
        end)

        it("reads the ids of an OpenAI list, skipping entries without one", function()
            local ids = openai.decode_models({ object = "list", data = { { id = "meta/a" }, { id = "" }, 7,
                { name = "x" }, { id = "meta/b" } } })
            assert.same({ "meta/a", "meta/b" }, ids)
            assert.same({}, openai.decode_models({ error = { message = "no" } }))
            assert.same({}, openai.decode_models("text"))
        end)
    end)
end)
