-- zcluster aggregate keys as a whole: read one key's state, or replace it with another replica's (the
-- farm's repair of increments). One logical key per call: KEYS[1] = K+ (the totals), KEYS[2] = K- (see
-- incr.lua: a sums key's fences; a counters key keeps them in K+, fields FENCE .. source, or, made before
-- that layout, in K-). Whatever the layout, a key's state reads the same (the fences by source, the totals
-- without them), so replicas of either layout compare equal when they hold the same increments.
--
-- ARGV[1] = "state": returns {kind, fences}; "dump": {kind, fences, totals, pttl}. kind: "" (the key holds
-- nothing), "2" (a 2P-set), "s" (sums), "c" (counters), "a" (fences without totals: an aggregate whose
-- totals expired first). fences: the canonical text of the fences (sources sorted, each
-- "<length>:<source>=<c:m:j:n>\n"), so that two replicas' fences compare as strings and a restore can
-- check that nothing moved since they were read. totals: member, total pairs (ZRANGE WITHSCORES order for
-- sums, any order for counters). pttl: milliseconds to live, -1 for none. A one-key counters key's state
-- reads its whole hash (its fences are among its totals): O(fields), where a two-key key's is O(sources).
--
-- ARGV[1] = "restore", ARGV[2] = the canonical fences this replica was read with, ARGV[3] = kind ("s" or
-- "c"), ARGV[4] = pttl, ARGV[5] = the number of fence pairs n, then n source, fence pairs, then member,
-- total pairs. Replaces the key with that state only if it still holds the fences it was read with and
-- is not a 2P-set: returns 1, else 0 (it moved since: read again). Counters are restored as one key (the
-- fences in K+), whatever the layout they were dumped from.
local adds, fences = KEYS[1], KEYS[2]
local FENCE = "\0zc|"

-- The key's kind and whether its fences are in K+ (a one-key counters key).
local function kind_of()
  local t = redis.call("TYPE", fences)["ok"]
  local tp = redis.call("TYPE", adds)["ok"]
  if t == "hash" then
    if tp == "zset" then return "s", false end
    if tp == "hash" then return "c", false end
    return "a", false
  end
  if t == "none" and tp == "hash" then return "c", true end
  if t == "none" and tp == "none" then return "" end
  return "2"
end

-- The canonical text of the fences, and (with `dump`) the totals of a one-key counters key.
local function canonical(kind, inside, dump)
  if kind == "" or kind == "2" then return "", {} end
  local flat = redis.call("HGETALL", inside and adds or fences)
  local pairs_, totals = {}, {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    if not inside then
      pairs_[#pairs_ + 1] = #f .. ":" .. f .. "=" .. flat[i + 1] .. "\n"
    elseif string.sub(f, 1, #FENCE) == FENCE then
      f = string.sub(f, #FENCE + 1)
      pairs_[#pairs_ + 1] = #f .. ":" .. f .. "=" .. flat[i + 1] .. "\n"
    elseif dump then
      totals[#totals + 1] = f
      totals[#totals + 1] = flat[i + 1]
    end
  end
  table.sort(pairs_)
  return table.concat(pairs_), totals
end

local mode = ARGV[1]
local kind, inside = kind_of()
if mode == "state" then
  return {kind, (canonical(kind, inside, false))}
elseif mode == "dump" then
  local canon, totals = canonical(kind, inside, true)
  if kind == "s" then
    totals = redis.call("ZRANGE", adds, 0, -1, "WITHSCORES")
  elseif kind == "c" and not inside then
    totals = redis.call("HGETALL", adds)
  end
  return {kind, canon, totals, redis.call("PTTL", inside and adds or fences)}
elseif mode == "restore" then
  if kind == "2" or canonical(kind, inside, false) ~= ARGV[2] then return 0 end
  local new_kind, pttl, n = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  redis.call("DEL", adds, fences)
  -- In chunks: a Lua call takes a bounded number of arguments.
  local CHUNK = 500
  local first, last = 6, 5 + 2 * n
  local one = new_kind == "c" -- counters: one key, the fences in K+
  for lo = first, last, 2 * CHUNK do
    local args = {}
    for i = lo, math.min(last, lo + 2 * CHUNK - 1), 2 do
      args[#args + 1] = one and FENCE .. ARGV[i] or ARGV[i]
      args[#args + 1] = ARGV[i + 1]
    end
    redis.call("HSET", one and adds or fences, unpack(args))
  end
  for lo = last + 1, #ARGV, 2 * CHUNK do
    local args = {}
    for i = lo, math.min(#ARGV, lo + 2 * CHUNK - 1), 2 do
      if new_kind == "s" then
        args[#args + 1] = ARGV[i + 1]
        args[#args + 1] = ARGV[i]
      else
        args[#args + 1] = ARGV[i]
        args[#args + 1] = ARGV[i + 1]
      end
    end
    if new_kind == "s" then redis.call("ZADD", adds, unpack(args)) else redis.call("HSET", adds, unpack(args)) end
  end
  if pttl > 0 then
    if not one then redis.call("PEXPIRE", fences, pttl) end
    if redis.call("EXISTS", adds) == 1 then redis.call("PEXPIRE", adds, pttl) end
  end
  return 1
end
return redis.error_reply("ERR zcluster aggregate.lua: unknown mode " .. tostring(mode))
