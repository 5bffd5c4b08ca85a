local h = dofile("tests/lua/helper.lua")
local util, json = h.util, h.json
local null, array = util.null, util.array

local route = { provider = "anthropic", model = "claude-sonnet-4-5", base_url = "https://api.anthropic.com",
                api_key = "sk-ant-key", pool = "main", ["local"] = false }

local function req(body, extra)
    local r = { request_id = "req-1", endpoint = "chat", model = "claude", stream = false,
                created = 1700000000, body = body or {} }
    for k, v in pairs(extra or {}) do r[k] = v end
    return r
end

local function run_stream(adapter, r, events)
    local state, chunks = {}, {}
    for _, ev in ipairs(events) do
        for _, c in ipairs(adapter.decode_event(r, ev, state)) do chunks[#chunks + 1] = h.roundtrip(c) end
    end
    return chunks, state
end

describe("anthropic adapter", function()
    local a
    before_each(function() a = h.adapter("anthropic") end)

    it("declares itself and checks base_url as the SDK's baseURL", function()
        assert.equal("anthropic", a.name)
        assert.equal(1, a.version)
        assert.is_false(a.passthrough)
        assert.equal("/v1/models", a.probe_path)
        assert.is_nil(a.check({ base_url = "https://api.anthropic.com" }))
        assert.matches("required", a.check({}))
        assert.matches("http", a.check({ base_url = "api.anthropic.com" }))
        assert.matches("end with '/'", a.check({ base_url = "https://api.anthropic.com/" }))
        assert.matches("without /v1", a.check({ base_url = "https://api.anthropic.com/v1" }))
    end)

    describe("encode from a chat request", function()
        it("maps system, images, tool calls and tool results, merging turns of one role", function()
            local e = a.encode(req({
                model = "claude-sonnet-4-5", max_completion_tokens = 77, stop = "END", user = "u-9",
                temperature = 0.3, parallel_tool_calls = false,
                messages = array({
                    { role = "system", content = "be kind" },
                    { role = "developer", content = array({ { type = "text", text = "be brief" } }) },
                    { role = "user", content = array({
                        { type = "text", text = "look" },
                        { type = "image_url", image_url = { url = "data:image/png;base64,QUJD" } },
                        { type = "image_url", image_url = { url = "https://x/cat.jpg" } } }) },
                    { role = "assistant", content = null, tool_calls = array({
                        { id = "c1", type = "function", ["function"] = { name = "f", arguments = "{\"a\":1}" } },
                        { id = "c2", type = "function", ["function"] = { name = "g", arguments = "" } } }) },
                    { role = "tool", tool_call_id = "c1", content = "one" },
                    { role = "tool", tool_call_id = "c2", content = "two" },
                    { role = "user", content = "and?" },
                }),
                tools = array({ { type = "function", ["function"] = { name = "f", description = "d",
                                                                     parameters = { type = "object" } } } }),
                tool_choice = "required",
            }), route)
            assert.equal("POST", e.method)
            assert.equal("/v1/messages", e.path)
            assert.equal("sse", e.stream_format)
            assert.equal("sk-ant-key", e.headers["x-api-key"])
            assert.equal("2023-06-01", e.headers["anthropic-version"])
            assert.is_nil(e.headers.Authorization)
            local b = h.roundtrip(e.body)
            assert.equal("claude-sonnet-4-5", b.model)
            assert.equal("be kind\nbe brief", b.system)
            assert.equal(77, b.max_tokens)
            assert.same({ "END" }, b.stop_sequences)
            assert.same({ user_id = "u-9" }, b.metadata)
            assert.equal(0.3, b.temperature)
            assert.equal(3, #b.messages)
            assert.same({ { type = "text", text = "look" },
                          { type = "image", source = { type = "base64", media_type = "image/png", data = "QUJD" } },
                          { type = "image", source = { type = "url", url = "https://x/cat.jpg" } } },
                        b.messages[1].content)
            assert.same({ { type = "tool_use", id = "c1", name = "f", input = { a = 1 } },
                          { type = "tool_use", id = "c2", name = "g", input = {} } }, b.messages[2].content)
            assert.equal("user", b.messages[3].role)
            assert.same({ { type = "tool_result", tool_use_id = "c1", content = "one" },
                          { type = "tool_result", tool_use_id = "c2", content = "two" },
                          { type = "text", text = "and?" } }, b.messages[3].content)
            assert.same({ { name = "f", description = "d", input_schema = { type = "object" } } }, b.tools)
            assert.same({ type = "any", disable_parallel_tool_use = true }, b.tool_choice)
        end)

        it("gives a default max_tokens (Anthropic requires one) and maps named tool choices", function()
            local b = a.encode(req({ messages = array({ { role = "user", content = "x" } }),
                tools = array({ { type = "function", ["function"] = { name = "f" } } }),
                tool_choice = { type = "function", ["function"] = { name = "f" } } }), route).body
            assert.equal(4096, b.max_tokens)
            assert.same({ type = "tool", name = "f" }, b.tool_choice)
            assert.same({ type = "object" }, b.tools[1].input_schema)
        end)

        it("refuses what Anthropic cannot honour, never drops it", function()
            local function refused(body, pattern)
                body.messages = body.messages or array({ { role = "user", content = "x" } })
                local ok, err = pcall(a.encode, req(body), route)
                assert.is_false(ok)
                assert.matches(pattern, err)
                assert.matches("^anthropic: ", err)
            end
            refused({ n = 2 }, "n > 1")
            refused({ logprobs = true }, "logprobs")
            refused({ seed = 3 }, "seed")
            refused({ response_format = { type = "json_object" } }, "response_format")
            refused({ messages = array({ { role = "user", content = array({ { type = "input_audio" } }) } }) }, "input_audio")
            refused({ messages = array({ { role = "user", content = array({ { type = "image_url", image_url = { url = "file:///x" } } }) } }) }, "image_url")
            refused({ messages = array({ { role = "assistant", tool_calls = array({ { id = "c", ["function"] = { name = "f", arguments = "{bad" } } }) } }) }, "not a JSON object")
        end)
    end)

    describe("encode for a Messages client (req.entry)", function()
        it("sends the client's own body and anthropic-* headers, with the gateway's model, stream and max_tokens", function()
            local sig = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDYzKIXd+/A=="
            local entry = { wire = "anthropic", headers = { ["anthropic-version"] = "2023-06-01", ["anthropic-beta"] = "b1,b2" },
                body = { model = "claude", max_tokens = 900, stream = false, priority = "P1", routing = { local_only = false },
                         metadata = { user_id = "u", application = "app" },
                         thinking = { type = "enabled", budget_tokens = 1024 },
                         system = array({ { type = "text", text = "s", cache_control = { type = "ephemeral" } } }),
                         messages = array({ { role = "assistant", content = array({
                             { type = "thinking", thinking = "t", signature = sig }, { type = "text", text = "a" } }) } }) } }
            local e = a.encode(req({ model = "claude-sonnet-4-5", max_tokens = 500, messages = array() },
                                   { entry = entry, stream = true }), route)
            assert.equal("2023-06-01", e.headers["anthropic-version"])
            assert.equal("b1,b2", e.headers["anthropic-beta"])
            local b = h.roundtrip(e.body)
            assert.equal("claude-sonnet-4-5", b.model)
            assert.is_true(b.stream)
            assert.equal(500, b.max_tokens) -- the scheduler's lowered ceiling wins
            assert.is_nil(b.priority)
            assert.is_nil(b.routing)
            assert.same({ user_id = "u" }, b.metadata)
            assert.same({ type = "enabled", budget_tokens = 1024 }, b.thinking)
            assert.equal(sig, b.messages[1].content[1].signature)
            assert.same({ type = "ephemeral" }, b.system[1].cache_control)
            assert.equal("claude", entry.body.model) -- the entry itself is not modified
            assert.equal("P1", entry.body.priority)
        end)
    end)

    describe("decode", function()
        it("a text Message", function()
            local r = req()
            local out = h.roundtrip(a.decode(r, h.fixture("anthropic/message.json")))
            assert.equal("chat.completion", out.object)
            assert.equal("chatcmpl-req-1", out.id)
            assert.equal(r.created, out.created)
            assert.equal("claude-sonnet-4-5-20250929", out.model)
            assert.equal("Hello! How can I help you today?", out.choices[1].message.content)
            assert.equal("stop", out.choices[1].finish_reason)
            assert.equal(null, out.choices[1].logprobs)
            assert.same({ prompt_tokens = 12, completion_tokens = 11, total_tokens = 23,
                          prompt_tokens_details = { cached_tokens = 0 }, cache_creation_input_tokens = 0 }, out.usage)
        end)

        it("thinking blocks byte for byte, tool calls, cache usage", function()
            local fx = h.fixture("anthropic/message_tools_thinking.json")
            local out = h.roundtrip(a.decode(req(), fx))
            local m = out.choices[1].message
            assert.equal("tool_calls", out.choices[1].finish_reason)
            assert.equal("Let me check both.", m.content)
            assert.same(fx.content[1], m.thinking_blocks[1])
            assert.same(fx.content[2], m.thinking_blocks[2])
            assert.equal(fx.content[1].thinking, m.reasoning_content)
            assert.equal(2, #m.tool_calls)
            assert.equal("toolu_01A09q90qw90lq917835lq9", m.tool_calls[1].id)
            assert.same({ location = "San Francisco, CA", unit = "celsius" }, json.decode(m.tool_calls[1]["function"].arguments))
            assert.equal(420, out.usage.prompt_tokens)
            assert.equal(300, out.usage.prompt_tokens_details.cached_tokens)
            assert.equal(20, out.usage.cache_creation_input_tokens)
        end)

        it("a stop sequence as the choice's stop_reason; an error object raises", function()
            local out = a.decode(req(), h.fixture("anthropic/message_stop_sequence.json"))
            assert.equal("stop", out.choices[1].finish_reason)
            assert.equal("three", out.choices[1].stop_reason)
            local ok, err = pcall(a.decode, req(), { type = "error", error = { type = "overloaded_error", message = "Overloaded" } })
            assert.is_false(ok)
            assert.equal("anthropic: overloaded_error: Overloaded", err)
        end)
    end)

    describe("decode_event", function()
        it("thinking, text and two tool calls as chunks, argument deltas as they arrive", function()
            local r = req(nil, { stream = true })
            local chunks, state = run_stream(a, r, h.sse("anthropic/stream_tools_thinking.sse"))
            assert.is_true(state.done)
            assert.same({ role = "assistant", content = "" }, chunks[1].choices[1].delta)
            for _, c in ipairs(chunks) do
                assert.equal("chat.completion.chunk", c.object)
                assert.equal("claude-sonnet-4-5-20250929", c.model)
            end
            local reasoning, sig, text, calls = "", nil, "", {}
            for i = 1, #chunks - 1 do
                local d = chunks[i].choices[1].delta
                assert.equal(null, chunks[i].choices[1].finish_reason)
                reasoning = reasoning .. (d.reasoning_content or "")
                sig = d.reasoning_signature or sig
                text = text .. (d.content or "")
                for _, tc in ipairs(d.tool_calls or {}) do
                    calls[tc.index + 1] = calls[tc.index + 1] or { args = "" }
                    local c = calls[tc.index + 1]
                    if tc.id then c.id, c.name = tc.id, tc["function"].name end
                    assert.is_true(tc.id ~= nil or tc["function"].arguments ~= "", "no empty argument delta")
                    c.args = c.args .. (tc["function"].arguments or "")
                end
            end
            assert.equal("Two cities, two calls.", reasoning)
            assert.equal("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDYzKIXd+/A==", sig)
            assert.equal("Checking.", text)
            assert.equal(2, #calls)
            assert.equal("toolu_01T1x1fJ34qAmk2tNTrN7Up6", calls[1].id)
            assert.same({ location = "San Francisco, CA" }, json.decode(calls[1].args))
            assert.same({ location = "Paris" }, json.decode(calls[2].args))
            local last = chunks[#chunks]
            assert.equal("tool_calls", last.choices[1].finish_reason)
            assert.same({}, last.choices[1].delta)
            assert.equal(472 + 128, last.usage.prompt_tokens)
            assert.equal(89, last.usage.completion_tokens)
            assert.equal(128, last.usage.prompt_tokens_details.cached_tokens)
        end)

        it("an error event mid-stream raises with Anthropic's type", function()
            local events = h.sse("anthropic/stream_error.sse")
            local state = {}
            for i = 1, 3 do a.decode_event(req(), events[i], state) end
            local ok, err = pcall(a.decode_event, req(), events[4], state)
            assert.is_false(ok)
            assert.equal("anthropic: overloaded_error: Overloaded", err)
            assert.is_nil(state.done)
        end)

        it("a stop sequence and a pass-through stop reason on the final chunk", function()
            local state = {}
            a.decode_event(req(), { type = "message_start", message = { model = "m", usage = { input_tokens = 3 } } }, state)
            a.decode_event(req(), { type = "message_delta", delta = { stop_reason = "pause_turn", stop_sequence = null }, usage = { output_tokens = 4 } }, state)
            local last = h.roundtrip(a.decode_event(req(), { type = "message_stop" }, state)[1])
            assert.equal("stop", last.choices[1].finish_reason)
            assert.equal("pause_turn", last.choices[1].stop_reason)
            assert.equal(4, last.usage.completion_tokens)
        end)
    end)

    describe("model list", function()
        it("asks /v1/models (one page of 1,000) with x-api-key and anthropic-version", function()
            local out = a.list_models(route)
            assert.equal("/v1/models?limit=1000", out.path)
            assert.equal("sk-ant-key", out.headers["x-api-key"])
            assert.equal("2023-06-01", out.headers["anthropic-version"])
            assert.is_nil(out.headers.Authorization)
        end)

        it("reads the ids of Anthropic's list", function()
            local ids = a.decode_models({ data = { { type = "model", id = "claude-sonnet-4-5", display_name = "Claude" },
                { type = "model" } }, has_more = false })
            assert.same({ "claude-sonnet-4-5" }, ids)
            assert.same({}, a.decode_models({}))
        end)
    end)
end)
