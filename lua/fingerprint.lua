#!lua flags=no-writes
-- zcluster fingerprints: what a logical key holds, in a few bytes, so that replicas can be compared
-- without moving their records (the farm's walker and diff).
--
-- KEYS, per logical key: K+, K- and, when ARGV[2] is "3", the floor. ARGV[1] = "fingerprint",
-- "serialized" or "exists".
-- "exists" returns one string per key: "1" when it holds a record, "+" when that includes members
-- (K+), "" when it holds nothing (cheap: the walker's check against replicas already swept).
-- "fingerprint" returns one string per key: "" when it holds no record and no floor, else
-- "<K+>|<K->|<floor>" (the floor's text, "" when none), each set
-- described by its records as "<member length>:<member> <score>\n" in ZRANGE order (score, then
-- member) with the score as the server prints it: "<n>=<records>" when short, "<n>#<SHA-1>" for a set
-- of one page, "*<SHA-1 of the pages' SHA-1s>" for a larger one (read page by page, so no set is copied
-- whole into the script's memory). Equal fingerprints mean equal records on servers that print scores
-- alike. An aggregate key (sums or counters, see incr.lua) is "a<totals>|<fences>" instead, each hash
-- described by its sorted "<field length>:<field> <value>\n" lines; a one-key counters key's fences (fields
-- FENCE .. source of K+) are described by source, as a two-key key's K- is, so both layouts of the same
-- increments fingerprint alike. "serialized" returns
-- "<SHA-1 of both sets' DUMP>|<floor>" (or ""): cheaper, equal means equal records, but equal records may
-- differ there (another encoding or server version).
local PAGE = 1000
local SHORT = 64

-- The records of one set, or nil when it is empty: one ZRANGE for a set of at most a page.
local function digest(key)
  local hashes = {}
  local start = 0
  while true do
    local page = redis.call("ZRANGE", key, start, start + PAGE - 1, "WITHSCORES")
    if #page == 0 then break end
    local buf = {}
    for i = 1, #page, 2 do
      buf[#buf + 1] = #page[i] .. ":" .. page[i] .. " " .. page[i + 1] .. "\n"
    end
    local text = table.concat(buf)
    if start == 0 and #page < 2 * PAGE then
      if #text <= SHORT then return #page / 2 .. "=" .. text end
      return #page / 2 .. "#" .. redis.sha1hex(text)
    end
    hashes[#hashes + 1] = redis.sha1hex(text)
    start = start + PAGE
  end
  if #hashes == 0 then return nil end
  return "*" .. redis.sha1hex(table.concat(hashes))
end

-- Sorted lines of fields and values, described: nil when there are none.
local function described(buf)
  if #buf == 0 then return nil end
  table.sort(buf)
  local text = table.concat(buf)
  if #text <= SHORT then return #buf .. "=" .. text end
  return #buf .. "#" .. redis.sha1hex(text)
end

-- A hash's fields and values (an aggregate key's fences, or its counters), sorted: nil when it is empty.
-- With `split` (a one-key counters key): its counters, and its fences apart, by source.
local FENCE = "\0zc|"
local function hdigest(key, split)
  local flat = redis.call("HGETALL", key)
  local buf, fences = {}, {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    if split and string.sub(f, 1, #FENCE) == FENCE then
      f = string.sub(f, #FENCE + 1)
      fences[#fences + 1] = #f .. ":" .. f .. " " .. flat[i + 1] .. "\n"
    else
      buf[#buf + 1] = #f .. ":" .. f .. " " .. flat[i + 1] .. "\n"
    end
  end
  return described(buf), described(fences)
end

local out = {}
local stride = tonumber(ARGV[2])

-- The floor's text, canonical (floors are stored as written: the client's text, or the server's print
-- of a trimmed score), so that equal floors compare equal; "" when none.
local function floor_of(i)
  if stride ~= 3 then return "" end
  local floor = redis.call("GET", KEYS[i + 2])
  if not floor then return "" end
  return string.format("%.17g", tonumber(floor))
end

if ARGV[1] == "exists" then
  for i = 1, #KEYS, stride do
    if redis.call("EXISTS", KEYS[i]) == 1 then
      out[#out + 1] = "+"
    elseif redis.call("EXISTS", KEYS[i + 1]) == 1 then
      out[#out + 1] = "1"
    else
      out[#out + 1] = ""
    end
  end
  return out
end
-- What the two sets hold, as the mode describes it; nil when both are empty.
local serialized = ARGV[1] == "serialized"
local function sets(i)
  if serialized then
    -- Cheap: a SHA-1 of the sets' serialized values (DUMP). Equal means equal records; different may
    -- still be equal records in another encoding or server version: compare "fingerprint"s then.
    local adds, removes = redis.call("DUMP", KEYS[i]), redis.call("DUMP", KEYS[i + 1])
    if not adds and not removes then return nil end
    adds, removes = adds or "", removes or ""
    return redis.sha1hex(#adds .. ":" .. adds .. removes)
  end
  local t = redis.call("TYPE", KEYS[i + 1])["ok"]
  if t == "hash" then
    -- An aggregate key (incr.lua): its totals (a sorted set of sums, or a hash of counters) and fences.
    local totals = KEYS[i]
    local held = redis.call("TYPE", totals)["ok"] == "hash" and hdigest(totals) or digest(totals)
    return "a" .. (held or "") .. "|" .. (hdigest(KEYS[i + 1]) or "")
  end
  if t == "none" and redis.call("TYPE", KEYS[i])["ok"] == "hash" then
    local held, fences = hdigest(KEYS[i], true) -- a one-key counters key
    return "a" .. (held or "") .. "|" .. (fences or "")
  end
  local adds, removes = digest(KEYS[i]), digest(KEYS[i + 1])
  if not adds and not removes then return nil end
  return (adds or "") .. "|" .. (removes or "")
end

for i = 1, #KEYS, stride do
  local held, floor = sets(i), floor_of(i)
  if held or floor ~= "" then
    out[#out + 1] = (held or "") .. "|" .. floor
  else
    out[#out + 1] = ""
  end
end
return out
