dofile("tests/lua/helper.lua")

-- policies/context.lua as a pure function: each step, the protected parts, tool pairs and
-- reasoning turns kept whole, the variants, the budget arithmetic. count() here is a stand-in
-- (3 + the content's length); the core passes the chat rule of token/chat.h.
describe("policies/context.lua", function()
    local context

    local function count(m)
        return 3 + (type(m.content) == "string" and #m.content or 0)
    end

    local function ctx(msgs, n_leading, first_current, policy)
        local tokens = {}
        for i, m in ipairs(msgs) do
            tokens[i] = count(m)
        end
        return { messages = msgs, tokens = tokens, n_leading = n_leading, first_current = first_current,
                 policy = policy or "summary_and_recent", overhead = 3, count = count }
    end

    local function total(msgs)
        local n = 3
        for _, m in ipairs(msgs) do
            n = n + count(m)
        end
        return n
    end

    -- the messages' values of one field, joined
    local function pluck(msgs, key, sep)
        local out = {}
        for i, m in ipairs(msgs) do
            out[i] = m[key]
        end
        return table.concat(out, sep)
    end

    local function roles(msgs)
        return pluck(msgs, "role", ",")
    end

    before_each(function()
        context = dofile("policies/context.lua")
    end)

    it("is a module with name, version, trim and a passing selftest", function()
        assert.equal("context", context.name)
        assert.equal(1, context.version)
        assert.is_function(context.trim)
        assert.has_no.errors(context.selftest)
    end)

    local convo = {
        { role = "system", content = "rules" },                 -- 1 leading
        { role = "user", content = "q1-aaaaaaaaaa" },           -- 2 turn 1
        { role = "assistant", content = "a1-aaaaaaaaaa" },      -- 3
        { role = "user", content = "q2-bbbbbbbbbb" },           -- 4 turn 2
        { role = "assistant", content = "a2-bbbbbbbbbb" },      -- 5
        { role = "user", content = "now" },                     -- 6 current
    }

    it("a list within the budget is given back unchanged, no step reported", function()
        local out, rep = context.trim(ctx(convo, 1, 6), total(convo))
        assert.same(convo, out)
        assert.same({}, rep.steps)
    end)

    it("drops the oldest whole turns until it fits, exactly at the budget", function()
        local budget = total(convo) - 1 -- one over: turn 1 goes
        local out, rep = context.trim(ctx(convo, 1, 6, "recent_only"), budget)
        assert.equal("system,user,assistant,user", roles(out))
        assert.equal("q2-bbbbbbbbbb", out[2].content)
        assert.same({ "drop_oldest_turns" }, rep.steps)
        assert.is_true(total(out) <= budget)
        -- a budget that fits without turn 2 as well: both go, the system and the question stay
        out = context.trim(ctx(convo, 1, 6, "recent_only"), total({ convo[1], convo[6] }))
        assert.equal("system,user", roles(out))
        assert.equal("now", out[2].content)
    end)

    it("never cuts the protected parts: nil and the counts when they alone are over", function()
        local out, reason = context.trim(ctx(convo, 1, 6), total({ convo[1], convo[6] }) - 1)
        assert.is_nil(out)
        assert.matches("over the budget", reason)
    end)

    it("a tool call and its result leave together, with the turn that asked for them", function()
        local msgs = {
            { role = "user", content = "weather?" },
            { role = "assistant", tool_calls = { { id = "c1", type = "function", ["function"] = { name = "w", arguments = "{}" } } } },
            { role = "tool", tool_call_id = "c1", content = "sunny and warm" },
            { role = "assistant", content = "It is sunny." },
            { role = "user", content = "and tomorrow?" },
        }
        local out = context.trim(ctx(msgs, 0, 5, "recent_only"), total({ msgs[5] }))
        assert.equal("user", roles(out))
        for _, m in ipairs(out) do
            assert.is_nil(m.tool_calls)
        end
    end)

    it("an assistant turn with reasoning is kept whole or dropped whole", function()
        local msgs = {
            { role = "user", content = "think" },
            { role = "assistant", content = "answer", reasoning_content = "long thoughts" },
            { role = "user", content = "again" },
        }
        local out = context.trim(ctx(msgs, 0, 3), total(msgs)) -- fits: untouched
        assert.equal("long thoughts", out[2].reasoning_content)
        out = context.trim(ctx(msgs, 0, 3), total(msgs) - 1)
        assert.equal("user", roles(out))
    end)

    it("summary_and_recent compresses a long tool result first, with no notice text", function()
        local long = string.rep("x", 3000)
        local msgs = {
            { role = "user", content = "fetch" },
            { role = "assistant", tool_calls = { { id = "c", type = "function", ["function"] = { name = "f", arguments = "{}" } } } },
            { role = "tool", tool_call_id = "c", content = long },
            { role = "user", content = "summarise it" },
        }
        local budget = total(msgs) - 1000
        local out, rep = context.trim(ctx(msgs, 0, 4), budget)
        assert.equal("user,assistant,tool,user", roles(out))
        assert.equal(string.rep("x", 1200), out[3].content) -- a prefix of the result, nothing added
        assert.same({ "compress_tool_results" }, rep.steps)
        assert.equal(long, msgs[3].content, "the input is not changed")
        -- recent_only does not compress: the turn goes whole
        out, rep = context.trim(ctx(msgs, 0, 4, "recent_only"), budget)
        assert.equal("user", roles(out))
        assert.same({ "drop_oldest_turns" }, rep.steps)
    end)

    it("the current request's tool results are protected too", function()
        local long = string.rep("y", 3000)
        local msgs = {
            { role = "assistant", tool_calls = { { id = "c", type = "function", ["function"] = { name = "f", arguments = "{}" } } } },
            { role = "tool", tool_call_id = "c", content = long },
        }
        local out = context.trim(ctx(msgs, 0, 1), 100)
        assert.is_nil(out)
    end)

    -- A session as the core sends it: the whole history each turn (trim is stateless), one
    -- user and one assistant message added per turn, over a budget that holds about ten turns.
    local function session_turns(n_turns, budget)
        local history, sent = { { role = "system", content = "rules" } }, {}
        for t = 1, n_turns do
            local msgs = {}
            for i, m in ipairs(history) do
                msgs[i] = m
            end
            local q = { role = "user", content = string.format("question %02d %s", t, string.rep("q", 20 + t % 7)) }
            msgs[#msgs + 1] = q
            local out, rep = context.trim(ctx(msgs, 1, #msgs, "recent_only"), budget)
            assert.is_table(out, "turn " .. t)
            assert.is_true(total(out) <= budget, "turn " .. t .. " within budget")
            sent[t] = { out = out, trimmed = #rep.steps > 0 }
            history[#history + 1] = q
            history[#history + 1] = { role = "assistant", content = string.format("answer %02d %s", t, string.rep("a", 30 + t % 5)) }
        end
        return sent
    end

    -- the turns whose list does not start with the whole list the turn before sent
    local function prefix_moves(sent)
        local moves = {}
        for t = 2, #sent do
            local prev, cur = sent[t - 1].out, sent[t].out
            local same = #cur > #prev
            for i = 1, #prev do
                same = same and cur[i] == prev[i]
            end
            if not same then
                moves[#moves + 1] = t
            end
        end
        return moves
    end

    it("the prefix sent stays the same between turns, moving only at a trim, every few turns", function()
        local budget = 3 + 8 + 10 * 2 * 45
        local sent = session_turns(30, budget)
        local moves = prefix_moves(sent)
        assert.is_true(#moves >= 2, "the conversation passed the budget more than once")
        for _, t in ipairs(moves) do
            assert.is_true(sent[t].trimmed, "turn " .. t .. ": the prefix moved without a trim")
        end
        for k = 2, #moves do
            assert.is_true(moves[k] - moves[k - 1] >= 3, "trims at turns " .. moves[k - 1] .. " and " .. moves[k])
        end
        assert.is_true(#moves <= 30 / 3)
        -- after a trim the list is near the low-water mark (3/4 of the budget), not at the budget
        local t = moves[1]
        assert.is_true(total(sent[t].out) <= budget * 0.75 + 2 * 45, "turn " .. t .. ": " .. total(sent[t].out))
    end)

    -- the same, with tool calls whose results are long every third turn, on summary_and_recent
    -- (which compresses them): the bytes sent are compared, as the engine's cache does
    local function text_of(m)
        return m.role .. "\0" .. tostring(m.content) .. "\0" .. tostring(m.tool_call_id)
    end

    local function tool_turns(n_turns, budget)
        local history, sent = { { role = "system", content = "rules" } }, {}
        for t = 1, n_turns do
            local msgs = {}
            for i, m in ipairs(history) do
                msgs[i] = m
            end
            local q = { role = "user", content = string.format("question %02d", t) }
            msgs[#msgs + 1] = q
            local out, rep = context.trim(ctx(msgs, 1, #msgs), budget)
            assert.is_table(out, "turn " .. t)
            sent[t] = { out = out, steps = table.concat(rep.steps, ",") }
            history[#history + 1] = q
            local id = "call" .. t
            history[#history + 1] = { role = "assistant", tool_calls = { { id = id, type = "function",
                ["function"] = { name = "f", arguments = "{}" } } } }
            local size = t % 3 == 0 and 2500 or 40
            history[#history + 1] = { role = "tool", tool_call_id = id, content = string.rep(tostring(t % 10), size) }
            history[#history + 1] = { role = "assistant", content = string.format("answer %02d", t) }
        end
        return sent
    end

    it("with long tool results too, the prefix moves only where turns are dropped, every few turns", function()
        local sent = tool_turns(40, 6000)
        local moves, compress_only = {}, 0
        for t = 2, #sent do
            local prev, cur = sent[t - 1].out, sent[t].out
            local same = #cur > #prev
            for i = 1, #prev do
                same = same and text_of(cur[i]) == text_of(prev[i])
            end
            if not same then
                moves[#moves + 1] = t
                assert.is_true(sent[t].steps ~= "", "turn " .. t .. ": the prefix moved without a trim")
                if sent[t].steps == "compress_tool_results" then
                    compress_only = compress_only + 1
                end
            end
        end
        assert.is_true(#moves >= 2, "the conversation passed the budget more than once: " .. #moves)
        for k = 2, #moves do
            assert.is_true(moves[k] - moves[k - 1] >= 3, "moves at turns " .. moves[k - 1] .. " and " .. moves[k])
        end
        -- the long results are compressed all at once, when the budget is first passed: later
        -- turns compress the same ones the same way, so compression alone moves it once
        assert.equal(1, compress_only)
    end)

    it("turns over the budget without a moved cut are sent whole after the cut (no trim every turn)", function()
        local sent = session_turns(30, 3 + 8 + 10 * 2 * 45)
        local over, trims = 0, 0
        for _, s in ipairs(sent) do
            if s.trimmed then
                over = over + 1
            end
        end
        trims = #prefix_moves(sent)
        assert.is_true(over > trims, "most turns over the budget keep the last cut")
    end)

    -- retrieval snippets: system messages marked moongate_snippet, at first_current
    local function snippet(text, score, id)
        return { role = "system", content = text, moongate_snippet = { rank = 1, score = score, id = id } }
    end

    local function contents(msgs)
        return pluck(msgs, "content", "|")
    end

    it("drop_snippets: repeats (same text up to white space, or same id) go first", function()
        local msgs = {
            { role = "system", content = "rules" },
            snippet("alpha  beta", 0.9), snippet(" alpha beta ", 0.8), snippet("gamma", 0.9, "d1"),
            snippet("delta", 0.7, "d1"),
            { role = "user", content = "question" },
        }
        local budget = total(msgs) - 1
        local out, rep = context.trim(ctx(msgs, 1, 2), budget)
        assert.equal("rules|alpha  beta|gamma|question", contents(out))
        assert.same({ "drop_snippets" }, rep.steps)
    end)

    it("drop_snippets: low-relevance snippets go lowest first, only while over budget", function()
        local msgs = {
            { role = "system", content = "rules" },
            { role = "user", content = "q1-aaaaaaaaaa" }, { role = "assistant", content = "a1-aaaaaaaaaa" },
            snippet("s-one-xxxxxx", 0.3), snippet("s-two-xxxxxx", 0.1), snippet("s-three-xxxx", 0.9),
            { role = "user", content = "now" },
        }
        -- one low snippet must go: the lowest (0.1)
        local out, rep = context.trim(ctx(msgs, 1, 4), total(msgs) - 5)
        assert.equal("rules|q1-aaaaaaaaaa|a1-aaaaaaaaaa|s-one-xxxxxx|s-three-xxxx|now", contents(out))
        assert.same({ "drop_snippets" }, rep.steps)
        -- relevant snippets are not dropped by this step: the history goes next
        out, rep = context.trim(ctx(msgs, 1, 4), total(msgs) - 40)
        assert.equal("rules|s-three-xxxx|now", contents(out))
        assert.same({ "drop_snippets", "drop_oldest_turns" }, rep.steps)
    end)

    it("shrink_retrieval: after the history, snippets go lowest score first; the request stays", function()
        local msgs = {
            { role = "system", content = "rules" },
            { role = "user", content = "q1-aaaaaaaaaa" }, { role = "assistant", content = "a1-aaaaaaaaaa" },
            snippet("keep-me-xxxx", 0.95), snippet("less-xxxxxxx", 0.6), snippet("noscore-xxxx"),
            { role = "user", content = "now" },
        }
        local budget = total(msgs) - 32 - 15 -- the turn (32) and one snippet (15)
        local out, rep = context.trim(ctx(msgs, 1, 4), budget)
        assert.equal("rules|keep-me-xxxx|noscore-xxxx|now", contents(out))
        assert.same({ "drop_oldest_turns", "shrink_retrieval" }, rep.steps)
        for _, variant in ipairs({ "recent_only", "summary_and_recent" }) do
            out = context.trim(ctx(msgs, 1, 4, variant), 3 + 8 + 6)
            assert.equal("rules|now", contents(out), variant)
        end
    end)

    it("a list with snippets within the budget is given back unchanged", function()
        local msgs = { snippet("x", 0.1), snippet("x", 0.1), { role = "user", content = "q" } }
        local out, rep = context.trim(ctx(msgs, 0, 1), total(msgs))
        assert.same(msgs, out)
        assert.same({}, rep.steps)
    end)
end)
