-- adapters/openai_responses.lua: the OpenAI wire, for servers that also speak the Responses
-- API (POST {base_url}/responses) themselves: OpenAI, and the engines that added it.
--
-- Like openai.lua this is a passthrough adapter (the core sends the bodies and forwards the
-- streams itself); what it adds is M.entry_wire = "responses": a client's POST
-- /v1/responses routed here is not bridged to chat, it is sent as the client wrote it (model
-- set to the route's upstream name, the gateway's extensions taken out; store, reasoning,
-- built-in tools, previous_response_id and unknown fields untouched) and its answer, JSON or
-- SSE, goes back as the upstream wrote it (the model name put back to the client's). The
-- core reads the usage, the end and the errors from it (core/pipeline/responses_native.c).
-- Chat, completions and embeddings requests are served as by openai.lua.
--
-- Provider config: as openai.lua (base_url with its version prefix, e.g.
-- https://api.openai.com/v1; api_key optional), with `adapter: openai_responses`.

local util = require("moongate.util")

local M = { name = "openai_responses", version = 1 }

M.passthrough = true
M.entry_wire = "responses"

-- Provider data: where each endpoint lives under base_url.
local PATHS = {
    chat = "/chat/completions",
    completions = "/completions",
    embeddings = "/embeddings",
}
local RESPONSES_PATH = "/responses"

function M.check(provider)
    local url = provider.base_url
    if type(url) ~= "string" or url == "" then
        return "openai_responses: base_url is required (e.g. https://api.openai.com/v1)"
    end
    if not url:match("^https?://") then
        return "openai_responses: base_url must start with http:// or https:// (got " .. url .. ")"
    end
    if url:sub(-1) == "/" then
        return "openai_responses: base_url must not end with '/' (paths such as /responses are appended)"
    end
    return nil
end

local function auth_headers(route)
    local headers = {}
    if type(route.api_key) == "string" and route.api_key ~= "" then
        headers["Authorization"] = "Bearer " .. route.api_key
    end
    return headers
end

function M.list_models(route)
    return { path = "/models", headers = auth_headers(route) }
end

function M.decode_models(resp)
    return util.list_ids(resp)
end

-- encode(req, route): a Responses client's request (req.entry.wire == "responses", set by the
-- core for this adapter's routes) goes to /responses; any other to its chat-wire path. The
-- body is the core's either way (body = nil).
function M.encode(req, route)
    local entry = req.entry
    local path
    if type(entry) == "table" and entry.wire == "responses" then
        path = RESPONSES_PATH
    else
        path = PATHS[req.endpoint]
    end
    if not path then
        util.not_for_route("openai_responses: unsupported endpoint " .. tostring(req.endpoint))
    end
    return { method = "POST", path = path, headers = auth_headers(route), body = nil,
             stream_format = "sse" }
end

return M
