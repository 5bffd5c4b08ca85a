-- tests/lua/helper.lua: shared set-up for the busted specs. Load with
--   local h = dofile("tests/lua/helper.lua")
-- from the repository root (busted's working directory). It makes require("moongate.*")
-- resolve to lua/moongate/*.lua, as the core does with lua.lib, and require("moongate") to the
-- gateway's own C module, built as build/lua/moongate.so (CMake target moongate_lua; ctest
-- says where in MOONGATE_LUA_CPATH), and gives fixture loaders that convert JSON the way the
-- core does (arrays carry util.array_mt, null is util.null).

if not package.path:find("./lua/?.lua", 1, true) then
    package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path
end
local cpath = os.getenv("MOONGATE_LUA_CPATH") or "./build/lua/?.so"
if not package.cpath:find(cpath, 1, true) then
    package.cpath = cpath .. ";" .. package.cpath
end
local found, moongate = pcall(require, "moongate")
if not found then
    error("tests/lua/helper.lua: the moongate C module is not built (" .. cpath .. "): run\n" ..
          "  cmake --build build --target moongate_lua\n" .. tostring(moongate), 0)
end

local util = require("moongate.util")
local json = require("moongate.json")

local h = { util = util, json = json, moongate = moongate }

local function read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("a")
    f:close()
    return s
end

-- h.fixture(path): the decoded JSON file, path relative to tests/fixtures/.
function h.fixture(path)
    return json.decode(read("tests/fixtures/" .. path))
end

-- h.ndjson(path): an array of the decoded non-empty lines of an NDJSON fixture.
function h.ndjson(path)
    local lines = {}
    for line in read("tests/fixtures/" .. path):gmatch("[^\n]+") do
        lines[#lines + 1] = json.decode(line)
    end
    return lines
end

-- h.sse(path): an array of the decoded data of each event of an SSE fixture (event: lines
-- ignored: the core hands adapters the data alone).
function h.sse(path)
    local events = {}
    for block in (read("tests/fixtures/" .. path) .. "\n\n"):gmatch("(.-)\n\n") do
        local data = {}
        for line in block:gmatch("[^\n]+") do
            local d = line:match("^data: ?(.*)$")
            if d then data[#data + 1] = d end
        end
        if #data > 0 then events[#events + 1] = json.decode(table.concat(data, "\n")) end
    end
    return events
end

-- h.req(endpoint, ...): a core request table for an adapter's encode (request id, logical
-- model, not streamed), with the fields of each further table put over it in order.
function h.req(endpoint, ...)
    local r = { request_id = "req-1", endpoint = endpoint, model = "general-chat",
                stream = false, created = 1700000000 }
    for _, extra in ipairs({ ... }) do
        for k, v in pairs(extra) do
            r[k] = v
        end
    end
    return r
end

-- h.adapter(name): a fresh copy of adapters/<name>.lua, loaded as the core loads it.
function h.adapter(name)
    return dofile("adapters/" .. name .. ".lua")
end

-- h.roundtrip(v): v through JSON text and back, to check how the core would serialize it.
function h.roundtrip(v)
    return json.decode(json.encode(v))
end

return h
