-- zcluster retention: forget every record at or below a score and raise the floor to it.
--
-- KEYS, per logical key: K+, K-, floor. ARGV[1] = the score (an exact decimal).
-- Afterwards writes at or below the score are stale for these keys (the write script checks the floor),
-- so nothing forgotten can be resurrected by a late replay. Returns the number of entries removed.
--
-- Only 2P-set keys are forgotten: an aggregate key (lua/incr.lua: its K- is a hash of fences; a counters
-- key's K+ is a hash too) holds totals, not scored records, and removing "low" totals would wipe them while
-- the fences stay (a resend would apply nothing). Every key of the call is checked before anything is
-- changed: if one is an aggregate, the call changes nothing and returns {index of that key (0-based),
-- its kind: "s" sums, "c" counters, "a" fences whose totals expired}.
local s = ARGV[1]
for i = 1, #KEYS, 3 do
  local t = redis.call("TYPE", KEYS[i + 1])["ok"]
  if t == "hash" or redis.call("TYPE", KEYS[i])["ok"] == "hash" then
    local kind = "a"
    local tp = redis.call("TYPE", KEYS[i])["ok"]
    if tp == "hash" then kind = "c" elseif tp == "zset" then kind = "s" end
    return {(i - 1) / 3, kind}
  end
end
local removed = 0
for i = 1, #KEYS, 3 do
  removed = removed + redis.call("ZREMRANGEBYSCORE", KEYS[i], "-inf", s)
  removed = removed + redis.call("ZREMRANGEBYSCORE", KEYS[i + 1], "-inf", s)
  local floor = redis.call("GET", KEYS[i + 2])
  if not floor or tonumber(floor) < tonumber(s) then
    redis.call("SET", KEYS[i + 2], s)
  end
end
return removed
