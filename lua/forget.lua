-- zcluster retention: forget every record at or below a score and raise the floor to it.
--
-- KEYS, per logical key: K+, K-, floor. ARGV[1] = the score (an exact decimal).
-- Afterwards writes at or below the score are stale for these keys (the write script checks the floor),
-- so nothing forgotten can be resurrected by a late replay. Returns the number of entries removed.
local s = ARGV[1]
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
