-- moongate.json: a small pure-Lua JSON encoder and decoder with the core's conventions
-- (util.null for null, util.array_mt on arrays; see lua/moongate/util.lua).
--
-- Why it exists next to the C functions moongate.json_encode / moongate.json_decode: adapters
-- sometimes need JSON *inside* a field (OpenAI tool-call arguments are a JSON string, Ollama's
-- are an object) and must stay testable under busted, where the C module is absent. The values
-- involved are small; the request and response bodies themselves are always converted by the
-- core in C.
--
-- Deliberately not supported: encoding tables with cycles, non-finite numbers, or keys that
-- are neither strings nor numbers (all raise an error). Object keys are written sorted, so the
-- output is deterministic.

local util = require("moongate.util")

local json = {}

local ESCAPES = {
    ['"'] = '\\"',
    ["\\"] = "\\\\",
    ["\b"] = "\\b",
    ["\f"] = "\\f",
    ["\n"] = "\\n",
    ["\r"] = "\\r",
    ["\t"] = "\\t",
}

local function encode_string(s)
    return '"' .. s:gsub('[%c"\\]', function(c)
        return ESCAPES[c] or string.format("\\u%04x", c:byte())
    end) .. '"'
end

local function encode_number(n)
    if math.type(n) == "integer" then
        return tostring(n)
    end
    if n ~= n or n == math.huge or n == -math.huge then
        error("json: cannot encode non-finite number", 0)
    end
    if n == math.floor(n) and math.abs(n) < 2 ^ 53 then
        return string.format("%d", n) -- 3.0 -> 3, as cJSON writes it
    end
    return string.format("%.17g", n)
end

local encode_value

local function encode_array(t, seen)
    local out = {}
    for i = 1, #t do
        out[i] = encode_value(t[i], seen)
    end
    return "[" .. table.concat(out, ",") .. "]"
end

local function encode_object(t, seen)
    local keys = {}
    for k in pairs(t) do
        if type(k) ~= "string" and type(k) ~= "number" then
            error("json: cannot encode a " .. type(k) .. " key", 0)
        end
        keys[#keys + 1] = tostring(k)
    end
    table.sort(keys)
    local out = {}
    for i, k in ipairs(keys) do
        local v = t[k]
        if v == nil then
            v = t[tonumber(k)]
        end
        out[i] = encode_string(k) .. ":" .. encode_value(v, seen)
    end
    return "{" .. table.concat(out, ",") .. "}"
end

encode_value = function(v, seen)
    local tv = type(v)
    if v == nil or v == util.null then
        return "null"
    elseif tv == "boolean" then
        return tostring(v)
    elseif tv == "number" then
        return encode_number(v)
    elseif tv == "string" then
        return encode_string(v)
    elseif tv == "table" then
        if seen[v] then
            error("json: cannot encode a table with cycles", 0)
        end
        seen[v] = true
        local s = util.is_array(v) and encode_array(v, seen) or encode_object(v, seen)
        seen[v] = nil
        return s
    end
    error("json: cannot encode a " .. tv, 0)
end

-- json.encode(v): the JSON text of v. Raises an error on values JSON cannot hold.
function json.encode(v)
    return encode_value(v, {})
end

-- Decoder: recursive descent over the string; `pos` is the index of the next byte.

local decode_value

local function decode_error(s, pos, what)
    error(string.format("json: %s at offset %d", what, pos - 1), 0)
end

local function skip_ws(s, pos)
    return s:find("[^ \t\r\n]", pos) or #s + 1
end

local function decode_string(s, pos)
    local out = {}
    local i = pos + 1
    while true do
        local j = s:find('["\\%c]', i)
        if not j then
            decode_error(s, pos, "unterminated string")
        end
        out[#out + 1] = s:sub(i, j - 1)
        local c = s:sub(j, j)
        if c == '"' then
            return table.concat(out), j + 1
        elseif c ~= "\\" then
            decode_error(s, j, "control character in string")
        end
        local e = s:sub(j + 1, j + 1)
        if e == "u" then
            local hex = s:match("^%x%x%x%x", j + 2)
            if not hex then
                decode_error(s, j, "bad \\u escape")
            end
            local cp = tonumber(hex, 16)
            i = j + 6
            local lo = s:match("^\\u(%x%x%x%x)", i)
            if cp >= 0xD800 and cp <= 0xDBFF and lo then
                local low = tonumber(lo, 16)
                if low >= 0xDC00 and low <= 0xDFFF then
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    i = i + 6
                end
            end
            out[#out + 1] = utf8.char(cp)
        else
            local map = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f",
                          n = "\n", r = "\r", t = "\t" }
            if not map[e] then
                decode_error(s, j, "bad escape")
            end
            out[#out + 1] = map[e]
            i = j + 2
        end
    end
end

local function decode_number(s, pos)
    local text = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    local n = text and tonumber(text)
    if not n then
        decode_error(s, pos, "bad number")
    end
    return n, pos + #text
end

local function decode_array(s, pos)
    local arr = util.array()
    pos = skip_ws(s, pos + 1)
    if s:sub(pos, pos) == "]" then
        return arr, pos + 1
    end
    while true do
        arr[#arr + 1], pos = decode_value(s, pos)
        pos = skip_ws(s, pos)
        local c = s:sub(pos, pos)
        if c == "]" then
            return arr, pos + 1
        elseif c ~= "," then
            decode_error(s, pos, "expected ',' or ']'")
        end
        pos = skip_ws(s, pos + 1)
    end
end

local function decode_object(s, pos)
    local obj = {}
    pos = skip_ws(s, pos + 1)
    if s:sub(pos, pos) == "}" then
        return obj, pos + 1
    end
    while true do
        if s:sub(pos, pos) ~= '"' then
            decode_error(s, pos, "expected a string key")
        end
        local key
        key, pos = decode_string(s, pos)
        pos = skip_ws(s, pos)
        if s:sub(pos, pos) ~= ":" then
            decode_error(s, pos, "expected ':'")
        end
        obj[key], pos = decode_value(s, skip_ws(s, pos + 1))
        pos = skip_ws(s, pos)
        local c = s:sub(pos, pos)
        if c == "}" then
            return obj, pos + 1
        elseif c ~= "," then
            decode_error(s, pos, "expected ',' or '}'")
        end
        pos = skip_ws(s, pos + 1)
    end
end

local LITERALS = { ["true"] = true, ["false"] = false, null = util.null }

decode_value = function(s, pos)
    local c = s:sub(pos, pos)
    if c == "{" then
        return decode_object(s, pos)
    elseif c == "[" then
        return decode_array(s, pos)
    elseif c == '"' then
        return decode_string(s, pos)
    elseif c == "-" or c:match("%d") then
        return decode_number(s, pos)
    end
    for word, value in pairs(LITERALS) do
        if s:sub(pos, pos + #word - 1) == word then
            return value, pos + #word
        end
    end
    decode_error(s, pos, "unexpected character")
end

-- json.decode(s): the Lua value of the JSON text s (arrays carry util.array_mt, null is
-- util.null). Raises an error on malformed input or trailing garbage.
function json.decode(s)
    if type(s) ~= "string" then
        error("json: decode expects a string", 0)
    end
    local v, pos = decode_value(s, skip_ws(s, 1))
    pos = skip_ws(s, pos)
    if pos <= #s then
        decode_error(s, pos, "trailing characters")
    end
    return v
end

return json
