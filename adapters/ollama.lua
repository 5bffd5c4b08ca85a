-- adapters/ollama.lua: Ollama's native API (/api/chat, /api/generate, /api/embed).
--
-- Translates both ways: OpenAI-shaped requests become Ollama requests (encode), Ollama answers
-- become OpenAI objects (decode), and each NDJSON line of an Ollama stream becomes zero or more
-- OpenAI stream chunks (decode_event).
--
-- Provider config: base_url is the server root, e.g. http://127.0.0.1:11434 (no /v1; for
-- Ollama's OpenAI-compatible /v1 endpoints use the openai adapter instead). api_key is
-- optional and sent as a Bearer token (for Ollama behind an authenticating proxy).
--
-- Mapping notes:
--   * max_tokens (or max_completion_tokens, or the gateway's max_output_tokens) -> options.num_predict;
--     temperature, top_p, top_k, seed, stop, frequency_penalty, presence_penalty -> options.
--   * response_format json_object -> format = "json"; json_schema -> format = the schema.
--   * Message content parts: text parts are joined with "\n"; image_url parts must be
--     data: URLs (Ollama cannot fetch URLs) and go to images[] as bare base64.
--   * Refusals (lua/README.md): what Ollama cannot take is util.not_for_route (another
--     route may serve it; else the client gets 400 with the reason and the param): an
--     image URL, other part types (input_audio, file), token-array prompts and embedding
--     inputs. What no route could take is util.invalid_request (400 at once): tool-call
--     arguments in the history that are not JSON.
--   * Tools: `tools` is passed through (Ollama uses the OpenAI shape). Tool calls come back with
--     arguments as an object and are returned OpenAI-style, arguments as a JSON string, with
--     finish_reason "tool_calls". Assistant tool calls in the history go the other way.
--   * Embeddings honour encoding_format = "base64" (the official OpenAI SDKs ask for it by
--     default) by packing the vector as float32, as OpenAI does.
--   * Every OpenAI parameter is honoured, emulated or refused (UNSUPPORTED below), never
--     dropped: the tables in lua/README.md ("Parameters per adapter") say which. Emulated:
--     tool_choice (tool_plan), parallel_tool_calls = false (the first call kept), echo.
--   * Reasoning: reasoning_effort (or Ollama's own think) -> think; message.thinking ->
--     reasoning_content, in answers and in stream deltas as it arrives.

local util = require("moongate.util")
local json = require("moongate.json")

local null, array, nonnull = util.null, util.array, util.nonnull

local M = { name = "ollama", version = 1 }

M.passthrough = false
M.probe_path = "/api/tags" -- health probe: Ollama lists its models here

-- Provider data: where each endpoint lives under base_url.
local PATHS = {
    chat = "/api/chat",
    completions = "/api/generate",
    embeddings = "/api/embed",
}

-- Ollama's done_reason -> OpenAI's finish_reason ("load"/"unload" only answer empty requests).
local FINISH = { stop = "stop", length = "length" }

function M.check(provider)
    local url = provider.base_url
    local bad = util.check_base_url("ollama", url, "http://127.0.0.1:11434", "paths such as /api/chat are")
    if bad then
        return bad
    end
    if url:match("/v1$") then
        return "ollama: base_url must be the server root (e.g. http://127.0.0.1:11434), not /v1;"
            .. " use the openai adapter for Ollama's /v1 endpoints"
    end
    return nil
end

---------------------------------------------------------------------------------------------
-- encode: OpenAI request -> Ollama request
---------------------------------------------------------------------------------------------

-- The text and images of one message's content (a string, null, or an array of parts);
-- `where` names the content in a refusal ("messages[2].content").
local function split_content(content, where)
    content = nonnull(content)
    if content == nil then
        return "", nil
    end
    if type(content) == "string" then
        return content, nil
    end
    local texts, images = {}, array()
    for i, part in ipairs(content) do
        local at = where .. "[" .. (i - 1) .. "]"
        if part.type == "text" then
            texts[#texts + 1] = part.text
        elseif part.type == "image_url" then
            local url = type(part.image_url) == "table" and part.image_url.url or part.image_url
            local b64 = type(url) == "string" and url:match("^data:[^,]*;base64,(.*)$")
            if not b64 then
                util.not_for_route("ollama: image_url must be a base64 data: URL"
                    .. " (Ollama cannot fetch image URLs)", at .. ".image_url.url")
            end
            images[#images + 1] = b64
        else
            util.not_for_route("ollama: content part type " .. tostring(part.type)
                .. " is not supported by Ollama", at .. ".type")
        end
    end
    return table.concat(texts, "\n"), (#images > 0) and images or nil
end

-- OpenAI tool_calls (arguments = JSON string) -> Ollama tool_calls (arguments = object).
local function tool_calls_to_ollama(calls, names_by_id, where)
    return util.map_array(calls, function(call, i)
        local fn = call["function"] or {}
        local args = nonnull(fn.arguments)
        if type(args) == "string" then
            local ok, decoded = pcall(json.decode, args ~= "" and args or "{}")
            if not ok then
                util.invalid_request("ollama: tool call arguments are not valid JSON: "
                    .. tostring(decoded), where .. "[" .. (i - 1) .. "].function.arguments")
            end
            args = decoded
        end
        if call.id and call.id ~= null then
            names_by_id[call.id] = fn.name
        end
        return { ["function"] = { name = fn.name, arguments = args or {} } }
    end)
end

local function encode_messages(messages)
    local names_by_id = {} -- tool_call_id -> function name, for Ollama's tool_name
    return util.map_array(messages, function(m, i)
        local where = "messages[" .. (i - 1) .. "]"
        local role = m.role == "developer" and "system" or m.role
        local content, images = split_content(m.content, where .. ".content")
        local out = { role = role, content = content, images = images }
        local calls = nonnull(m.tool_calls)
        if calls and #calls > 0 then
            out.tool_calls = tool_calls_to_ollama(calls, names_by_id, where .. ".tool_calls")
        end
        if role == "tool" then
            out.tool_name = names_by_id[nonnull(m.tool_call_id)] or nonnull(m.name)
        end
        return out
    end)
end

-- What Ollama cannot do: per endpoint, the parameter, when its value asks for it, and why.
-- Each is refused as not for this route (another route may serve it; otherwise the client
-- gets 400 naming the parameter): never dropped. lua/README.md's parameter tables say the
-- same, and tests/e2e/params.test.mjs holds the two to each other.
local function present(v)
    return nonnull(v) ~= nil
end

local function truthy(v)
    v = nonnull(v)
    return v ~= nil and v ~= false
end

local function above(n)
    return function(v)
        v = nonnull(v)
        return type(v) == "number" and v > n
    end
end

local function non_empty(v)
    v = nonnull(v)
    return type(v) == "table" and next(v) ~= nil
end

local function asks_audio(v)
    v = nonnull(v)
    if type(v) ~= "table" then
        return false
    end
    for _, m in ipairs(v) do
        if m ~= "text" then
            return true
        end
    end
    return false
end

local UNSUPPORTED = {
    chat = {
        { "n", above(1), "n > 1 is not supported: Ollama gives one choice per request" },
        { "logprobs", truthy, "logprobs is not supported: Ollama reports no log probabilities" },
        { "top_logprobs", above(0),
          "top_logprobs is not supported: Ollama reports no log probabilities" },
        { "logit_bias", non_empty, "logit_bias is not supported: Ollama has none" },
        { "audio", present, "audio output is not supported: Ollama answers in text" },
        { "modalities", asks_audio,
          "modalities other than text are not supported: Ollama answers in text" },
        { "functions", present, "functions (deprecated) are not supported: send tools" },
        { "function_call", present,
          "function_call (deprecated) is not supported: send tool_choice" },
        { "store", truthy, "store is not supported: Ollama stores no completions" },
        { "verbosity", present, "verbosity is not supported: Ollama has no such control" },
        { "web_search_options", present,
          "web_search_options is not supported: Ollama has no web search" },
    },
    completions = {
        { "n", above(1), "n > 1 is not supported: Ollama gives one choice per request" },
        { "best_of", above(1),
          "best_of > 1 is not supported: Ollama gives one choice per request" },
        { "logprobs", present, "logprobs is not supported: Ollama reports no log probabilities" },
        { "logit_bias", non_empty, "logit_bias is not supported: Ollama has none" },
    },
    embeddings = {},
}

local function refuse_unsupported(endpoint, body)
    for _, u in ipairs(UNSUPPORTED[endpoint] or {}) do
        if u[2](body[u[1]]) then
            util.not_for_route("ollama: " .. u[3], u[1])
        end
    end
end

-- The options table shared by /api/chat and /api/generate. A seed past 2^53 arrives as an
-- exact Lua integer and leaves as one (the core keeps such integers exact both ways).
local function encode_options(req, body)
    local stop = nonnull(body.stop)
    if type(stop) == "string" then
        stop = array({ stop })
    end
    local options = {
        num_predict = nonnull(body.max_tokens) or nonnull(body.max_completion_tokens)
            or req.max_tokens,
        temperature = nonnull(body.temperature),
        top_p = nonnull(body.top_p),
        top_k = nonnull(body.top_k),
        seed = nonnull(body.seed),
        stop = stop,
        frequency_penalty = nonnull(body.frequency_penalty),
        presence_penalty = nonnull(body.presence_penalty),
    }
    if next(options) == nil then
        return nil
    end
    return options
end

local function encode_format(body)
    local rf = nonnull(body.response_format)
    if type(rf) ~= "table" then
        return nil
    end
    if rf.type == "json_object" then
        return "json"
    elseif rf.type == "json_schema" and type(rf.json_schema) == "table" then
        return nonnull(rf.json_schema.schema)
    end
    return nil
end

-- Reasoning out: Ollama's own `think` when the client sent it, else reasoning_effort: "none"
-- and "minimal" turn thinking off, a level turns it on (gpt-oss takes the level itself).
local function encode_think(route, body)
    local think = nonnull(body.think)
    if think ~= nil then
        return think
    end
    local effort = nonnull(body.reasoning_effort)
    if effort == nil then
        return nil
    end
    if effort == "none" or effort == "minimal" then
        return false
    end
    if type(route.model) == "string" and route.model:find("gpt%-oss") then
        return effort
    end
    return true
end

local CALL_ONE = "You must answer by calling one of the provided tools, not with text."

local function call_named(name)
    return "You must answer by calling the tool `" .. name .. "`, not with text."
end

local function tool_name(t)
    local fn = type(t) == "table" and nonnull(t["function"])
    return type(fn) == "table" and nonnull(fn.name) or (type(t) == "table" and nonnull(t.name))
end

local function only_tools(tools, names)
    local out = array()
    for _, t in ipairs(tools) do
        if names[tool_name(t)] then
            out[#out + 1] = t
        end
    end
    return out
end

-- tool_choice, emulated (Ollama always leaves the choice to the model): the tools to send
-- and an instruction for the model, if any. "none" sends no tools; a named function sends
-- only that tool and asks for it; "required" asks for a call of one; allowed_tools sends
-- only those it lists (and asks for one with mode "required").
local function tool_plan(body)
    local tools = nonnull(body.tools)
    if type(tools) ~= "table" or #tools == 0 then
        return nil, nil
    end
    local choice = nonnull(body.tool_choice)
    if choice == nil or choice == "auto" then
        return tools, nil
    elseif choice == "none" then
        return nil, nil
    elseif choice == "required" then
        return tools, CALL_ONE
    elseif type(choice) == "table" and choice.type == "function" then
        local name = tool_name(choice)
        local only = only_tools(tools, { [name or false] = true })
        if #only == 0 then
            util.invalid_request("ollama: tool_choice names the function " .. tostring(name)
                .. ", which is not in tools", "tool_choice")
        end
        return only, call_named(name)
    elseif type(choice) == "table" and choice.type == "allowed_tools"
        and type(choice.allowed_tools) == "table" then
        local names = {}
        for _, t in ipairs(nonnull(choice.allowed_tools.tools) or {}) do
            names[tool_name(t) or false] = true
        end
        local only = only_tools(tools, names)
        if #only == 0 then
            return nil, nil
        end
        return only, choice.allowed_tools.mode == "required" and CALL_ONE or nil
    end
    util.invalid_request("ollama: tool_choice must be \"none\", \"auto\", \"required\" or"
        .. " a function", "tool_choice")
end

-- The instruction joins the first system message, or becomes one.
local function instruct(messages, text)
    local first = messages[1]
    if first and first.role == "system" then
        first.content = (first.content ~= "" and first.content .. "\n\n" or "") .. text
    else
        table.insert(messages, 1, { role = "system", content = text })
    end
end

local function encode_chat(req, route, body)
    local tools, instruction = tool_plan(body)
    local messages = encode_messages(body.messages or array())
    if instruction then
        instruct(messages, instruction)
    end
    return {
        model = route.model,
        messages = messages,
        stream = req.stream == true, -- always explicit: Ollama streams by default
        options = encode_options(req, body),
        format = encode_format(body),
        tools = (tools and #tools > 0) and tools or nil,
        think = encode_think(route, body),
    }
end

-- The one prompt of a completions request: a string, or an array of one string.
local function one_prompt(body)
    local prompt = nonnull(body.prompt)
    if type(prompt) == "table" then
        if #prompt > 1 and type(prompt[1]) == "string" then
            util.not_for_route("ollama: one prompt per request (Ollama gives one choice per"
                .. " request)", "prompt")
        end
        prompt = prompt[1]
    end
    if type(prompt) ~= "string" then
        util.not_for_route("ollama: prompt must be a string or an array of strings"
            .. " (Ollama takes no token arrays)", "prompt")
    end
    return prompt
end

local function encode_generate(req, route, body)
    local suffix = nonnull(body.suffix)
    return {
        model = route.model,
        prompt = one_prompt(body),
        suffix = type(suffix) == "string" and suffix or nil,
        stream = req.stream == true,
        options = encode_options(req, body),
    }
end

local function encode_embed(route, body)
    local input = nonnull(body.input)
    if type(input) == "table" then
        for _, s in ipairs(input) do
            if type(s) ~= "string" then
                util.not_for_route("ollama: embedding input must be a string or an array of"
                    .. " strings (Ollama takes no token arrays)", "input")
            end
        end
        input = array(util.copy(input))
    elseif type(input) ~= "string" then
        util.not_for_route("ollama: embedding input must be a string or an array of strings",
            "input")
    end
    return { model = route.model, input = input, dimensions = nonnull(body.dimensions) }
end

-- list_models(route): the models Ollama has pulled (GET /api/tags), for GET /v1/models on a
-- provider with a model_prefix.
function M.list_models(route)
    local headers = util.bearer_headers(route)
    return { path = "/api/tags", headers = headers }
end

-- decode_models(resp): the names of /api/tags ({models = [{name = "llama3.2:latest", ...}]}).
function M.decode_models(resp)
    local ids = {}
    for _, m in ipairs(type(resp) == "table" and type(resp.models) == "table" and resp.models or {}) do
        local id = type(m) == "table" and (m.name or m.model)
        if type(id) == "string" and id ~= "" then
            ids[#ids + 1] = id
        end
    end
    return ids
end

-- encode(req, route): once per attempt.
function M.encode(req, route)
    local path = PATHS[req.endpoint]
    if not path then
        util.not_for_route("ollama: unsupported endpoint " .. tostring(req.endpoint))
    end
    local body = req.body or {}
    refuse_unsupported(req.endpoint, body)
    local out
    if req.endpoint == "chat" then
        out = encode_chat(req, route, body)
    elseif req.endpoint == "completions" then
        out = encode_generate(req, route, body)
    else
        out = encode_embed(route, body)
    end
    local headers = util.bearer_headers(route)
    return { method = "POST", path = path, headers = headers, body = out,
             stream_format = "ndjson" }
end

---------------------------------------------------------------------------------------------
-- decode: Ollama answer -> OpenAI object
---------------------------------------------------------------------------------------------

local function raise_if_error(obj)
    local err = nonnull(obj.error)
    if err ~= nil then
        error("ollama: " .. (type(err) == "table" and tostring(err.message) or tostring(err)), 0)
    end
end

local function usage_of(resp)
    local p = nonnull(resp.prompt_eval_count) or 0
    local c = nonnull(resp.eval_count) or 0
    return { prompt_tokens = p, completion_tokens = c, total_tokens = p + c }
end

local function finish_of(resp, had_tool_calls)
    local reason = FINISH[nonnull(resp.done_reason)] or "stop"
    if had_tool_calls and reason == "stop" then
        return "tool_calls"
    end
    return reason
end

-- Ollama tool_calls -> OpenAI tool_calls. `first` is the OpenAI index of the first call (a
-- stream may deliver calls over several lines); ids are made up when Ollama gives none.
local function tool_calls_to_openai(req, calls, first, with_index)
    return util.map_array(calls, function(call, i)
        local fn = call["function"] or {}
        local args = nonnull(fn.arguments)
        if type(args) ~= "string" then
            args = json.encode(args or {})
        end
        local n = first + i - 1
        local id = nonnull(call.id) or ("call_" .. tostring(req.request_id) .. "_" .. n)
        return {
            index = with_index and n or nil,
            id = id,
            type = "function",
            ["function"] = { name = fn.name, arguments = args },
        }
    end)
end

local function completion_id(req)
    local prefix = req.endpoint == "completions" and "cmpl-" or "chatcmpl-"
    return prefix .. tostring(req.request_id)
end

-- parallel_tool_calls = false, emulated: Ollama cannot be told, so only the first call of an
-- answer is kept. How many calls of `calls` to keep when `seen` were kept already.
local function calls_allowed(req, calls, seen)
    if type(req.body) == "table" and req.body.parallel_tool_calls == false then
        local left = math.max(1 - seen, 0)
        if #calls > left then
            local kept = array()
            for i = 1, left do
                kept[i] = calls[i]
            end
            return kept
        end
    end
    return calls
end

-- completions' echo = true, emulated: the prompt before the answer.
local function echoed(req)
    local body = type(req.body) == "table" and req.body or {}
    if body.echo ~= true then
        return ""
    end
    local prompt = nonnull(body.prompt)
    if type(prompt) == "table" then
        prompt = prompt[1]
    end
    return type(prompt) == "string" and prompt or ""
end

local function decode_chat(req, resp)
    local msg = resp.message or {}
    local calls = nonnull(msg.tool_calls)
    calls = calls and calls_allowed(req, calls, 0)
    local has_calls = calls ~= nil and #calls > 0
    local content = nonnull(msg.content) or ""
    local message = { role = "assistant", content = content, refusal = null }
    local thinking = nonnull(msg.thinking)
    if type(thinking) == "string" and thinking ~= "" then
        message.reasoning_content = thinking -- reasoning in: the field OpenAI-wire engines use
    end
    if has_calls then
        message.tool_calls = tool_calls_to_openai(req, calls, 0, false)
        if content == "" then
            message.content = null
        end
    end
    return {
        id = completion_id(req),
        object = "chat.completion",
        created = req.created,
        model = resp.model,
        choices = array({
            { index = 0, message = message, logprobs = null,
              finish_reason = finish_of(resp, has_calls) },
        }),
        usage = usage_of(resp),
    }
end

local function decode_generate(req, resp)
    return {
        id = completion_id(req),
        object = "text_completion",
        created = req.created,
        model = resp.model,
        choices = array({
            { index = 0, text = echoed(req) .. (nonnull(resp.response) or ""), logprobs = null,
              finish_reason = finish_of(resp, false) },
        }),
        usage = usage_of(resp),
    }
end

local function decode_embed(req, resp)
    local base64 = type(req.body) == "table" and req.body.encoding_format == "base64"
    local data = util.map_array(resp.embeddings or {}, function(vec, i)
        return { object = "embedding", index = i - 1,
                 embedding = base64 and util.float32_base64(vec) or vec }
    end)
    local p = nonnull(resp.prompt_eval_count) or 0
    return {
        object = "list",
        data = data,
        model = resp.model,
        usage = { prompt_tokens = p, total_tokens = p },
    }
end

-- decode(req, resp): once, for a non-stream answer. resp = the upstream JSON as a table.
function M.decode(req, resp)
    raise_if_error(resp)
    if req.endpoint == "chat" then
        return decode_chat(req, resp)
    elseif req.endpoint == "completions" then
        return decode_generate(req, resp)
    elseif req.endpoint == "embeddings" then
        return decode_embed(req, resp)
    end
    error("ollama: unsupported endpoint " .. tostring(req.endpoint), 0)
end

---------------------------------------------------------------------------------------------
-- decode_event: one NDJSON line of an Ollama stream -> OpenAI chunks
---------------------------------------------------------------------------------------------

-- A chat.completion.chunk with one choice. finish_reason and logprobs are explicitly null
-- where OpenAI sends null: the core cannot tell an absent field from a null one.
local function chat_chunk(req, line, delta, finish_reason)
    return {
        id = completion_id(req),
        object = "chat.completion.chunk",
        created = req.created,
        model = line.model,
        choices = array({
            { index = 0, delta = delta, logprobs = null, finish_reason = finish_reason or null },
        }),
    }
end

local function text_chunk(req, line, text, finish_reason)
    return {
        id = completion_id(req),
        object = "text_completion",
        created = req.created,
        model = line.model,
        choices = array({
            { index = 0, text = text, logprobs = null, finish_reason = finish_reason or null },
        }),
    }
end

local function stream_usage(line)
    if nonnull(line.prompt_eval_count) == nil and nonnull(line.eval_count) == nil then
        return nil
    end
    return usage_of(line)
end

local function chat_event(req, line, state)
    local out = array()
    local msg = nonnull(line.message) or {}
    local content = nonnull(msg.content) or ""
    local thinking = nonnull(msg.thinking)
    local calls = nonnull(msg.tool_calls)
    calls = calls and calls_allowed(req, calls, state.tool_calls or 0)
    local delta = {}
    if not state.started then
        delta.role = "assistant"
    end
    if content ~= "" or not state.started then
        delta.content = content
    end
    if type(thinking) == "string" and thinking ~= "" then
        delta.reasoning_content = thinking -- streamed as it arrives, while the model thinks
    end
    if calls and #calls > 0 then
        state.tool_calls = state.tool_calls or 0
        delta.tool_calls = tool_calls_to_openai(req, calls, state.tool_calls, true)
        state.tool_calls = state.tool_calls + #calls
    end
    if next(delta) ~= nil then
        state.started = true
        out[#out + 1] = chat_chunk(req, line, delta, nil)
    end
    if line.done == true then
        local last = chat_chunk(req, line, {}, finish_of(line, (state.tool_calls or 0) > 0))
        last.usage = stream_usage(line)
        out[#out + 1] = last
        state.done = true
    end
    return out
end

local function generate_event(req, line, state)
    local out = array()
    local text = nonnull(line.response) or ""
    if not state.started then
        state.started = true
        text = echoed(req) .. text
    end
    if line.done == true then
        local last = text_chunk(req, line, text, finish_of(line, false))
        last.usage = stream_usage(line)
        out[1] = last
        state.done = true
    elseif text ~= "" then
        out[1] = text_chunk(req, line, text, nil)
    end
    return out
end

-- decode_event(req, line, state): once per NDJSON line of a stream. state starts as {} and is
-- kept for the request: started (the role chunk went out), tool_calls (how many so far),
-- done (Ollama sent its final line; a stream that ends without it is truncated).
function M.decode_event(req, line, state)
    raise_if_error(line)
    if req.endpoint == "chat" then
        return chat_event(req, line, state)
    elseif req.endpoint == "completions" then
        return generate_event(req, line, state)
    end
    error("ollama: streaming is not supported for endpoint " .. tostring(req.endpoint), 0)
end

return M
