-- wrk script for bench/run: POST an OpenAI-style chat completion (~300 B body).
-- env: MODEL=name   -> the "model" field (default gpt-4o-mini); moongate routes the SSE variant
--                      through a second logical model, so bench/run sets it per variant
--      STREAM=1     -> add "stream":true (+ include_usage)
--      API_KEY=key  -> the bearer token (default sk-mock-0000000000000000, which nothing checks);
--                      bench/run sets it to a seeded customer key for the auth variant
--      SESSIONS_FILE=path -> session ids, one a line (bench/sessions.mjs): each request carries
--                      "session_id" (the body is otherwise the same); thread k of SESSION_THREADS
--                      takes every SESSION_THREADS-th id from the k-th and goes round them, so
--                      two threads never share a session, and a session is asked again only
--                      after the thread's others (one session per connection at a time, unless
--                      a request lags a whole round behind: it then waits its turn, as the
--                      gateway serialises a session)
--      THINK_MS=N   -> paced test: after each response a connection pauses a random,
--                      exponentially distributed time with mean N ms (de-synchronises the
--                      connections, so arrivals are ~Poisson at ~conns*1000/(N+latency) req/s)
-- At the end it prints one line "WRKJSON {...}" (latencies in microseconds) for bench/run.
local stream = os.getenv("STREAM") == "1"
local think  = tonumber(os.getenv("THINK_MS") or "0")
local model  = os.getenv("MODEL") or "gpt-4o-mini"
local apikey = os.getenv("API_KEY") or ""
if apikey == "" then apikey = "sk-mock-0000000000000000" end

local body = '{"model":"' .. model .. '","messages":[{"role":"system","content":"You are a concise assistant."},'
          .. '{"role":"user","content":"In one short sentence, explain why an HTTP reverse proxy should keep upstream connections alive and pooled."}],'
          .. '"max_tokens":64,"temperature":0.2,"user":"bench-client-0001"'
if stream then body = body .. ',"stream":true,"stream_options":{"include_usage":true}' end
body = body .. '}'

wrk.method = "POST"
wrk.path   = "/v1/chat/completions"
wrk.body   = body
-- identical headers for every variant (only the auth variant's token differs)
wrk.headers["Content-Type"]  = "application/json"
wrk.headers["Authorization"] = "Bearer " .. apikey

local nthreads = 0
function setup(thread) nthreads = nthreads + 1; thread:set("tid", nthreads) end

local sessions_file = os.getenv("SESSIONS_FILE") or ""
local bodies, next_body = nil, 0
function init(args)
  math.randomseed(os.time() * 1000 + (tid or 0) * 7919)
  if sessions_file == "" then return end
  local stride = tonumber(os.getenv("SESSION_THREADS") or "1")
  local f = assert(io.open(sessions_file, "r"))
  bodies = {}
  local i = 0
  for id in f:lines() do
    if id ~= "" then
      if i % stride == (tid or 1) - 1 then
        bodies[#bodies + 1] = '{"session_id":"' .. id .. '",' .. body:sub(2)
      end
      i = i + 1
    end
  end
  f:close()
  assert(#bodies > 0, "no session ids for thread " .. tostring(tid))
end

if sessions_file ~= "" then
  function request()
    next_body = next_body % #bodies + 1
    return wrk.format(nil, nil, nil, bodies[next_body])
  end
end

if think > 0 then
  function delay() return math.floor(-think * math.log(1 - math.random())) end
end

-- The paced runs also print the latency histogram ("hist":[[us,count],...], wrk's own
-- buckets), so that the report can take percentiles over all the rounds of a phase.
local function histogram(latency)
  local parts = {}
  for i = 1, #latency do
    local v, c = latency(i)
    parts[#parts + 1] = string.format("[%d,%d]", v, c)
  end
  return table.concat(parts, ",")
end

function done(summary, latency, requests)
  local e = summary.errors
  local hist = think > 0 and (',"hist":[' .. histogram(latency) .. ']') or ""
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,'
    .. '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d,'
    .. '"lat_mean_us":%.1f,"lat_min_us":%d,"lat_p50_us":%d,"lat_p90_us":%d,"lat_p99_us":%d,'
    .. '"lat_p999_us":%d,"lat_max_us":%d%s}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.min, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max, hist))
end
