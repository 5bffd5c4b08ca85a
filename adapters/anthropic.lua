-- adapters/anthropic.lua: Anthropic's Messages API (POST /v1/messages).
--
-- Translates both ways: the gateway's canonical chat request becomes a Messages request
-- (encode), a Message becomes a chat.completion (decode), and each event of a Messages stream
-- becomes zero or more chat.completion.chunk tables (decode_event).
--
-- Provider config: base_url is the API root, as the official SDK's baseURL:
-- https://api.anthropic.com (no /v1: the adapter appends /v1/messages). api_key is sent as
-- x-api-key; anthropic-version is the client's when it sent one (a /v1/messages client),
-- else DEFAULT_VERSION below.
--
-- Mapping notes:
--   * A client that spoke /v1/messages itself (req.entry.wire == "anthropic") has its own body
--     sent, not the canonical one: only model, stream and max_tokens (which the scheduler may
--     have lowered) are the gateway's, its extensions are taken out, and its anthropic-version
--     and anthropic-beta headers are forwarded. Thinking blocks and their signatures, cache
--     control, documents, betas: everything reaches the upstream as the client wrote it.
--   * Chat requests: system and developer messages -> system; image_url parts -> image blocks
--     (data: URLs as base64 sources, http(s) URLs as url sources); assistant tool_calls ->
--     tool_use blocks; tool messages -> tool_result blocks in a user turn (consecutive turns of
--     one role merged, as Anthropic requires them to alternate); tools, tool_choice
--     (auto/required/none/a function; parallel_tool_calls = false ->
--     disable_parallel_tool_use); stop -> stop_sequences; max_tokens (or
--     max_completion_tokens; DEFAULT_MAX_TOKENS when the client gives none: Anthropic requires
--     one); temperature, top_p, top_k; user -> metadata.user_id.
--   * Refused with a clear message (a 400 when no other route can serve the request): n > 1,
--     logprobs, seed, response_format, and content part types Anthropic has no block for.
--   * Answers: text blocks -> content; tool_use -> tool_calls (input as a JSON string);
--     thinking -> reasoning_content, and every thinking / redacted_thinking block as it was in
--     message.thinking_blocks (streams: delta.reasoning_content, delta.reasoning_signature,
--     delta.redacted_thinking), so that an Anthropic client gets its signatures back byte for
--     byte; stop_reason -> finish_reason (end_turn and stop_sequence -> stop, max_tokens ->
--     length, tool_use -> tool_calls, refusal -> content_filter) with choice.stop_reason the
--     matched stop sequence, or the Anthropic reason chat has no name for (refusal,
--     pause_turn, model_context_window_exceeded); usage: prompt_tokens = input + cache reads +
--     cache writes, prompt_tokens_details.cached_tokens = cache reads,
--     cache_creation_input_tokens = cache writes.
--   * Errors: an error event mid-stream raises (the client gets the stream's error end); error
--     answers (429 with retry-after, 529 overloaded_error, 5xx) are the core's: cooldown and
--     the breaker see them as for any provider.

local util = require("moongate.util")
local json = require("moongate.json")

local null, array, nonnull = util.null, util.array, util.nonnull

local M = { name = "anthropic", version = 1 }

M.passthrough = false
M.probe_path = "/v1/models" -- health probe: Anthropic lists its models here
-- and wants the key in x-api-key (not Authorization: Bearer) with its API version
M.probe_key_header = "x-api-key"
M.probe_headers = { ["anthropic-version"] = "2023-06-01" }
-- it sends a /v1/messages client's own body (req.entry): requests the canonical form cannot
-- carry all of (documents, server tools, mcp_servers) are served by this adapter's routes,
-- and the core forwards their answers as Anthropic wrote them (decode and decode_event below
-- are for chat completions clients)
M.entry_wire = "anthropic"

-- Provider data.
local PATH = "/v1/messages"
local DEFAULT_VERSION = "2023-06-01"
local DEFAULT_MAX_TOKENS = 4096
-- the gateway's request extensions (never sent upstream)
local EXTENSIONS = { "priority", "session_id", "idempotency_key", "timeouts", "routing",
                     "context_policy", "max_output_tokens" }
-- Anthropic's stop_reason -> chat's finish_reason
local FINISH = { end_turn = "stop", stop_sequence = "stop", max_tokens = "length",
                 tool_use = "tool_calls", refusal = "content_filter", pause_turn = "stop",
                 model_context_window_exceeded = "length" }
-- Anthropic stop reasons the canonical choice carries as its stop_reason (chat has no name)
local PASSED_REASONS = { refusal = true, pause_turn = true, model_context_window_exceeded = true }
-- chat parameters Anthropic cannot honour: refused, never dropped
local REFUSED = { logprobs = "logprobs", top_logprobs = "logprobs", seed = "seed",
                  response_format = "response_format", logit_bias = "logit_bias" }

function M.check(provider)
    local url = provider.base_url
    local bad = util.check_base_url("anthropic", url, "https://api.anthropic.com", "/v1/messages is")
    if bad then
        return bad
    end
    if url:match("/v1$") then
        return "anthropic: base_url must be the API root (e.g. https://api.anthropic.com), "
            .. "without /v1, as the official SDK's baseURL"
    end
    return nil
end

---------------------------------------------------------------------------------------------
-- encode: the canonical chat request -> a Messages request
---------------------------------------------------------------------------------------------

-- Text of a content value: a string, or the text parts of a list.
local function text_of(content)
    content = nonnull(content)
    if type(content) == "string" then return content end
    local parts = {}
    for _, p in ipairs(content or {}) do
        if p.type == "text" then parts[#parts + 1] = p.text end
    end
    return table.concat(parts, "\n")
end

local function image_block(part)
    local url = type(part.image_url) == "table" and part.image_url.url or part.image_url
    if type(url) ~= "string" then util.invalid_request("anthropic: an image_url part needs its url", "image_url") end
    local media, data = url:match("^data:([^;,]+);base64,(.*)$")
    if media then
        return { type = "image", source = { type = "base64", media_type = media, data = data } }
    end
    if url:match("^https?://") then
        return { type = "image", source = { type = "url", url = url } }
    end
    util.not_for_route("anthropic: an image_url must be a base64 data: URL or an http(s) URL", "image_url")
end

local function content_blocks(content)
    content = nonnull(content)
    if type(content) == "string" then
        return array({ { type = "text", text = content } })
    end
    local blocks = array()
    for _, p in ipairs(content or {}) do
        if p.type == "text" then
            blocks[#blocks + 1] = { type = "text", text = p.text }
        elseif p.type == "image_url" then
            blocks[#blocks + 1] = image_block(p)
        else
            util.not_for_route("anthropic: content part type " .. tostring(p.type) .. " has no Anthropic block", "content")
        end
    end
    return blocks
end

local function tool_use_blocks(blocks, calls)
    for _, tc in ipairs(nonnull(calls) or {}) do
        local fn = tc["function"] or {}
        local args = nonnull(fn.arguments)
        local input = {}
        if type(args) == "string" and args ~= "" then
            local ok, v = pcall(json.decode, args)
            if not ok or type(v) ~= "table" then
                util.invalid_request("anthropic: tool call arguments are not a JSON object: " .. args, "tool_calls")
            end
            input = v
        elseif type(args) == "table" then
            input = args
        end
        blocks[#blocks + 1] = { type = "tool_use", id = tc.id, name = fn.name, input = input }
    end
end

-- One turn of the conversation appended, merged into the last one when of the same role.
local function push_turn(turns, role, blocks)
    local last = turns[#turns]
    if last and last.role == role then
        for _, b in ipairs(blocks) do last.content[#last.content + 1] = b end
    elseif #blocks > 0 then
        turns[#turns + 1] = { role = role, content = blocks }
    end
end

local function turns_of(messages)
    local system, turns = {}, array()
    for _, m in ipairs(messages or {}) do
        if m.role == "system" or m.role == "developer" then
            system[#system + 1] = text_of(m.content)
        elseif m.role == "user" then
            push_turn(turns, "user", content_blocks(m.content))
        elseif m.role == "assistant" then
            local blocks = array()
            local text = text_of(m.content)
            if text ~= "" then blocks[1] = { type = "text", text = text } end
            tool_use_blocks(blocks, m.tool_calls)
            push_turn(turns, "assistant", blocks)
        elseif m.role == "tool" then
            push_turn(turns, "user", array({ { type = "tool_result", tool_use_id = m.tool_call_id,
                                               content = text_of(m.content) } }))
        else
            util.not_for_route("anthropic: message role " .. tostring(m.role) .. " has no Anthropic turn", "messages")
        end
    end
    return system, turns
end

local function tools_of(tools)
    if nonnull(tools) == nil then return nil end
    return util.map_array(tools, function(t)
        local fn = t["function"] or {}
        return { name = fn.name, description = nonnull(fn.description),
                 input_schema = nonnull(fn.parameters) or { type = "object" } }
    end)
end

local function tool_choice_of(b)
    local tc = nonnull(b.tool_choice)
    local out
    if tc == "auto" then out = { type = "auto" }
    elseif tc == "required" then out = { type = "any" }
    elseif tc == "none" then out = { type = "none" }
    elseif type(tc) == "table" and type(tc["function"]) == "table" then
        out = { type = "tool", name = tc["function"].name }
    end
    if b.parallel_tool_calls == false and nonnull(b.tools) then
        out = out or { type = "auto" }
        out.disable_parallel_tool_use = true
    end
    return out
end

local function refuse_unsupported(b)
    if (nonnull(b.n) or 1) > 1 then util.not_for_route("anthropic: n > 1 is not supported by Anthropic", "n") end
    for key, what in pairs(REFUSED) do
        local v = nonnull(b[key])
        if v ~= nil and v ~= false then
            util.not_for_route("anthropic: " .. what .. " is not supported by Anthropic's Messages API", key)
        end
    end
end

local function from_chat(req, route)
    local b = req.body
    refuse_unsupported(b)
    local system, turns = turns_of(b.messages)
    local stop = nonnull(b.stop)
    if type(stop) == "string" then stop = array({ stop }) end
    local user = nonnull(b.user)
    return {
        model = route.model,
        system = #system > 0 and table.concat(system, "\n") or nil,
        messages = turns,
        max_tokens = nonnull(b.max_tokens) or nonnull(b.max_completion_tokens) or DEFAULT_MAX_TOKENS,
        stream = req.stream,
        temperature = nonnull(b.temperature),
        top_p = nonnull(b.top_p),
        top_k = nonnull(b.top_k),
        stop_sequences = stop,
        tools = tools_of(b.tools),
        tool_choice = tool_choice_of(b),
        metadata = user and { user_id = user } or nil,
    }
end

-- The Messages client's own body, with the gateway's say on model, stream and max_tokens.
local function from_entry(req, route)
    local out = util.copy(req.entry.body)
    setmetatable(out, nil)
    for _, k in ipairs(EXTENSIONS) do out[k] = nil end
    local meta = nonnull(out.metadata)
    out.metadata = type(meta) == "table" and nonnull(meta.user_id) and { user_id = meta.user_id } or nil
    out.model = route.model
    out.stream = req.stream
    out.max_tokens = nonnull(req.body.max_tokens) or out.max_tokens
    return out
end

-- list_models(route): Anthropic's model list (GET /v1/models, one page of up to 1,000), for
-- GET /v1/models on a provider with a model_prefix; the key as on every request.
function M.list_models(route)
    local headers = { ["anthropic-version"] = DEFAULT_VERSION }
    if type(route.api_key) == "string" and route.api_key ~= "" then
        headers["x-api-key"] = route.api_key
    end
    return { path = "/v1/models?limit=1000", headers = headers }
end

-- decode_models(resp): the ids of Anthropic's list ({data = [{type = "model", id, ...}]}).
function M.decode_models(resp)
    return util.list_ids(resp)
end

function M.encode(req, route)
    if req.endpoint ~= "chat" then
        util.not_for_route("anthropic: unsupported endpoint " .. tostring(req.endpoint))
    end
    local entry = req.entry
    local native = type(entry) == "table" and entry.wire == "anthropic"
    local headers = { ["anthropic-version"] = DEFAULT_VERSION }
    if native then -- the client's headers the core hands over (protocols.forward_headers)
        for name, v in pairs(entry.headers or {}) do
            if type(name) == "string" and type(v) == "string" then
                headers[name] = v
            end
        end
    end
    if type(route.api_key) == "string" and route.api_key ~= "" then
        headers["x-api-key"] = route.api_key
    end
    return { method = "POST", path = PATH, headers = headers, stream_format = "sse",
             body = native and from_entry(req, route) or from_chat(req, route) }
end

---------------------------------------------------------------------------------------------
-- decode: a Message -> chat.completion
---------------------------------------------------------------------------------------------

local function raise_if_error(obj)
    if obj.type == "error" then
        local e = nonnull(obj.error) or {}
        error("anthropic: " .. tostring(e.type) .. ": " .. tostring(e.message), 0)
    end
end

local function usage_of(u)
    u = nonnull(u) or {}
    local input = nonnull(u.input_tokens) or 0
    local read = nonnull(u.cache_read_input_tokens) or 0
    local write = nonnull(u.cache_creation_input_tokens) or 0
    local out = nonnull(u.output_tokens) or 0
    local prompt = input + read + write
    return { prompt_tokens = prompt, completion_tokens = out, total_tokens = prompt + out,
             prompt_tokens_details = { cached_tokens = read },
             cache_creation_input_tokens = write }
end

-- finish_reason and the choice's stop_reason for a Message's stop_reason and stop_sequence.
local function finish_of(reason, sequence)
    reason = nonnull(reason) or "end_turn"
    local passed = nonnull(sequence) or (PASSED_REASONS[reason] and reason) or nil
    return FINISH[reason] or "stop", passed
end

local function completion_id(req)
    return "chatcmpl-" .. tostring(req.request_id)
end

function M.decode(req, resp)
    raise_if_error(resp)
    local texts, reasoning, thinking, calls = {}, {}, array(), array()
    for _, b in ipairs(nonnull(resp.content) or {}) do
        if b.type == "text" then
            texts[#texts + 1] = b.text
        elseif b.type == "thinking" or b.type == "redacted_thinking" then
            thinking[#thinking + 1] = b
            if b.type == "thinking" then reasoning[#reasoning + 1] = b.thinking end
        elseif b.type == "tool_use" then
            calls[#calls + 1] = { id = b.id, type = "function",
                                  ["function"] = { name = b.name, arguments = json.encode(b.input or {}) } }
        end
    end
    local message = { role = "assistant", refusal = null,
                      content = #texts > 0 and table.concat(texts) or null }
    if #calls > 0 then message.tool_calls = calls end
    if #thinking > 0 then
        message.thinking_blocks = thinking
        message.reasoning_content = table.concat(reasoning)
    end
    local finish, passed = finish_of(resp.stop_reason, resp.stop_sequence)
    return {
        id = completion_id(req), object = "chat.completion", created = req.created,
        model = resp.model,
        choices = array({ { index = 0, message = message, logprobs = null,
                            finish_reason = finish, stop_reason = passed } }),
        usage = usage_of(resp.usage),
    }
end

---------------------------------------------------------------------------------------------
-- decode_event: one event of a Messages stream -> chunks
---------------------------------------------------------------------------------------------

local function chunk(req, state, delta, finish)
    return {
        id = completion_id(req), object = "chat.completion.chunk", created = req.created,
        model = state.model,
        choices = array({ { index = 0, delta = delta, logprobs = null, finish_reason = finish or null } }),
    }
end

local function block_start(req, ev, state)
    local b = nonnull(ev.content_block) or {}
    state.blocks = state.blocks or {}
    if b.type == "tool_use" then
        local ti = state.tools or 0
        state.tools = ti + 1
        state.blocks[ev.index] = ti
        return { chunk(req, state, { tool_calls = array({ { index = ti, id = b.id, type = "function",
            ["function"] = { name = b.name, arguments = "" } } }) }) }
    elseif b.type == "text" and (b.text or "") ~= "" then
        return { chunk(req, state, { content = b.text }) }
    elseif b.type == "redacted_thinking" then
        return { chunk(req, state, { redacted_thinking = b.data }) }
    end
    return {}
end

local function block_delta(req, ev, state)
    local d = nonnull(ev.delta) or {}
    if d.type == "text_delta" and d.text ~= "" then
        return { chunk(req, state, { content = d.text }) }
    elseif d.type == "thinking_delta" and d.thinking ~= "" then
        return { chunk(req, state, { reasoning_content = d.thinking }) }
    elseif d.type == "signature_delta" then
        return { chunk(req, state, { reasoning_signature = d.signature }) }
    elseif d.type == "input_json_delta" and (d.partial_json or "") ~= "" then
        local ti = (state.blocks or {})[ev.index] or 0
        return { chunk(req, state, { tool_calls = array({ { index = ti,
            ["function"] = { arguments = d.partial_json } } }) }) }
    end
    return {}
end

-- decode_event(req, ev, state): state keeps the model, the usage so far, the stop reason,
-- each tool_use block's tool call index (blocks), the tool calls so far (tools), and done.
function M.decode_event(req, ev, state)
    raise_if_error(ev)
    local t = ev.type
    local out = array()
    if t == "message_start" then
        local msg = nonnull(ev.message) or {}
        state.model = msg.model
        state.usage = nonnull(msg.usage) or {}
        out[1] = chunk(req, state, { role = "assistant", content = "" })
    elseif t == "content_block_start" then
        for _, c in ipairs(block_start(req, ev, state)) do out[#out + 1] = c end
    elseif t == "content_block_delta" then
        for _, c in ipairs(block_delta(req, ev, state)) do out[#out + 1] = c end
    elseif t == "message_delta" then
        local d = nonnull(ev.delta) or {}
        state.stop_reason, state.stop_sequence = nonnull(d.stop_reason), nonnull(d.stop_sequence)
        for k, v in pairs(nonnull(ev.usage) or {}) do
            if nonnull(v) ~= nil then state.usage[k] = v end
        end
    elseif t == "message_stop" then
        local finish, passed = finish_of(state.stop_reason, state.stop_sequence)
        local last = chunk(req, state, {}, finish)
        last.choices[1].stop_reason = passed
        last.usage = usage_of(state.usage)
        out[1] = last
        state.done = true
    end
    return out
end

return M
