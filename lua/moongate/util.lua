-- moongate.util: small pure-Lua helpers shared by policies and adapters.
--
-- The one thing every adapter must get right is the JSON <-> Lua mapping, because Lua has a
-- single table type where JSON has two (object, array) and no value for null:
--
--   * util.null      stands for JSON null. The core converts JSON null to it and writes it
--                    back as null. Use it where a field must be present *and* null
--                    (e.g. finish_reason on a non-final stream chunk).
--   * util.array_mt  marks a table as a JSON array. The core gives every decoded JSON array this
--                    metatable. A table with it always encodes as an array, so an empty one
--                    becomes [] and not {}. A table without it encodes as an array only when its
--                    keys are exactly 1..n with n > 0; any other table, including an empty one,
--                    encodes as an object.
--
-- The C core fetches util.null and util.array_mt from this module by name when it builds a
-- Lua state: do not rename them.
--
-- Nothing here does I/O; everything works the same under busted and inside the gateway.

local util = {}

-- JSON null. A unique, read-only table; compare with `v == util.null`.
util.null = setmetatable({}, {
    __name = "moongate.null",
    __tostring = function()
        return "null"
    end,
    __newindex = function()
        error("moongate.util.null is read-only", 2)
    end,
})

-- Metatable that marks a JSON array.
util.array_mt = { __name = "moongate.array" }

-- util.array(t): mark t (or a new empty table) as a JSON array and return it.
function util.array(t)
    return setmetatable(t or {}, util.array_mt)
end

-- util.is_array(t): true when t would encode as a JSON array, by the same rule the core uses:
-- it carries util.array_mt, or its keys are exactly 1..n with n > 0.
function util.is_array(t)
    if type(t) ~= "table" or t == util.null then
        return false
    end
    if getmetatable(t) == util.array_mt then
        return true
    end
    local n = #t
    if n == 0 then
        return false
    end
    local count = 0
    for k in pairs(t) do
        if math.type(k) ~= "integer" or k < 1 or k > n then
            return false
        end
        count = count + 1
    end
    return count == n
end

-- util.is_null(v): true for util.null.
function util.is_null(v)
    return v == util.null
end

-- util.nonnull(v): v, or nil when v is nil or util.null. Request bodies come from clients, and
-- `"temperature": null` must read like an absent field.
function util.nonnull(v)
    if v == util.null then
        return nil
    end
    return v
end

-- util.copy(t): shallow copy of t, keeping its metatable (so an array stays an array).
function util.copy(t)
    local out = {}
    for k, v in pairs(t) do
        out[k] = v
    end
    return setmetatable(out, getmetatable(t))
end

-- util.map_array(t, fn): a new JSON array of fn(v, i) for i = 1..#t.
function util.map_array(t, fn)
    local out = util.array()
    for i = 1, #t do
        out[i] = fn(t[i], i)
    end
    return out
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

-- util.base64_encode(s): standard base64 (RFC 4648, with padding) of the byte string s.
function util.base64_encode(s)
    local out = {}
    for i = 1, #s, 3 do
        local a, b, c = s:byte(i, i + 2)
        local n = (a << 16) | ((b or 0) << 8) | (c or 0)
        local q1 = (n >> 18) & 63
        local q2 = (n >> 12) & 63
        local q3 = (n >> 6) & 63
        local q4 = n & 63
        out[#out + 1] = B64:sub(q1 + 1, q1 + 1) .. B64:sub(q2 + 1, q2 + 1)
            .. (b and B64:sub(q3 + 1, q3 + 1) or "=") .. (c and B64:sub(q4 + 1, q4 + 1) or "=")
    end
    return table.concat(out)
end

-- util.float32_base64(vec): the OpenAI `encoding_format: "base64"` form of an embedding:
-- the vector as little-endian IEEE-754 float32 values, base64-encoded.
function util.float32_base64(vec)
    local parts = {}
    for i = 1, #vec do
        parts[i] = string.pack("<f", vec[i])
    end
    return util.base64_encode(table.concat(parts))
end

-- Refusals: an adapter's encode says, on purpose, that it will not send a request. It raises
-- one of these (from any depth of its code) and the core reads the kind, the reason and the
-- request field it names (`param`, e.g. "messages[0].content[1].image_url.url"):
--
--   util.not_for_route(message, param)    this route cannot serve the request, another may:
--                                          the core tries the next one; when none takes it,
--                                          the client gets 400 INVALID_REQUEST with message
--                                          and param (never a 5xx)
--   util.invalid_request(message, param)  the request itself is wrong: 400 INVALID_REQUEST
--                                          at once, no other route is tried
--
-- Any other error raised by encode is the adapter's own fault (skipped, then 502).
util.refusal_mt = {
    __name = "moongate.refusal",
    __tostring = function(r)
        return r.message
    end,
}

-- The ids of a model list as OpenAI and Anthropic write it ({data = [{id = "...", ...}]}),
-- in its order; entries without a string id are skipped (an adapter's decode_models).
function util.list_ids(resp)
    local ids = {}
    for _, m in ipairs(type(resp) == "table" and type(resp.data) == "table" and resp.data or {}) do
        if type(m) == "table" and type(m.id) == "string" and m.id ~= "" then
            ids[#ids + 1] = m.id
        end
    end
    return ids
end

-- util.check_base_url(name, url, example, appended): the checks every adapter makes of a
-- provider's base_url (present, http(s), no trailing '/'); nil when they pass, else the
-- message, prefixed with the adapter's name. appended says what is put after it, e.g.
-- "paths such as /chat/completions are".
function util.check_base_url(name, url, example, appended)
    if type(url) ~= "string" or url == "" then
        return name .. ": base_url is required (e.g. " .. example .. ")"
    end
    if not url:match("^https?://") then
        return name .. ": base_url must start with http:// or https:// (got " .. url .. ")"
    end
    if url:sub(-1) == "/" then
        return name .. ": base_url must not end with '/' (" .. appended .. " appended)"
    end
    return nil
end

-- util.bearer_headers(route): {Authorization = "Bearer <key>"} when the route has a key, else
-- {} (keyless local servers).
function util.bearer_headers(route)
    local headers = {}
    if type(route.api_key) == "string" and route.api_key ~= "" then
        headers["Authorization"] = "Bearer " .. route.api_key
    end
    return headers
end

local function refuse(kind, message, param)
    error(setmetatable({ refusal = kind, message = tostring(message),
                         param = param ~= nil and tostring(param) or nil }, util.refusal_mt), 0)
end

function util.not_for_route(message, param)
    refuse("not_for_route", message, param)
end

function util.invalid_request(message, param)
    refuse("invalid_request", message, param)
end

-- util.refusal_of(err): the refusal table when err (what pcall caught) is one, else nil.
function util.refusal_of(err)
    if getmetatable(err) == util.refusal_mt then
        return err
    end
    return nil
end

return util
