-- zcluster 2P-set write: many tuples per call, grouped by logical set.
-- (The differential test's oracle: the script before issue #40, with one later change of rules applied
-- to both: a full set's refused insert drops the member's older tombstone, and a delete at or below the
-- floor raises the member's older tombstone; see docs/faults.md, "bounded set replays".)
--
-- KEYS, per group (stride 2, or 3 with floors): the add set K+, the remove set K-[, the floor].
-- ARGV[1] = "+" (insert) or "-" (delete); ARGV[2] = size bound N (0 = unbounded); ARGV[3] = the key mode:
-- "0" declared keys, "1" declared keys with floors (always with a bound), "k" / "K" the same keys in ARGV
-- instead (see below); then per group: [its keys, in "k"/"K" mode,] the tuple count c, and c pairs of
-- score (a decimal the client printed exactly) and member, in the caller's order.
-- Returns a string with one character per tuple, in ARGV order: "1" took effect, "0" stale; a call that
-- stopped early ends with "|NOTLOCAL ..." (see below) or "|WRONGTYPE ..." (the next tuple's key is of another
-- kind, see the end of this header) after the verdicts of the tuples it did.
--
-- "k"/"K" carry the keys of many slots of one Redis Cluster node in one call; no key is declared, and the
-- client loads this script with the allow-cross-slot-keys flag for that. Redis refuses a command on a key
-- the node does not serve (a stale slot map; a key missing from a slot mid-migration): the script then
-- stops and returns the verdicts of the tuples done so far, "|NOTLOCAL " and Redis' error, and the client
-- resends the other tuples one slot per call. A tuple stopped halfway has at most lost the record the
-- resend replaces: every path reads (or, once, EXISTS) both sets of a key before it can write the second,
-- except a delete of a member of K+, which writes its tombstone to K- before it removes m from K+; stopped
-- between the two, its resend finds m in both and does the same again (a delete's outcome: "1"). So the
-- resend gives every tuple its exact verdict.
--
-- Aggregate keys (lua/incr.lua) keep a hash in K- (sums, and counters made before the one-key layout) or
-- in K+ (counters: their fences among the totals, no K-). Every path here touches K- (a read, or the
-- tombstone) before it writes K+, and reads K+ before it writes K-, so a write to such a key fails with
-- WRONGTYPE before it changes anything of it. The one exception: an insert into a set found with no K- (and
-- no floor) by EXISTS writes K+ unread; there is no aggregate's K- there, and a K+ of another type (a
-- counters key's hash) refuses the ZADD (or the bound's ZCARD) itself.
-- Past a read, a key stays writable in a migrating slot: an insert only adds to K+ and removes from K-,
-- a delete the reverse, and a floor is only set, so no call empties a key and then writes it again.
--
-- The floor (the highest score trimmed or forgotten for this set) only judges members without a record:
-- a member still in K+ or K- has never had a newer record forgotten (a newer delete would have removed it
-- from K+, a newer insert would have replaced its tombstone), so its own record decides. Two paths keep
-- that true where a newer write leaves no record of its own: an insert refused by a full set (the floor
-- rises to it) removes m's older tombstone, and a delete at or below the floor (no new tombstone) raises
-- m's older one. Then a replay in any order finds every write it already took or refused stale.
--
-- Scores are passed to ZADD as the client's own text: Lua prints numbers with 14 digits, which would
-- round them. Comparisons use tonumber() of exact texts, so they are exact for every double.
-- Long argument lists go to Redis in slices: unpack() of thousands of values overflows Lua's stack.
local insert = ARGV[1] == "+"
local bound = tonumber(ARGV[2])
local floors = ARGV[3] == "1" or ARGV[3] == "K"
local inline = ARGV[3] == "k" or ARGV[3] == "K"
local stride = 2
if floors then stride = 3 end
local SLICE = 256
-- Up to this many tuples for a set go one at a time through `single`, in order (the same decisions as
-- `grouped`, which decides them in order too): a few commands each beat `grouped`'s dozen tables
-- (measured: 1.4x faster at 2 tuples per set, 1.06x at 8; `grouped` is 1.08x faster at 20).
local FEW = 12
local out = {}

-- Redis answers a missing score or string as false.
local function num(reply)
  if reply then return tonumber(reply) end
  return false
end

-- cmd key args[lo..] in slices of `width`-aligned runs.
local function sliced(cmd, key, args, width)
  local step = SLICE * width
  for lo = 1, #args, step do
    redis.call(cmd, key, unpack(args, lo, math.min(lo + step - 1, #args)))
  end
end

local function scores(key, members)
  local res = {}
  for lo = 1, #members, SLICE do
    local hi = math.min(lo + SLICE - 1, #members)
    local reply = redis.call("ZMSCORE", key, unpack(members, lo, hi))
    for j = lo, hi do res[j] = num(reply[j - lo + 1]) end
  end
  return res
end

-- Remove the lowest entries of `set` beyond the bound (its size is `card`); raise the floor to the highest
-- score removed. Returns the floor and the new size.
local function trim(set, card, floorkey, floor)
  if card <= bound then return floor, card end
  local cut = redis.call("ZRANGE", set, card - bound - 1, card - bound - 1, "WITHSCORES")
  redis.call("ZREMRANGEBYRANK", set, 0, card - bound - 1)
  local top = tonumber(cut[2])
  if not floor or top > floor then
    redis.call("SET", floorkey, cut[2])
    floor = top
  end
  return floor, bound
end

-- With a bound, trimming interleaves with the writes: one tuple at a time, as in a single-tuple call. The
-- sets' sizes are read once per group and counted here. A set with room takes a write the way `single`
-- does: one record read and ZADD GT CH, which decides and writes at once. CH says "changed", not "added",
-- so after it a count may be high by the members it raised (`exact` false): a high count only sends the
-- next tuple the exact way (both records, and the size read again before it can trim).
local function bounded(adds, rems, floorkey, floor, pos, count, clean)
  local nadds, nrems = false, false
  local adds_exact, rems_exact = true, true
  for j = 0, count - 1 do
    local stext = ARGV[pos + 2 * j]
    local s = tonumber(stext)
    local m = ARGV[pos + 2 * j + 1]
    local ok = "0"
    if insert then
      local del = false
      if not clean then del = num(redis.call("ZSCORE", rems, m)) end
      if not nadds then nadds = redis.call("ZCARD", adds) end
      if del and s <= del then
        ok = "0"
      elseif nadds < bound and (del or not (floor and s <= floor)) then
        -- Room for m, and its own record decides (the floor only judges members without one).
        if del then -- then m is not in K+: a member is never in both sets
          redis.call("ZREM", rems, m)
          if nrems then nrems = nrems - 1 end
          redis.call("ZADD", adds, stext, m)
          nadds = nadds + 1
          ok = "1"
        elseif redis.call("ZADD", adds, "GT", "CH", stext, m) == 1 then
          nadds = nadds + 1
          adds_exact = false
          ok = "1"
        end
      else
        local ins = num(redis.call("ZSCORE", adds, m))
        if not ((ins and s <= ins) or (floor and s <= floor and not ins and not del)) then
          local full = false
          if not ins then
            if not adds_exact then
              nadds, adds_exact = redis.call("ZCARD", adds), true
            end
            if nadds >= bound then
              local low = redis.call("ZRANGE", adds, 0, 0, "WITHSCORES")
              full = s < tonumber(low[2])
              -- As if added and trimmed at once: the floor remembers it, so a replay stays stale. The insert
              -- would have replaced m's older tombstone: it goes too (after the floor's SET, which a migrating
              -- slot may refuse), or it, not the floor, would judge a replay once the set has room.
              if full and (not floor or s > floor) then
                redis.call("SET", floorkey, stext)
                floor = s
              end
              if full and del then
                redis.call("ZREM", rems, m)
                if nrems then nrems = nrems - 1 end
              end
            end
          end
          if not full then
            if del then
              redis.call("ZREM", rems, m)
              if nrems then nrems = nrems - 1 end
            end
            redis.call("ZADD", adds, stext, m)
            if not ins then
              nadds = nadds + 1
              floor, nadds = trim(adds, nadds, floorkey, floor)
            end
            ok = "1"
          end
        end
      end
    else
      local ins = num(redis.call("ZSCORE", adds, m))
      local grew = false
      if ins then -- then m is not in K-
        if s >= ins then
          -- At or below the floor a tombstone is redundant: the floor already rejects older inserts. The
          -- tombstone goes first: K- refuses the write before K+ loses m when it is not a 2P-set's.
          if not (floor and s <= floor) then
            redis.call("ZADD", rems, stext, m)
            grew = true
          else
            redis.call("ZCARD", rems) -- no tombstone: K- still refuses the write first (see the header)
          end
          redis.call("ZREM", adds, m)
          if nadds then nadds = nadds - 1 end
          ok = "1"
        end
      elseif floor and s <= floor then
        -- The floor judges only members without a record: m's older tombstone rises (K- does not grow).
        if redis.call("ZADD", rems, "XX", "GT", "CH", stext, m) == 1 then ok = "1" end
      elseif redis.call("ZADD", rems, "GT", "CH", stext, m) == 1 then
        ok = "1"
        grew = true
        rems_exact = not nrems -- counted from here on: may be high if m was raised
      end
      if grew then
        if nrems then
          nrems = nrems + 1
        else
          nrems = redis.call("ZCARD", rems)
        end
        if nrems > bound then
          if not rems_exact then
            nrems, rems_exact = redis.call("ZCARD", rems), true
          end
          floor, nrems = trim(rems, nrems, floorkey, floor)
        end
      end
    end
    out[#out + 1] = ok
  end
end

-- Queue member m's change from score `before` to `now` (false: absent) as a ZADD pair or a ZREM.
local function net(now, before, text, m, added, removed)
  if now == before then return end
  if now then
    added[#added + 1] = text
    added[#added + 1] = m
  else
    removed[#removed + 1] = m
  end
end

-- Without a bound nothing depends on set sizes: read every member's two scores at once, decide each tuple
-- in order on those values, then write only the net changes, a few commands per group.
local function grouped(adds, rems, floor, pos, count)
  local order, index = {}, {}
  for j = 0, count - 1 do
    local m = ARGV[pos + 2 * j + 1]
    if not index[m] then
      order[#order + 1] = m
      index[m] = #order
    end
  end
  local ins0, del0 = scores(adds, order), scores(rems, order)
  local ins, del, instext, deltext = {}, {}, {}, {}
  for k = 1, #order do
    ins[k], del[k] = ins0[k], del0[k]
  end
  for j = 0, count - 1 do
    local stext = ARGV[pos + 2 * j]
    local s = tonumber(stext)
    local k = index[ARGV[pos + 2 * j + 1]]
    local ok = "0"
    if insert then
      -- Newer than the member's record (a delete wins ties); without one, newer than the floor.
      local i, d = ins[k], del[k]
      if not ((i and s <= i) or (d and s <= d) or (floor and s <= floor and not i and not d)) then
        ins[k], instext[k], del[k] = s, stext, false
        ok = "1"
      end
    else
      -- Only a strictly newer insert or an equal-or-newer delete makes a delete stale.
      if not ((ins[k] and s < ins[k]) or (del[k] and s <= del[k])) then
        if ins[k] then
          ins[k] = false
          ok = "1"
        end
        -- At or below the floor a tombstone is redundant: the floor already rejects older inserts.
        -- (The floor judges only members without a record: an older tombstone rises.)
        if del[k] or not (floor and s <= floor) then
          del[k], deltext[k] = s, stext
          ok = "1"
        end
      end
    end
    out[#out + 1] = ok
  end
  local add_in, rem_in, add_del, rem_del = {}, {}, {}, {}
  for k = 1, #order do
    net(ins[k], ins0[k], instext[k], order[k], add_in, rem_in)
    net(del[k], del0[k], deltext[k], order[k], add_del, rem_del)
  end
  sliced("ZADD", adds, add_in, 2)
  sliced("ZREM", adds, rem_in, 1)
  sliced("ZADD", rems, add_del, 2)
  sliced("ZREM", rems, rem_del, 1)
end

-- One tuple for a set (spread keys; or each of a few, in order): no tables, two or three commands. ZADD GT CH adds a new member or
-- raises its score and says whether it did, so it decides and writes at once where the other set's record
-- (read first) does not decide. A member is never in both sets, so one record read suffices.
local function single(adds, rems, floor, stext, m, clean)
  local s = tonumber(stext)
  if insert then
    local d = false
    if not clean then d = num(redis.call("ZSCORE", rems, m)) end
    if d then
      if s <= d then return "0" end
      -- Inline keys: K+ must prove local before K- loses the record (see the header).
      if inline then redis.call("EXISTS", adds) end
      redis.call("ZREM", rems, m)
      redis.call("ZADD", adds, stext, m)
      return "1"
    end
    if floor and s <= floor then  -- the floor judges a member without a record: is it in K+?
      local i = num(redis.call("ZSCORE", adds, m))
      if not i or s <= i then return "0" end
    end
    if redis.call("ZADD", adds, "GT", "CH", stext, m) == 1 then return "1" end
    return "0"
  end
  local i = num(redis.call("ZSCORE", adds, m))
  if i then
    if s < i then return "0" end
    -- The tombstone first: K- refuses the write before K+ loses m when it is not a 2P-set's (see the header).
    if not (floor and s <= floor) then
      redis.call("ZADD", rems, stext, m)
    else
      redis.call("ZCARD", rems) -- no tombstone: K- still refuses the write first (see the header)
    end
    redis.call("ZREM", adds, m)
    return "1"
  end
  if floor and s <= floor then -- no new tombstone there (the floor rejects older inserts); an older one rises
    if redis.call("ZADD", rems, "XX", "GT", "CH", stext, m) == 1 then return "1" end
    return "0"
  end
  if redis.call("ZADD", rems, "GT", "CH", stext, m) == 1 then return "1" end
  return "0"
end

-- Applies every group, appending each tuple's verdict once its writes are done.
local function apply()
  local pos, base = 4, 0
  while pos <= #ARGV do
    local from, at = KEYS, base -- where this group's keys are
    if inline then
      from, at = ARGV, pos - 1
      pos = pos + stride
    end
    local adds, rems = from[at + 1], from[at + 2]
    local count = tonumber(ARGV[pos])
    local floorkey, floor, clean = nil, false, false
    if floors then floorkey = from[at + 3] end
    if insert and (bound > 0 or count <= FEW) and (floors or count > 1) then
      -- One EXISTS instead of a tombstone read per tuple (and the floor's GET): a set with neither, the
      -- common case of spread keys, needs only its K+. EXISTS reads no type: an aggregate key's K- (a
      -- hash) exists, so its write takes the reading path and fails with WRONGTYPE as before.
      if floors then
        clean = redis.call("EXISTS", rems, floorkey) == 0
      else
        clean = redis.call("EXISTS", rems) == 0
      end
    end
    if floors and not clean then floor = num(redis.call("GET", floorkey)) end
    if bound > 0 then
      bounded(adds, rems, floorkey, floor, pos + 1, count, clean)
    elseif count <= FEW then
      for j = pos + 1, pos + 2 * count, 2 do
        out[#out + 1] = single(adds, rems, floor, ARGV[j], ARGV[j + 1], clean)
      end
    else
      grouped(adds, rems, floor, pos + 1, count)
    end
    pos = pos + 1 + 2 * count
    base = base + stride
  end
end

local done, err = pcall(apply)
if done then return table.concat(out) end
local text = err
if type(err) == "table" then text = err.err end
text = tostring(text)
-- Redis says "Script attempted to access a non local key", Valkey "Attempted to access a non local key".
if inline and string.find(text, "non local key", 1, true) then
  return table.concat(out) .. "|NOTLOCAL " .. text
end
-- A key of another kind (an aggregate's hash where a 2P-set's sorted set belongs): the tuple the script
-- stopped at changed nothing (see the header); the client refuses it and resends the rest.
if string.find(text, "WRONGTYPE", 1, true) then
  return table.concat(out) .. "|WRONGTYPE " .. text
end
return redis.error_reply(text)
