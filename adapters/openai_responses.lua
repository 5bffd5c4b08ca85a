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
local wire = require("moongate.openai_wire")

local M = { name = "openai_responses", version = 1 }

M.passthrough = true
M.entry_wire = "responses"

local RESPONSES_PATH = "/responses"

function M.check(provider)
    return wire.check("openai_responses", provider)
end

M.list_models = wire.list_models
M.decode_models = wire.decode_models

-- encode(req, route): a Responses client's request (req.entry.wire == "responses", set by the
-- core for this adapter's routes) goes to /responses; any other to its chat-wire path. The
-- body is the core's either way (body = nil).
function M.encode(req, route)
    local entry = req.entry
    local path
    if type(entry) == "table" and entry.wire == "responses" then
        path = RESPONSES_PATH
    else
        path = wire.PATHS[req.endpoint]
    end
    if not path then
        util.not_for_route("openai_responses: unsupported endpoint " .. tostring(req.endpoint))
    end
    return { method = "POST", path = path, headers = wire.auth_headers(route), body = nil,
             stream_format = "sse" }
end

return M
