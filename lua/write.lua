-- zcluster 2P-set write: many tuples per call, one logical set per tuple.
--
-- KEYS, per tuple (stride 2, or 3 with floors): the add set K+, the remove set K-[, the floor].
-- ARGV[1] = "+" (insert) or "-" (delete); ARGV[2] = size bound N (0 = unbounded); ARGV[3] = "1" when
-- floor keys are passed (always with a bound); then per tuple: score (a decimal the client printed
-- exactly), member.
-- Returns a string with one character per tuple: "1" took effect, "0" stale.
--
-- Scores are passed to ZADD as the client's own text: Lua prints numbers with 14 digits, which would
-- round them. Comparisons use tonumber() of exact texts, so they are exact for every double.
-- Loops over ARGV by index: unpack() of thousands of values overflows Lua's stack.
local insert = ARGV[1] == "+"
local bound = tonumber(ARGV[2])
local floors = ARGV[3] == "1"
local stride = 2
if floors then stride = 3 end
local out = {}
local n = (#ARGV - 3) / 2

-- Redis answers a missing score or string as false.
local function num(reply)
  if reply then return tonumber(reply) end
  return nil
end

-- Remove the lowest entries of `set` beyond the bound; raise the floor to the highest score removed.
local function trim(set, floorkey, floor)
  local card = redis.call("ZCARD", set)
  if card <= bound then return floor end
  local cut = redis.call("ZRANGE", set, card - bound - 1, card - bound - 1, "WITHSCORES")
  redis.call("ZREMRANGEBYRANK", set, 0, card - bound - 1)
  local top = tonumber(cut[2])
  if floor == nil or top > floor then
    redis.call("SET", floorkey, cut[2])
    return top
  end
  return floor
end

for i = 1, n do
  local stext = ARGV[2 * i + 2]
  local s = tonumber(stext)
  local m = ARGV[2 * i + 3]
  local base = (i - 1) * stride
  local adds = KEYS[base + 1]
  local rems = KEYS[base + 2]
  local floorkey, floor = nil, nil
  if floors then
    floorkey = KEYS[base + 3]
    floor = num(redis.call("GET", floorkey))
  end
  local del = num(redis.call("ZSCORE", rems, m))
  local ok = "0"
  if insert then
    -- An insert needs a strictly newer score than any record of the member (a delete wins ties) and than
    -- the floor (a tombstone or entry trimmed at or above s may have been forgotten).
    if not ((del and s <= del) or (floor and s <= floor)) then
      if bound == 0 then
        -- GT CH: added or raised (the score was absent or lower) answers 1; equal or newer answers 0.
        if redis.call("ZADD", adds, "GT", "CH", stext, m) == 1 then
          if del then redis.call("ZREM", rems, m) end
          ok = "1"
        end
      else
        local ins = num(redis.call("ZSCORE", adds, m))
        local full = false
        if not ins and redis.call("ZCARD", adds) >= bound then
          local low = redis.call("ZRANGE", adds, 0, 0, "WITHSCORES")
          full = s < tonumber(low[2])
          -- As if added and trimmed at once: the floor remembers it, so a replay stays stale.
          if full and (floor == nil or s > floor) then redis.call("SET", floorkey, stext) end
        end
        if not (ins and s <= ins) and not full then
          if del then redis.call("ZREM", rems, m) end
          redis.call("ZADD", adds, stext, m)
          trim(adds, floorkey, floor)
          ok = "1"
        end
      end
    end
  else
    -- A delete wins a tie with the insert, so only a strictly newer insert or an equal-or-newer delete
    -- makes it stale.
    local ins = num(redis.call("ZSCORE", adds, m))
    if not ((ins and s < ins) or (del and s <= del)) then
      if ins then
        redis.call("ZREM", adds, m)
        ok = "1"
      end
      -- At or below the floor a tombstone is redundant: the floor already rejects older inserts.
      if not (floor and s <= floor) then
        redis.call("ZADD", rems, stext, m)
        if bound > 0 then trim(rems, floorkey, floor) end
        ok = "1"
      end
    end
  end
  out[i] = ok
end
return table.concat(out)
