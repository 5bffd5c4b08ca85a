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

local M = { name = "openai", version = 1 }

M.passthrough = true

-- Provider data: where each endpoint lives under base_url.
local PATHS = {
    chat = "/chat/completions",
    completions = "/completions",
    embeddings = "/embeddings",
}

-- check(provider): called at load and at every reload with the provider's config table.
-- Returns nil when the provider is usable, or a message saying what to fix.
function M.check(provider)
    local url = provider.base_url
    if type(url) ~= "string" or url == "" then
        return "openai: base_url is required (e.g. http://127.0.0.1:8001/v1)"
    end
    if not url:match("^https?://") then
        return "openai: base_url must start with http:// or https:// (got " .. url .. ")"
    end
    if url:sub(-1) == "/" then
        return "openai: base_url must not end with '/' (paths such as /chat/completions are appended)"
    end
    return nil
end

-- The bearer header of the route's key, when it has one.
local function auth_headers(route)
    local headers = {}
    if type(route.api_key) == "string" and route.api_key ~= "" then
        headers["Authorization"] = "Bearer " .. route.api_key
    end
    return headers
end

-- list_models(route): the GET under base_url that lists the upstream's models ({base_url}/models:
-- base_url holds the /v1), for GET /v1/models on a provider with a model_prefix.
function M.list_models(route)
    return { path = "/models", headers = auth_headers(route) }
end

-- decode_models(resp): the ids of an OpenAI list ({object = "list", data = [{id, ...}]}).
function M.decode_models(resp)
    return util.list_ids(resp)
end

-- encode(req, route): once per attempt. Returns the upstream request description; body = nil
-- lets the core send its canonical body.
function M.encode(req, route)
    local path = PATHS[req.endpoint]
    if not path then
        util.not_for_route("openai: unsupported endpoint " .. tostring(req.endpoint))
    end
    return {
        method = "POST",
        path = path,
        headers = auth_headers(route),
        body = nil,
        stream_format = "sse",
    }
end

return M
