local h = dofile("tests/lua/helper.lua")
local util, json = h.util, h.json
local null, array = util.null, util.array

local route = { provider = "local-ollama", model = "llama3.2", base_url = "http://127.0.0.1:11434",
                pool = "main", ["local"] = true }

-- A request as the core hands it to a non-passthrough adapter: body sanitized, arrays marked.
local function req(endpoint, body, extra)
    return h.req(endpoint, { body = body or {} }, extra or {})
end

local function msgs(...)
    return array({ ... })
end

-- Every field OpenAI puts in a chat.completion.chunk choice, present and well-typed.
local function assert_chat_chunk(c, r)
    assert.equal("chat.completion.chunk", c.object)
    assert.equal("chatcmpl-" .. r.request_id, c.id)
    assert.equal(r.created, c.created)
    assert.is_string(c.model)
    assert.is_true(util.is_array(c.choices))
    for i, ch in ipairs(c.choices) do
        assert.equal(i - 1, ch.index)
        assert.is_table(ch.delta)
        assert.is_false(util.is_array(ch.delta)) -- an object, also when empty
        assert.equal(null, ch.logprobs)
        assert.is_true(ch.finish_reason == null or type(ch.finish_reason) == "string")
    end
end

-- The refusal fn() raises: its kind ("not_for_route" / "invalid_request"), message and param.
local function refusal(fn)
    local ok, err = pcall(fn)
    assert.is_false(ok, "expected a refusal")
    local r = util.refusal_of(err)
    assert.is_table(r, "expected a refusal, got: " .. tostring(err))
    return r
end

local function run_stream(adapter, r, lines)
    local state, chunks = {}, {}
    for _, line in ipairs(lines) do
        local out = adapter.decode_event(r, line, state)
        assert.is_true(util.is_array(out) or #out == 0)
        for _, c in ipairs(out) do
            chunks[#chunks + 1] = c
        end
    end
    return chunks, state
end

describe("adapters/ollama.lua", function()
    local ollama

    before_each(function()
        ollama = h.adapter("ollama")
    end)

    it("is a non-passthrough module with all functions", function()
        assert.equal("ollama", ollama.name)
        assert.equal(1, ollama.version)
        assert.is_false(ollama.passthrough)
        for _, fn in ipairs({ "check", "encode", "decode", "decode_event" }) do
            assert.is_function(ollama[fn])
        end
    end)

    describe("check", function()
        it("accepts the server root", function()
            assert.is_nil(ollama.check({ id = "o", base_url = "http://127.0.0.1:11434" }))
        end)

        it("rejects a missing, malformed or /v1 base_url with a message", function()
            assert.matches("base_url is required", ollama.check({ id = "o" }))
            assert.matches("http", ollama.check({ id = "o", base_url = "localhost:11434" }))
            assert.matches("must not end", ollama.check({ id = "o", base_url = "http://h:11434/" }))
            assert.matches("openai adapter", ollama.check({ id = "o", base_url = "http://h:11434/v1" }))
        end)
    end)

    describe("encode", function()
        it("maps chat to /api/chat with model, messages, explicit stream and ndjson", function()
            local body = { model = "llama3.2", messages = msgs({ role = "user", content = "Hi" }) }
            local out = ollama.encode(req("chat", body), route)
            assert.equal("POST", out.method)
            assert.equal("/api/chat", out.path)
            assert.equal("ndjson", out.stream_format)
            assert.same({}, out.headers)
            assert.equal("llama3.2", out.body.model)
            assert.is_false(out.body.stream)
            assert.same({ { role = "user", content = "Hi" } }, out.body.messages)
            assert.is_true(util.is_array(out.body.messages))
            assert.is_nil(out.body.options)
            assert.is_nil(out.body.format)
            assert.is_nil(out.body.tools)
            -- as the core would send it
            local wire = h.roundtrip(out.body)
            assert.is_false(wire.stream)
        end)

        it("sets stream = true for a streaming request", function()
            local body = { messages = msgs({ role = "user", content = "Hi" }), stream = true }
            local out = ollama.encode(req("chat", body, { stream = true }), route)
            assert.is_true(out.body.stream)
        end)

        it("uses route.model, not the client's model", function()
            local body = { model = "general-chat", messages = msgs({ role = "user", content = "x" }) }
            assert.equal("llama3.2", ollama.encode(req("chat", body), route).body.model)
        end)

        it("maps max_tokens and sampling parameters to options", function()
            local body = { messages = msgs({ role = "user", content = "Hi" }), max_tokens = 64,
                           temperature = 0.2, top_p = 0.9, seed = 42, stop = "\n\n",
                           frequency_penalty = 0.5, presence_penalty = 0.25 }
            local o = ollama.encode(req("chat", body, { max_tokens = 64 }), route).body.options
            assert.same({ num_predict = 64, temperature = 0.2, top_p = 0.9, seed = 42,
                          stop = { "\n\n" }, frequency_penalty = 0.5, presence_penalty = 0.25 }, o)
            assert.is_true(util.is_array(o.stop))
        end)

        it("takes num_predict from req.max_tokens or max_completion_tokens too", function()
            local m = msgs({ role = "user", content = "Hi" })
            local o1 = ollama.encode(req("chat", { messages = m }, { max_tokens = 10 }), route)
            assert.equal(10, o1.body.options.num_predict)
            local o2 = ollama.encode(req("chat", { messages = m, max_completion_tokens = 12 }), route)
            assert.equal(12, o2.body.options.num_predict)
        end)

        it("treats JSON null fields as absent", function()
            local body = { messages = msgs({ role = "user", content = "Hi" }), temperature = null,
                           stop = null, max_tokens = null, response_format = null, tools = null }
            local out = ollama.encode(req("chat", body), route)
            assert.is_nil(out.body.options)
            assert.is_nil(out.body.format)
            assert.is_nil(out.body.tools)
        end)

        it("keeps stop arrays", function()
            local body = { messages = msgs({ role = "user", content = "Hi" }),
                           stop = array({ "a", "b" }) }
            assert.same({ "a", "b" }, ollama.encode(req("chat", body), route).body.options.stop)
        end)

        it("maps response_format to format", function()
            local m = msgs({ role = "user", content = "Hi" })
            local b1 = { messages = m, response_format = { type = "json_object" } }
            assert.equal("json", ollama.encode(req("chat", b1), route).body.format)
            local schema = { type = "object", properties = { a = { type = "string" } } }
            local b2 = { messages = m, response_format = { type = "json_schema",
                         json_schema = { name = "x", schema = schema } } }
            assert.same(schema, ollama.encode(req("chat", b2), route).body.format)
            local b3 = { messages = m, response_format = { type = "text" } }
            assert.is_nil(ollama.encode(req("chat", b3), route).body.format)
        end)

        it("joins text parts and moves data: images to images[]", function()
            local content = array({
                { type = "text", text = "What is in" },
                { type = "text", text = "this picture?" },
                { type = "image_url", image_url = { url = "data:image/png;base64,iVBORw0KGgo=" } },
            })
            local body = { messages = msgs({ role = "system", content = "Be brief." },
                                           { role = "user", content = content }) }
            local m = ollama.encode(req("chat", body), route).body.messages
            assert.same({ role = "system", content = "Be brief." }, m[1])
            assert.equal("What is in\nthis picture?", m[2].content)
            assert.same({ "iVBORw0KGgo=" }, m[2].images)
            assert.is_true(util.is_array(m[2].images))
        end)

        it("refuses image URLs Ollama cannot fetch and unknown part types", function()
            local function enc(part)
                local body = { messages = msgs({ role = "user", content = array({ part }) }) }
                return function()
                    ollama.encode(req("chat", body), route)
                end
            end
            local r = refusal(enc({ type = "image_url", image_url = { url = "https://x/cat.png" } }))
            assert.equal("not_for_route", r.refusal)
            assert.matches("Ollama cannot fetch image URLs", r.message)
            assert.equal("messages[0].content[0].image_url.url", r.param)
            for _, t in ipairs({ "input_audio", "file" }) do
                r = refusal(enc({ type = t, [t] = {} }))
                assert.equal("not_for_route", r.refusal)
                assert.equal("messages[0].content[0].type", r.param)
                assert.matches(t, r.message)
            end
        end)

        it("maps developer to system and null content to an empty string", function()
            local body = { messages = msgs({ role = "developer", content = "Rules" },
                                           { role = "assistant", content = null }) }
            local m = ollama.encode(req("chat", body), route).body.messages
            assert.same({ role = "system", content = "Rules" }, m[1])
            assert.same({ role = "assistant", content = "" }, m[2])
        end)

        it("passes tools through and converts tool-call history", function()
            local tools = array({ { type = "function", ["function"] = {
                name = "get_current_weather", description = "Weather",
                parameters = { type = "object", properties = { location = { type = "string" } } } } } })
            local body = { tools = tools, messages = msgs(
                { role = "user", content = "Weather in Paris?" },
                { role = "assistant", content = null, tool_calls = array({
                    { id = "call_1", type = "function", ["function"] = {
                        name = "get_current_weather", arguments = '{"location":"Paris, FR"}' } } }) },
                { role = "tool", tool_call_id = "call_1", content = "22C" }) }
            local out = ollama.encode(req("chat", body), route).body
            assert.equal(tools, out.tools)
            assert.same({ { ["function"] = { name = "get_current_weather",
                                             arguments = { location = "Paris, FR" } } } },
                        out.messages[2].tool_calls)
            assert.same({ role = "tool", content = "22C", tool_name = "get_current_weather" },
                        out.messages[3])
        end)

        it("refuses tool-call arguments that are not JSON", function()
            local body = { messages = msgs({ role = "assistant", content = "", tool_calls = array({
                { id = "c", type = "function", ["function"] = { name = "f", arguments = "{oops" } } }) }) }
            local r = refusal(function()
                ollama.encode(req("chat", body), route)
            end)
            assert.equal("invalid_request", r.refusal)
            assert.equal("messages[0].tool_calls[0].function.arguments", r.param)
        end)

        it("maps completions to /api/generate", function()
            local body = { prompt = "Why is the sky blue?", max_tokens = 20, temperature = 0 }
            local out = ollama.encode(req("completions", body, { stream = true }), route)
            assert.equal("/api/generate", out.path)
            assert.equal("ndjson", out.stream_format)
            assert.same({ model = "llama3.2", prompt = "Why is the sky blue?", stream = true,
                          options = { num_predict = 20, temperature = 0 } }, out.body)
        end)

        it("takes an array of one prompt, refuses several and token prompts", function()
            local out = ollama.encode(req("completions", { prompt = array({ "one" }) }), route)
            assert.equal("one", out.body.prompt)
            assert.is_false(out.body.stream)
            local several = refusal(function()
                ollama.encode(req("completions", { prompt = array({ "one", "two" }) }), route)
            end)
            assert.same({ "not_for_route", "prompt" }, { several.refusal, several.param })
            local r = refusal(function()
                ollama.encode(req("completions", { prompt = array({ 1, 2, 3 }) }), route)
            end)
            assert.same({ "not_for_route", "prompt" }, { r.refusal, r.param })
        end)

        it("maps embeddings to /api/embed with string or array input", function()
            local out = ollama.encode(req("embeddings", { input = "hello" }), route)
            assert.equal("/api/embed", out.path)
            assert.same({ model = "llama3.2", input = "hello" }, out.body)
            local arr = ollama.encode(req("embeddings", { input = array({ "a", "b" }) }), route)
            assert.same({ "a", "b" }, arr.body.input)
            assert.is_true(util.is_array(arr.body.input))
            assert.is_nil(arr.body.stream)
            for _, input in ipairs({ array({ array({ 1, 2 }) }), array({ 1, 2 }) }) do
                local r = refusal(function()
                    ollama.encode(req("embeddings", { input = input }), route)
                end)
                assert.same({ "not_for_route", "input" }, { r.refusal, r.param })
            end
        end)

        it("sends a Bearer token only when a key is set", function()
            local keyed = util.copy(route)
            keyed.api_key = "secret"
            local out = ollama.encode(req("embeddings", { input = "x" }), keyed)
            assert.same({ Authorization = "Bearer secret" }, out.headers)
        end)

        it("refuses an unknown endpoint as not for this route", function()
            assert.equal("not_for_route", refusal(function()
                ollama.encode(req("audio", {}), route)
            end).refusal)
        end)
    end)

    describe("decode", function()
        it("turns /api/chat into a chat.completion", function()
            local r = req("chat")
            local out = ollama.decode(r, h.fixture("ollama/chat.json"))
            assert.same({
                id = "chatcmpl-req-1", object = "chat.completion", created = 1700000000,
                model = "llama3.2",
                choices = { { index = 0, logprobs = null, finish_reason = "stop",
                              message = { role = "assistant", content = "Hello! How are you today?",
                                          refusal = null } } },
                usage = { prompt_tokens = 26, completion_tokens = 298, total_tokens = 324 },
            }, out)
            assert.is_true(util.is_array(out.choices))
        end)

        it("maps done_reason length", function()
            local out = ollama.decode(req("chat"), h.fixture("ollama/chat_length.json"))
            assert.equal("length", out.choices[1].finish_reason)
        end)

        it("defaults missing counts to 0", function()
            local resp = h.fixture("ollama/chat.json")
            resp.prompt_eval_count = nil -- Ollama omits it when the prompt was cached
            local out = ollama.decode(req("chat"), resp)
            assert.same({ prompt_tokens = 0, completion_tokens = 298, total_tokens = 298 }, out.usage)
        end)

        it("returns tool calls in OpenAI shape", function()
            local out = ollama.decode(req("chat"), h.fixture("ollama/chat_tools.json"))
            local choice = out.choices[1]
            assert.equal("tool_calls", choice.finish_reason)
            assert.equal(null, choice.message.content)
            local call = choice.message.tool_calls[1]
            assert.equal("call_req-1_0", call.id)
            assert.equal("function", call.type)
            assert.equal("get_current_weather", call["function"].name)
            assert.is_string(call["function"].arguments)
            assert.same({ format = "celsius", location = "Paris, FR" },
                        json.decode(call["function"].arguments))
        end)

        it("turns /api/generate into a text_completion", function()
            local out = ollama.decode(req("completions"), h.fixture("ollama/generate.json"))
            assert.same({
                id = "cmpl-req-1", object = "text_completion", created = 1700000000,
                model = "llama3.2",
                choices = { { index = 0, logprobs = null, finish_reason = "stop",
                              text = "The sky is blue because it is the color of the sky." } },
                usage = { prompt_tokens = 26, completion_tokens = 290, total_tokens = 316 },
            }, out)
        end)

        it("turns /api/embed into an embedding list", function()
            local resp = h.fixture("ollama/embed.json")
            local out = ollama.decode(req("embeddings", { input = array({ "a", "b" }) }), resp)
            assert.equal("list", out.object)
            assert.equal("all-minilm", out.model)
            assert.same({ prompt_tokens = 8, total_tokens = 8 }, out.usage)
            assert.is_true(util.is_array(out.data))
            assert.equal(2, #out.data)
            for i, d in ipairs(out.data) do
                assert.equal("embedding", d.object)
                assert.equal(i - 1, d.index)
                assert.equal(resp.embeddings[i], d.embedding)
            end
        end)

        it("packs embeddings as float32 base64 when asked", function()
            local resp = { model = "m", embeddings = array({ array({ 1.0, -2.0, 0.5 }) }),
                           prompt_eval_count = 1 }
            local out = ollama.decode(req("embeddings", { input = "a", encoding_format = "base64" }), resp)
            local b64 = out.data[1].embedding
            assert.is_string(b64)
            -- 1.0, -2.0, 0.5 as little-endian float32: 0000803f 000000c0 0000003f
            assert.equal("AACAPwAAAMAAAAA/", b64)
        end)

        it("raises on an error body", function()
            assert.has_error(function()
                ollama.decode(req("chat"), { error = "model 'nope' not found" })
            end, "ollama: model 'nope' not found")
        end)
    end)

    describe("decode_event", function()
        it("turns an /api/chat stream into chat.completion.chunks", function()
            local r = req("chat", {}, { stream = true })
            local chunks, state = run_stream(ollama, r, h.ndjson("ollama/chat_stream.ndjson"))
            assert.equal(6, #chunks)
            for _, c in ipairs(chunks) do
                assert_chat_chunk(c, r)
            end
            assert.same({ role = "assistant", content = "The" }, chunks[1].choices[1].delta)
            assert.same({ content = " sky" }, chunks[2].choices[1].delta)
            local text = {}
            for i = 1, 5 do
                assert.equal(null, chunks[i].choices[1].finish_reason)
                assert.is_nil(chunks[i].usage)
                text[i] = chunks[i].choices[1].delta.content
            end
            assert.equal("The sky is blue.", table.concat(text))
            local last = chunks[6]
            assert.same({}, last.choices[1].delta)
            assert.equal("stop", last.choices[1].finish_reason)
            assert.same({ prompt_tokens = 26, completion_tokens = 5, total_tokens = 31 }, last.usage)
            assert.is_true(state.done)
        end)

        it("produces chunks that serialize as OpenAI expects", function()
            local r = req("chat", {}, { stream = true })
            local chunks = run_stream(ollama, r, h.ndjson("ollama/chat_stream.ndjson"))
            local first = json.encode(chunks[1])
            assert.matches('"choices":%[{', first)
            assert.matches('"finish_reason":null', first)
            assert.matches('"logprobs":null', first)
            assert.matches('"delta":{}', json.encode(chunks[6]))
        end)

        it("leaves state.done unset until the final line", function()
            local r = req("chat", {}, { stream = true })
            local lines = h.ndjson("ollama/chat_stream.ndjson")
            table.remove(lines) -- a truncated stream
            local _, state = run_stream(ollama, r, lines)
            assert.is_nil(state.done)
        end)

        it("skips empty non-final lines once started", function()
            local r = req("chat", {}, { stream = true })
            local state = { started = true }
            local out = ollama.decode_event(r, { model = "m", done = false,
                message = { role = "assistant", content = "" } }, state)
            assert.equal(0, #out)
        end)

        it("emits the role chunk even when the first line is the final one", function()
            local r = req("chat", {}, { stream = true })
            local chunks, state = run_stream(ollama, r, { { model = "m", done = true,
                done_reason = "stop", message = { role = "assistant", content = "" },
                eval_count = 0 } })
            assert.equal(2, #chunks)
            assert.same({ role = "assistant", content = "" }, chunks[1].choices[1].delta)
            assert.equal("stop", chunks[2].choices[1].finish_reason)
            assert.same({ prompt_tokens = 0, completion_tokens = 0, total_tokens = 0 }, chunks[2].usage)
            assert.is_true(state.done)
        end)

        it("streams tool calls with an index and finishes with tool_calls", function()
            local r = req("chat", {}, { stream = true })
            local chunks, state = run_stream(ollama, r, h.ndjson("ollama/chat_stream_tools.ndjson"))
            assert.equal(2, #chunks)
            for _, c in ipairs(chunks) do
                assert_chat_chunk(c, r)
            end
            local delta = chunks[1].choices[1].delta
            assert.equal("assistant", delta.role)
            local call = delta.tool_calls[1]
            assert.equal(0, call.index)
            assert.equal("function", call.type)
            assert.equal("get_current_weather", call["function"].name)
            assert.same({ format = "celsius", location = "Paris, FR" },
                        json.decode(call["function"].arguments))
            assert.equal("tool_calls", chunks[2].choices[1].finish_reason)
            assert.is_true(state.done)
        end)

        it("raises on an error line", function()
            local r = req("chat", {}, { stream = true })
            local lines = h.ndjson("ollama/chat_stream_error.ndjson")
            local state = {}
            assert.equal(1, #ollama.decode_event(r, lines[1], state))
            assert.has_error(function()
                ollama.decode_event(r, lines[2], state)
            end, "ollama: an error was encountered while running the model: unexpected EOF")
            assert.is_nil(state.done)
        end)

        it("turns an /api/generate stream into text_completion chunks", function()
            local r = req("completions", {}, { stream = true })
            local chunks, state = run_stream(ollama, r, h.ndjson("ollama/generate_stream.ndjson"))
            assert.equal(4, #chunks)
            local text = {}
            for i, c in ipairs(chunks) do
                assert.equal("text_completion", c.object)
                assert.equal("cmpl-req-1", c.id)
                assert.equal(1700000000, c.created)
                assert.equal("llama3.2", c.model)
                assert.is_true(util.is_array(c.choices))
                assert.equal(0, c.choices[1].index)
                assert.equal(null, c.choices[1].logprobs)
                text[i] = c.choices[1].text
            end
            assert.equal("The sky is blue", table.concat(text))
            assert.equal(null, chunks[1].choices[1].finish_reason)
            assert.equal("length", chunks[4].choices[1].finish_reason)
            assert.same({ prompt_tokens = 26, completion_tokens = 3, total_tokens = 29 }, chunks[4].usage)
            assert.is_true(state.done)
        end)
    end)

    describe("parameter fidelity", function()
        local weather = { type = "function", ["function"] = { name = "weather",
            parameters = { type = "object" } } }
        local clock = { type = "function", ["function"] = { name = "clock",
            parameters = { type = "object" } } }
        local function chat(extra)
            local body = { messages = msgs({ role = "user", content = "hi" }) }
            for k, v in pairs(extra) do
                body[k] = v
            end
            return ollama.encode(req("chat", body), route).body
        end

        it("tool_choice none sends no tools, auto all of them", function()
            local tools = array({ weather, clock })
            assert.is_nil(chat({ tools = tools, tool_choice = "none" }).tools)
            local auto = chat({ tools = tools, tool_choice = "auto" })
            assert.equal(2, #auto.tools)
            assert.equal(1, #auto.messages) -- no instruction
        end)

        it("a named tool_choice sends only that tool and asks for it", function()
            local out = chat({ tools = array({ weather, clock }),
                tool_choice = { type = "function", ["function"] = { name = "clock" } } })
            assert.equal(1, #out.tools)
            assert.equal("clock", out.tools[1]["function"].name)
            assert.equal("system", out.messages[1].role)
            assert.matches("`clock`", out.messages[1].content)
            assert.equal("hi", out.messages[2].content)
            local r = refusal(function()
                chat({ tools = array({ weather }),
                    tool_choice = { type = "function", ["function"] = { name = "nope" } } })
            end)
            assert.same({ "invalid_request", "tool_choice" }, { r.refusal, r.param })
        end)

        it("required asks for a call, in the client's own system message", function()
            local body = { tools = array({ weather }), tool_choice = "required",
                messages = msgs({ role = "system", content = "Be brief." },
                                { role = "user", content = "hi" }) }
            local out = ollama.encode(req("chat", body), route).body
            assert.equal(2, #out.messages)
            assert.matches("^Be brief%.\n\nYou must answer by calling one of the provided tools",
                out.messages[1].content)
            assert.equal(1, #out.tools)
        end)

        it("allowed_tools keeps the tools it lists", function()
            local out = chat({ tools = array({ weather, clock }), tool_choice = { type = "allowed_tools",
                allowed_tools = { mode = "auto", tools = array({ { type = "function", name = "weather" } }) } } })
            assert.equal(1, #out.tools)
            assert.equal("weather", out.tools[1]["function"].name)
        end)

        it("refuses what Ollama cannot do, naming the parameter", function()
            local cases = {
                { "n", 2 }, { "logprobs", true }, { "top_logprobs", 3 },
                { "logit_bias", { ["50256"] = -100 } }, { "audio", { voice = "alloy" } },
                { "modalities", array({ "text", "audio" }) }, { "store", true },
                { "functions", array({ {} }) }, { "function_call", "auto" },
                { "verbosity", "low" }, { "web_search_options", {} },
            }
            for _, c in ipairs(cases) do
                local r = refusal(function()
                    chat({ [c[1]] = c[2] })
                end)
                assert.same({ "not_for_route", c[1] }, { r.refusal, r.param })
            end
            -- the values that ask nothing of Ollama pass
            local out = chat({ n = 1, logprobs = false, logit_bias = {}, store = false,
                modalities = array({ "text" }) })
            assert.equal("hi", out.messages[1].content)
        end)

        it("maps reasoning_effort and think to think", function()
            assert.is_false(chat({ reasoning_effort = "minimal" }).think)
            assert.is_true(chat({ reasoning_effort = "high" }).think)
            assert.equal("low", chat({ think = "low" }).think)
            local oss = util.copy(route)
            oss.model = "gpt-oss:20b"
            local body = { messages = msgs({ role = "user", content = "hi" }), reasoning_effort = "high" }
            assert.equal("high", ollama.encode(req("chat", body), oss).body.think)
            assert.is_nil(chat({}).think)
        end)

        it("keeps a seed past 2^53 an exact integer", function()
            local seed = 9007199254740993
            local out = chat({ seed = seed })
            assert.equal(math.type(seed), math.type(out.options.seed))
            assert.equal(seed, out.options.seed)
        end)

        it("returns thinking as reasoning_content, and streams it as it arrives", function()
            local out = ollama.decode(req("chat"), { model = "m", done = true, done_reason = "stop",
                message = { role = "assistant", content = "4", thinking = "2+2 is 4" } })
            assert.equal("2+2 is 4", out.choices[1].message.reasoning_content)
            assert.equal("4", out.choices[1].message.content)
            local r = req("chat", {}, { stream = true })
            local chunks = run_stream(ollama, r, {
                { model = "m", done = false, message = { role = "assistant", content = "", thinking = "2+2" } },
                { model = "m", done = false, message = { role = "assistant", content = "", thinking = " is 4" } },
                { model = "m", done = false, message = { role = "assistant", content = "4" } },
                { model = "m", done = true, done_reason = "stop", message = { role = "assistant", content = "" } },
            })
            assert.equal(4, #chunks)
            assert.same({ role = "assistant", content = "", reasoning_content = "2+2" }, chunks[1].choices[1].delta)
            assert.same({ reasoning_content = " is 4" }, chunks[2].choices[1].delta)
            assert.same({ content = "4" }, chunks[3].choices[1].delta)
        end)

        it("parallel_tool_calls = false keeps the first call only", function()
            local calls = array({ { ["function"] = { name = "a", arguments = {} } },
                                  { ["function"] = { name = "b", arguments = {} } } })
            local resp = { model = "m", done = true, message = { role = "assistant", content = "", tool_calls = calls } }
            local one = ollama.decode(req("chat", { parallel_tool_calls = false }), resp)
            assert.equal(1, #one.choices[1].message.tool_calls)
            local two = ollama.decode(req("chat", {}), resp)
            assert.equal(2, #two.choices[1].message.tool_calls)
            local r = req("chat", { parallel_tool_calls = false }, { stream = true })
            local chunks = run_stream(ollama, r, {
                { model = "m", done = false, message = { role = "assistant", content = "", tool_calls = array({ calls[1] }) } },
                { model = "m", done = false, message = { role = "assistant", content = "", tool_calls = array({ calls[2] }) } },
                { model = "m", done = true, done_reason = "stop", message = { role = "assistant", content = "" } },
            })
            local n = 0
            for _, c in ipairs(chunks) do
                n = n + #(c.choices[1].delta.tool_calls or {})
            end
            assert.equal(1, n)
            assert.equal("tool_calls", chunks[#chunks].choices[1].finish_reason)
        end)

        it("echo puts the prompt before the completion", function()
            local body = { prompt = "Say:", echo = true }
            local out = ollama.decode(req("completions", body), { model = "m", response = " hi", done = true })
            assert.equal("Say: hi", out.choices[1].text)
            local chunks = run_stream(ollama, req("completions", body, { stream = true }), {
                { model = "m", response = " hi", done = false },
                { model = "m", response = "", done = true, done_reason = "stop" } })
            assert.equal("Say: hi", chunks[1].choices[1].text)
        end)
    end)

    describe("model list", function()
        it("asks /api/tags", function()
            assert.equal("/api/tags", ollama.list_models(route).path)
        end)

        it("reads the names of /api/tags (model when there is no name)", function()
            local ids = ollama.decode_models({ models = { { name = "llama3.2:latest", size = 1 }, { model = "qwen3:8b" },
                { size = 2 } } })
            assert.same({ "llama3.2:latest", "qwen3:8b" }, ids)
            assert.same({}, ollama.decode_models({ models = "x" }))
        end)
    end)
end)
