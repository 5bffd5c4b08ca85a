-- adapters/openai.lua: the OpenAI wire format.
--
-- Serves every OpenAI-compatible server: OpenAI itself, vLLM, llama.cpp's llama-server,
-- NVIDIA NIM, LM Studio, Ollama's /v1 endpoints, and so on. Because the upstream already speaks
-- the format clients speak to moongate, this adapter is a passthrough: the core sends its own
-- canonical body (extensions stripped, `model` set to the route's upstream name) and forwards
-- the SSE stream as it arrives, without calling Lua per chunk. All this file decides is the
-- path and the credentials.
--
-- Provider config:  base_url is the API root including its version prefix, e.g.
--   http://127.0.0.1:8001/v1 (vLLM), http://127.0.0.1:8080/v1 (llama-server),
--   https://api.openai.com/v1, https://integrate.api.nvidia.com/v1 (NIM).
-- api_key is optional; without one no Authorization header is sent (local servers).

local util = require("moongate.util")
local wire = require("moongate.openai_wire")

local M = { name = "openai", version = 1 }

M.passthrough = true

-- check(provider): called at load and at every reload with the provider's config table.
-- Returns nil when the provider is usable, or a message saying what to fix.
function M.check(provider)
    return wire.check("openai", provider)
end

-- list_models(route) / decode_models(resp): GET {base_url}/models and its ids, for GET
-- /v1/models on a provider with a model_prefix.
M.list_models = wire.list_models
M.decode_models = wire.decode_models

-- encode(req, route): once per attempt. Returns the upstream request description; body = nil
-- lets the core send its canonical body.
function M.encode(req, route)
    local path = wire.PATHS[req.endpoint]
    if not path then
        util.not_for_route("openai: unsupported endpoint " .. tostring(req.endpoint))
    end
    return {
        method = "POST",
        path = path,
        headers = wire.auth_headers(route),
        body = nil,
        stream_format = "sse",
    }
end

return M
