-- moongate.openai_wire: what the adapters for OpenAI-compatible servers share (openai.lua and
-- openai_responses.lua): the chat-wire paths under base_url, the Bearer credentials, the
-- provider check and the model list. Pure Lua, no I/O.

local util = require("moongate.util")

local wire = {}

-- Where each endpoint lives under base_url (which holds the version prefix, e.g. .../v1).
wire.PATHS = {
    chat = "/chat/completions",
    completions = "/completions",
    embeddings = "/embeddings",
}

-- wire.check(name, provider): an adapter's check (nil when usable, else what to fix).
function wire.check(name, provider)
    return util.check_base_url(name, provider.base_url, "http://127.0.0.1:8001/v1",
                               "paths such as /chat/completions are")
end

-- The bearer header of the route's key, when it has one (none for keyless local servers).
wire.auth_headers = util.bearer_headers

-- list_models(route): GET {base_url}/models with the route's key, for GET /v1/models on a
-- provider with a model_prefix.
function wire.list_models(route)
    return { path = "/models", headers = wire.auth_headers(route) }
end

-- decode_models(resp): the ids of an OpenAI list ({object = "list", data = [{id, ...}]}).
wire.decode_models = util.list_ids

return wire
