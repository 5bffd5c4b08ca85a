-- policies/context.lua: how a conversation that does not fit the model's window is made to
-- fit (edge PRD 3.3.4).
--
-- The core calls trim(ctx, budget) when the assembled messages of a chat request count more
-- tokens than its budget (the model's context_window x (1 - context.safety_margin_ratio)
-- minus the output reserve: the request's max_tokens, else the model's max_output_tokens).
-- It is not called for context_policy "none": that request fails with 400 CONTEXT_TOO_LARGE.
--
-- It receives:
--   ctx.messages       the assembled list: the leading system messages (platform rules, the
--                      application's or session's system prompt, the session summary), the
--                      history, then the current request
--   ctx.tokens[i]      the tokens of ctx.messages[i], by the chat rule the budget uses
--   ctx.n_leading      how many leading system messages there are (protected)
--   ctx.first_current  the index of the current request's first message: it and everything
--                      after it are protected (the question being asked is never cut),
--                      except the request's retrieval snippets
--   a snippet          a system message with a `moongate_snippet` field { rank, score?,
--                      source?, id? }: the request's `retrieval` list, one message per snippet, placed
--                      at first_current before the request's own messages (the core joins the
--                      ones kept into one system message after trim)
--   ctx.policy         "summary_and_recent" (the default) or "recent_only"
--   ctx.overhead       tokens the list costs beyond its messages (the reply's priming)
--   ctx.count(msg)     the tokens of a message (after a step rewrote it)
--   budget             the most the list may count, overhead included
--
-- It returns the new message list and a report { steps = {"name", ...} } naming the steps
-- that changed something, or nil and a reason when it cannot fit (the client gets 400
-- CONTEXT_TOO_LARGE with the counts). The core re-counts what it returns and refuses a list
-- still over budget, so a policy can never make the engine truncate.
--
-- The steps, in order, each re-counting (PRD 3.3.4):
--   0. drop_snippets: a snippet that repeats an earlier one (the same id, or the same text
--      up to white space) goes, then those scored below RETRIEVAL_MIN_SCORE, lowest first.
--   1. compress_tool_results (summary_and_recent): every tool result in the history longer
--      than TOOL_RESULT_MAX_TOKENS keeps its first TOOL_RESULT_KEEP_CHARS characters (all at
--      once, so the next turn compresses the same ones: the prefix stays). No notice text is
--      added: the model sees a shorter result, never a gateway's remark.
--   2. drop_oldest_turns: whole turns go, oldest first. A turn is a user message and every
--      assistant and tool message after it up to the next user message, so a tool call and
--      its result leave together, and an assistant message with reasoning is never cut.
--      The cut is made only at stable cut points: turn starts at least (1 - LOW_WATER) x
--      budget tokens apart, counted from the history's beginning, the first after which the
--      list fits. They do not move when a turn is added, so consecutive requests of a
--      growing conversation send a byte-identical prefix, and the cut moves (a cache miss)
--      only when the list has outgrown it: about once per quarter budget of new turns.
--   3. shrink_retrieval: the remaining snippets go, lowest score first (the last given
--      first among equals), until the list fits.
--   The earlier summary stays (it is a leading system message); summaries of the dropped
--   turns are made by the core's summariser when configured, not here.
--
-- To change it, edit this file and send SIGHUP; selftest() must pass for the reload to be
-- taken. For example: keep more of each tool result (TOOL_RESULT_KEEP_CHARS = 4000); never
-- compress (remove step 1 from STEPS.summary_and_recent). Keep it a pure function of its
-- arguments: no I/O, no clock, no global state.

local M = { name = "context", version = 1 }

local TOOL_RESULT_MAX_TOKENS = 512 -- a longer tool result in the history is compressed
local TOOL_RESULT_KEEP_CHARS = 1200 -- what a compressed tool result keeps
local RETRIEVAL_MIN_SCORE = 0.5 -- a snippet scored below this is low relevance (drop_snippets)
-- The low-water mark of drop_oldest_turns: its cut points are (1 - LOW_WATER) x budget
-- tokens apart, so a trim leaves the list near LOW_WATER x budget (plus the newest turn) and
-- the following turns go upstream with the same prefix (the engine's prompt cache holds)
-- until that room is used up: the prefix moves about once every (1 - LOW_WATER) x budget
-- tokens of conversation, not every turn. 1 cuts at every turn (drop just enough, the
-- prefix moving on every turn over the budget); lower trims more at a time, more rarely.
local LOW_WATER = 0.75

-- total(tokens, overhead): the list's count.
local function total(tokens, overhead)
    local n = overhead
    for i = 1, #tokens do
        n = n + tokens[i]
    end
    return n
end

-- copy(list): a shallow copy of an array.
local function copy(list)
    local out = {}
    for i = 1, #list do
        out[i] = list[i]
    end
    return out
end

-- compress_tool_results: shorter tool results in the history, every long one at once (not
-- just enough to fit): a message's compressed form depends only on itself, so the next turn,
-- over budget too, compresses the same ones the same way and sends the same prefix. Returns
-- true when it changed one.
local function compress_tool_results(st, budget)
    local changed = false
    for i = st.n_leading + 1, st.first_current - 1 do
        local m = st.messages[i]
        if m.role == "tool" and type(m.content) == "string" and st.tokens[i] > TOOL_RESULT_MAX_TOKENS then
            local short = {}
            for k, v in pairs(m) do
                short[k] = v
            end
            short.content = m.content:sub(1, TOOL_RESULT_KEEP_CHARS)
            st.messages[i] = short
            st.tokens[i] = st.count(short)
            changed = true
        end
    end
    return changed
end

-- turn_end(st, i): the last index of the turn that starts at i (a turn ends before the next
-- user message, or before the current request).
local function turn_end(st, i)
    local j = i
    while j + 1 < st.first_current and st.messages[j + 1].role ~= "user" do
        j = j + 1
    end
    return j
end

-- cut_points(st, budget): the indices a trim may cut the history at (the first kept
-- message), oldest first, each a turn start at least `stride` tokens past the one before,
-- counted from the history's start; the last is first_current (every turn dropped). They
-- depend only on the history's own beginning, so the next turn (the same history plus one
-- turn) has the same cut points, and the cut chosen from them stays where it was until the
-- list outgrows it (see LOW_WATER).
local function cut_points(st, budget)
    local stride = math.max(1, budget - math.floor(budget * LOW_WATER))
    local points, cum, last_cut = {}, 0, 0
    local i = st.n_leading + 1
    while i < st.first_current do
        if cum - last_cut >= stride then
            points[#points + 1] = { index = i, dropped = cum }
            last_cut = cum
        end
        local j = turn_end(st, i)
        for k = i, j do
            cum = cum + st.tokens[k]
        end
        i = j + 1
    end
    points[#points + 1] = { index = st.first_current, dropped = cum }
    return points
end

-- drop_oldest_turns: whole turns out, oldest first, at the first cut point after which the
-- list fits. Returns true when it dropped some.
local function drop_oldest_turns(st, budget)
    local n = total(st.tokens, st.overhead)
    if n <= budget or st.first_current <= st.n_leading + 1 then
        return false
    end
    local cut = nil
    for _, p in ipairs(cut_points(st, budget)) do
        cut = p
        if n - p.dropped <= budget then
            break
        end
    end
    local first, count = st.n_leading + 1, cut.index - st.n_leading - 1
    for _ = 1, count do
        table.remove(st.messages, first)
        table.remove(st.tokens, first)
    end
    st.first_current = st.first_current - count
    return count > 0
end

-- snippets(st): the indices of the retrieval snippets, in list order.
local function snippets(st)
    local out = {}
    for i = st.first_current, #st.messages do
        if st.messages[i].moongate_snippet then
            out[#out + 1] = i
        end
    end
    return out
end

local function remove(st, i)
    table.remove(st.messages, i)
    table.remove(st.tokens, i)
end

-- drop_in_order(st, order, budget): removes the snippets at the indices `order` names, in
-- that order; with a budget, only while the list is over it. Returns true when it removed one.
local function drop_in_order(st, order, budget)
    local gone = {}
    for _, i in ipairs(order) do
        if budget and total(st.tokens, st.overhead) <= budget then
            break
        end
        gone[#gone + 1] = i
        st.tokens[i] = 0 -- counted out now, removed below (indices stay valid meanwhile)
    end
    table.sort(gone, function(a, b) return a > b end)
    for _, i in ipairs(gone) do
        remove(st, i)
    end
    return #gone > 0
end

-- by_relevance(st, list): list sorted lowest score first, the later given first among equals
-- (a snippet without a score counts as fully relevant).
local function by_relevance(st, list)
    local function score(i)
        return st.messages[i].moongate_snippet.score or 1
    end
    table.sort(list, function(a, b)
        if score(a) ~= score(b) then
            return score(a) < score(b)
        end
        return a > b
    end)
    return list
end

-- drop_snippets: repeats, then low-relevance snippets. Returns true when it dropped one.
local function drop_snippets(st, budget)
    local seen, repeats, low = {}, {}, {}
    for _, i in ipairs(snippets(st)) do
        local m = st.messages[i]
        local text = type(m.content) == "string" and m.content:gsub("%s+", " "):match("^ ?(.-) ?$") or ""
        local key = m.moongate_snippet.id and ("id:" .. m.moongate_snippet.id) or ("text:" .. text)
        if seen[key] or seen["text:" .. text] then
            repeats[#repeats + 1] = i
        else
            seen[key], seen["text:" .. text] = true, true
            if (m.moongate_snippet.score or 1) < RETRIEVAL_MIN_SCORE then
                low[#low + 1] = i
            end
        end
    end
    local dropped = drop_in_order(st, repeats, nil)
    -- the repeats' removal moved the later indices: find the low ones again
    if dropped then
        low = {}
        for _, i in ipairs(snippets(st)) do
            if (st.messages[i].moongate_snippet.score or 1) < RETRIEVAL_MIN_SCORE then
                low[#low + 1] = i
            end
        end
    end
    return drop_in_order(st, by_relevance(st, low), budget) or dropped
end

-- shrink_retrieval: snippets out, lowest score first, until the list fits.
local function shrink_retrieval(st, budget)
    return drop_in_order(st, by_relevance(st, snippets(st)), budget)
end

local STEPS = {
    summary_and_recent = {
        { "drop_snippets", drop_snippets },
        { "compress_tool_results", compress_tool_results },
        { "drop_oldest_turns", drop_oldest_turns },
        { "shrink_retrieval", shrink_retrieval },
    },
    recent_only = {
        { "drop_snippets", drop_snippets },
        { "drop_oldest_turns", drop_oldest_turns },
        { "shrink_retrieval", shrink_retrieval },
    },
}

function M.trim(ctx, budget)
    local steps = STEPS[ctx.policy] or STEPS.summary_and_recent
    local st = {
        messages = copy(ctx.messages),
        tokens = copy(ctx.tokens),
        n_leading = ctx.n_leading or 0,
        first_current = ctx.first_current,
        overhead = ctx.overhead or 3,
        count = ctx.count,
    }
    local report = { steps = {} }
    for _, step in ipairs(steps) do
        if total(st.tokens, st.overhead) <= budget then
            break
        end
        if step[2](st, budget) then
            report.steps[#report.steps + 1] = step[1]
        end
    end
    local n = total(st.tokens, st.overhead)
    if n > budget then
        return nil, string.format("the protected messages alone count %d tokens, over the budget of %d", n, budget)
    end
    return st.messages, report
end

function M.selftest()
    local function count(m)
        return 3 + #(m.content or "")
    end
    local msgs = {
        { role = "system", content = "s" },
        { role = "user", content = "aaaa" },
        { role = "assistant", tool_calls = { { id = "1" } } },
        { role = "tool", tool_call_id = "1", content = "bbbb" },
        { role = "user", content = "cc" },
    }
    local tokens = {}
    for i, m in ipairs(msgs) do
        tokens[i] = count(m)
    end
    local out, rep = M.trim({ messages = msgs, tokens = tokens, n_leading = 1, first_current = 5,
                              policy = "recent_only", overhead = 3, count = count }, 15)
    assert(out and #out == 2 and out[2].content == "cc", "the oldest turn goes whole")
    assert(rep.steps[1] == "drop_oldest_turns")
    assert(M.trim({ messages = msgs, tokens = tokens, n_leading = 1, first_current = 5,
                    policy = "recent_only", overhead = 3, count = count }, 5) == nil,
           "protected messages over the budget cannot fit")
end

return M
