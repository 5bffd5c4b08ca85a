-- adapters/triton.lua: NVIDIA Triton Inference Server's generate extension (KServe v2).
--
-- Triton serves text generation models (TensorRT-LLM ensembles, the vLLM backend) at
--   POST /v2/models/{model}/generate         one JSON answer
--   POST /v2/models/{model}/generate_stream  Server-Sent Events, one `data:` answer per piece
-- Text in, text out: the request's inputs are top-level members named after the model's input
-- tensors (`text_input`, `max_tokens`, ...), the answer's outputs likewise (`text_output`).
--
-- Provider config: base_url is the server root, e.g. http://127.0.0.1:8000 (Triton's HTTP
-- port; no /v2). api_key is optional and sent as a Bearer token (Triton behind a proxy).
--
-- Mapping notes:
--   * Chat messages become one prompt: Triton applies no chat template, so a conversation is
--     rendered as "role: text" lines ending in "assistant:" (a single user message, with no
--     system message, is sent as it is). /v1/completions sends `prompt` as it is.
--   * max_tokens (or max_completion_tokens) -> max_tokens (the ensemble needs one: the
--     request's or 512); temperature, top_p, top_k, frequency_penalty, presence_penalty ->
--     inputs of the same name; seed -> random_seed; stop -> stop_words (a list).
--   * Refused (util.not_for_route: another route may serve it): tools and tool calls, images
--     and other non-text parts, n > 1, logprobs, response_format other than text, embeddings.
--   * Answers: text_output -> content; finish_reason ("stop"/"length", the vLLM backend's
--     return_finish_reason output) when Triton gives one, else "stop"; num_input_tokens /
--     num_output_tokens (the vLLM backend's return_num_*_tokens) -> usage, else the core counts.
--   * Errors: Triton answers {"error": "text"} (HTTP 400 for a bad request, 5xx for the
--     server's faults); the core maps the status and passes the text. Mid-stream the same
--     object arrives as a `data:` event: raised, so the client's stream ends with an error.
--   * A generate_stream has no end marker: the stream simply ends. stream_eof = true asks the
--     core to call decode_event once more with util.null at a clean end, which closes the
--     answer (finish chunk with usage) when no piece carried a finish_reason.

local util = require("moongate.util")
local moongate = require("moongate")

local null, array, nonnull = util.null, util.array, util.nonnull

local M = { name = "triton", version = 1 }

M.passthrough = false
M.probe_path = "/v2/health/ready" -- health probe: Triton answers 200 when it serves
M.stream_eof = true

local FINISH = { stop = "stop", length = "length", abort = "stop" }
local DEFAULT_MAX_TOKENS = 512

function M.check(provider)
    local url = provider.base_url
    local bad = util.check_base_url("triton", url, "http://127.0.0.1:8000", "paths such as /v2/models/... are")
    if bad then
        return bad
    end
    if url:match("/v2$") or url:match("/v1$") then
        return "triton: base_url must be the server root (e.g. http://127.0.0.1:8000), without /v2"
    end
    return nil
end

---------------------------------------------------------------------------------------------
-- encode: OpenAI request -> Triton generate request
---------------------------------------------------------------------------------------------

-- The text of one message's content (a string, null or a list of text parts).
local function text_of(content, where)
    content = nonnull(content)
    if content == nil then return "" end
    if type(content) == "string" then return content end
    local texts = {}
    for i, part in ipairs(content) do
        if part.type ~= "text" then
            util.not_for_route("triton: content part type " .. tostring(part.type)
                .. " is not supported (Triton's generate takes text)",
                where .. "[" .. (i - 1) .. "].type")
        end
        texts[#texts + 1] = part.text
    end
    return table.concat(texts, "\n")
end

-- Chat messages -> one prompt.
local function prompt_of(messages)
    local list = nonnull(messages) or {}
    local lines = {}
    for i, m in ipairs(list) do
        local where = "messages[" .. (i - 1) .. "]"
        if nonnull(m.tool_calls) ~= nil and #m.tool_calls > 0 or m.role == "tool" then
            util.not_for_route("triton: tool calls are not supported (Triton's generate takes text)",
                where)
        end
        local role = m.role == "developer" and "system" or m.role
        lines[#lines + 1] = { role = role, text = text_of(m.content, where .. ".content") }
    end
    if #lines == 1 and lines[1].role == "user" then return lines[1].text end
    local out = {}
    for _, l in ipairs(lines) do out[#out + 1] = l.role .. ": " .. l.text end
    out[#out + 1] = "assistant:"
    return table.concat(out, "\n")
end

local function truthy(v) return nonnull(v) ~= nil and v ~= false end

-- What Triton's generate cannot do: refused, never dropped.
local function refuse_unsupported(body)
    local tools = nonnull(body.tools)
    if tools ~= nil and #tools > 0 then
        util.not_for_route("triton: tools are not supported (Triton's generate takes text)", "tools")
    end
    if (tonumber(nonnull(body.n)) or 1) > 1 then
        util.not_for_route("triton: n > 1 is not supported: one answer per request", "n")
    end
    if truthy(body.logprobs) then
        util.not_for_route("triton: logprobs is not supported", "logprobs")
    end
    local rf = nonnull(body.response_format)
    if type(rf) == "table" and rf.type ~= "text" then
        util.not_for_route("triton: response_format " .. tostring(rf.type) .. " is not supported",
            "response_format")
    end
end

local function stop_words(stop)
    stop = nonnull(stop)
    if stop == nil then return nil end
    if type(stop) == "string" then return array({ stop }) end
    return array(util.copy(stop))
end

function M.encode(req, route)
    local body = req.body or {}
    local text
    if req.endpoint == "chat" then
        refuse_unsupported(body)
        text = prompt_of(body.messages)
    elseif req.endpoint == "completions" then
        refuse_unsupported(body)
        local p = nonnull(body.prompt)
        if type(p) ~= "string" then
            util.not_for_route("triton: prompt must be a string (token arrays and lists are not supported)",
                "prompt")
        end
        text = p
    else
        util.not_for_route("triton: " .. tostring(req.endpoint) .. " is not supported by Triton's generate")
    end
    local up = {
        text_input = text,
        max_tokens = nonnull(body.max_tokens) or nonnull(body.max_completion_tokens)
            or req.max_tokens or DEFAULT_MAX_TOKENS,
        temperature = nonnull(body.temperature),
        top_p = nonnull(body.top_p),
        top_k = nonnull(body.top_k),
        frequency_penalty = nonnull(body.frequency_penalty),
        presence_penalty = nonnull(body.presence_penalty),
        random_seed = nonnull(body.seed),
        stop_words = stop_words(body.stop),
        stream = req.stream and true or false,
    }
    local headers = util.bearer_headers(route)
    local path = "/v2/models/" .. route.model .. (req.stream and "/generate_stream" or "/generate")
    return { method = "POST", path = path, headers = headers, body = up, stream_format = "sse" }
end

---------------------------------------------------------------------------------------------
-- decode / decode_event: Triton answers -> OpenAI objects
---------------------------------------------------------------------------------------------

-- Triton returns a one-element output either as a scalar or as a list.
local function scalar(v)
    v = nonnull(v)
    if type(v) == "table" then return nonnull(v[1]) end
    return v
end

local function raise_if_error(obj)
    local e = nonnull(obj.error)
    if e ~= nil then
        error("triton: " .. (type(e) == "string" and e or tostring(nonnull(e.message))), 0)
    end
end

local function usage_of(obj)
    local pt, ct = tonumber(scalar(obj.num_input_tokens)), tonumber(scalar(obj.num_output_tokens))
    if not pt or not ct then return nil end
    return { prompt_tokens = pt, completion_tokens = ct, total_tokens = pt + ct }
end

-- Tokens of a text when Triton did not count them: the gateway's tokenizer (o200k_base), or
-- a quarter of the bytes where it is not loaded.
local function count(text)
    local ok, n = pcall(moongate.tokens, text)
    if ok and type(n) == "number" then return n end
    return math.ceil(#text / 4)
end

-- The usage of a whole answer: Triton's counts, else the prompt and the text counted here.
local function usage_counted(req, resp, text)
    local u = usage_of(resp)
    if u then return u end
    local body = req.body or {}
    local prompt = req.endpoint == "completions" and tostring(nonnull(body.prompt) or "")
        or prompt_of(body.messages)
    local pt, ct = count(prompt), count(text)
    return { prompt_tokens = pt, completion_tokens = ct, total_tokens = pt + ct }
end

local function finish_of(obj)
    local f = scalar(obj.finish_reason)
    if f == nil then return nil end
    return FINISH[f] or "stop"
end

local function completion_id(req)
    return (req.endpoint == "completions" and "cmpl-" or "chatcmpl-") .. tostring(req.request_id)
end

function M.decode(req, resp)
    raise_if_error(resp)
    local text = scalar(resp.text_output) or ""
    local finish = finish_of(resp) or "stop"
    local choice
    if req.endpoint == "completions" then
        choice = { index = 0, text = text, logprobs = null, finish_reason = finish }
    else
        choice = { index = 0, logprobs = null, finish_reason = finish,
                   message = { role = "assistant", content = text, refusal = null } }
    end
    return {
        id = completion_id(req),
        object = req.endpoint == "completions" and "text_completion" or "chat.completion",
        created = req.created,
        model = nonnull(resp.model_name) or req.body.model,
        choices = array({ choice }),
        usage = usage_counted(req, resp, text),
    }
end

local function chunk(req, state, text, finish, first)
    local c = { index = 0, logprobs = null, finish_reason = finish or null }
    if req.endpoint == "completions" then
        c.text = text or ""
    else
        c.delta = {}
        if first then c.delta.role = "assistant" end
        if text and text ~= "" then c.delta.content = text end
    end
    return {
        id = completion_id(req),
        object = req.endpoint == "completions" and "text_completion" or "chat.completion.chunk",
        created = req.created,
        model = state.model or req.body.model,
        choices = array({ c }),
    }
end

-- decode_event(req, ev, state): ev is one generate_stream answer, or util.null at the
-- stream's clean end (stream_eof). state keeps the model, whether the first chunk went out
-- (started) and done.
function M.decode_event(req, ev, state)
    local out = array()
    if ev == null then
        if not state.done then
            out[1] = chunk(req, state, nil, "stop", not state.started)
            state.done = true
        end
        return out
    end
    raise_if_error(ev)
    state.model = state.model or nonnull(ev.model_name)
    local text = scalar(ev.text_output) or ""
    local finish = finish_of(ev)
    if text ~= "" or not state.started then
        if not finish then
            out[#out + 1] = chunk(req, state, text, nil, not state.started)
            state.started = true
            text = ""
        end
    end
    if finish then
        local last = chunk(req, state, text, finish, not state.started)
        last.usage = usage_of(ev)
        out[#out + 1] = last
        state.started, state.done = true, true
    end
    return out
end

return M
