-- zcluster 2P-set write: many tuples per call, grouped by logical set.
--
-- KEYS, per group (stride 2, or 3 with floors): the add set K+, the remove set K-[, the floor].
-- ARGV[1] = "+" (insert) or "-" (delete), "+!" or "-!" in a call that a WAIT or WAITAOF follows (see "Waits"
-- below); ARGV[2] = size bound N (0 = unbounded); ARGV[3] = the key mode:
-- "0" declared keys, "1" declared keys with floors (always with a bound), "k" / "K" the same keys in ARGV
-- instead (see below); ARGV[4] = S, how many groups at the start hold one tuple each and are sent without
-- their count (spread keys: most groups; a count costs the server about 1,000 instructions to receive);
-- then per group: [its keys, in "k"/"K" mode,] the tuple count c (not for the first S groups: c = 1),
-- and c pairs of score (a decimal the client printed exactly) and member, in the caller's order.
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
-- WRONGTYPE before it changes anything of it. The exceptions: an insert into a set found with no K- (and
-- no floor) by EXISTS writes K+ unread; there is no aggregate's K- there, and a K+ of another type (a
-- counters key's hash) refuses the ZADD (or the bound's ZCARD) itself. Likewise a delete from a set found
-- with no K+ (and no floor) writes K- unread: no aggregate lacks its K+, and a K- hash refuses the ZADD.
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
-- Declared keys are surveyed first: one EXISTS per block of up to 64 groups over the keys that could make a
-- tuple of the group stale (K- and the floor for an insert, K+ and the floor for a delete); a group whose
-- keys all are absent is clean: without a bound each of its tuples is one ZADD GT CH (an insert's of K+, a
-- delete's of K-), which decides and writes at once, with no record read and no number parsed; with a
-- bound it skips its record reads. A clean block of one-tuple groups (spread keys) is one such loop, with
-- none of the per-group steps. A mixed block is surveyed again in blocks of 8; groups still unknown
-- read their records. Exact, as no call creates a surveyed key (an insert only writes K+ and removes from
-- K-, a delete the reverse) but a floor, which only a trim sets: after one the call trusts no survey.
-- Inline keys are not surveyed: one EXISTS over keys of many slots would be refused as a whole.
-- One tuple at a time, whatever the group's size: reading a group's records at once (ZMSCORE) and writing
-- the net changes measured slower, even at hundreds of tuples per set (Lua tables cost about as much as a
-- command per few entries).
-- Scores are passed to ZADD as the client's own text: Lua prints numbers with 14 digits, which would
-- round them. Comparisons use tonumber() of exact texts, so they are exact for every double.
-- No command takes more than a survey block's keys: unpack() of thousands of values overflows Lua's stack.
--
-- Waits: some servers' WAIT and WAITAOF (Valkey 9's) cover only what the waiting connection's own commands
-- propagated, and a script that writes nothing propagates nothing. A resend of tuples an earlier attempt
-- applied (its wait fell short, then the connection was replaced) finds them all applied ("0") and would write
-- nothing, so its wait would confirm at once what the replicas may not hold. A call marked "!" that took no
-- tuple ("1"), finished or stopped early, therefore writes one record of the call again as it is (two ZADD XX
-- of a member found in either set of its group: to another score and back; else SET of a floor to its own
-- value): the keys end as they were, and the write moves the connection's offset past every earlier write of
-- the master, the first attempt's included. Only a call none of whose members and floors has a record here
-- is left with nothing to write.
local insert = string.byte(ARGV[1], 1) == 43 -- "+"
local waited = #ARGV[1] > 1
local bound = tonumber(ARGV[2])
local singles = tonumber(ARGV[4]) -- the first groups, of one tuple and no count
local floors = ARGV[3] == "1" or ARGV[3] == "K"
local inline = ARGV[3] == "k" or ARGV[3] == "K"
local stride = 2
if floors then stride = 3 end
-- Groups per survey block (see the header), and per block of a mixed block's second look.
local BLOCK, SUB = 64, 8
local out, nout = {}, 0 -- the verdicts, and how many
local floorset = false -- a trim set a floor in this call: the survey no longer holds (see the header)

-- Redis answers a missing score or string as false.
local function num(reply)
  if reply then return tonumber(reply) end
  return false
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
    floorset = true
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
    local m = ARGV[pos + 2 * j + 1]
    local ok = "0"
    if insert then
      -- parsed once a record or the floor needs it: a clean set with room never does
      local del, s = false, false
      if not clean then
        del = num(redis.call("ZSCORE", rems, m))
        s = tonumber(stext)
      end
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
        if not s then s = tonumber(stext) end
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
                floorset = true
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
      local s = tonumber(stext)
      local ins = false -- a clean delete's K+ is absent (see the header)
      if not clean then ins = num(redis.call("ZSCORE", adds, m)) end
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
    nout = nout + 1
    out[nout] = ok
  end
end

-- One tuple for a set (spread keys; or each of a few, in order): no tables, one to three commands. ZADD GT
-- CH adds a new member or raises its score and says whether it did, so it decides and writes at once where
-- the other set's record (read first, unless `clean` says that set and the floor are absent) does not
-- decide. A member is never in both sets, so one record read suffices. The score's text is parsed only to
-- compare it with a record or the floor.
local function single(adds, rems, floor, stext, m, clean)
  if insert then
    if not clean then
      local d = num(redis.call("ZSCORE", rems, m))
      if d then
        if tonumber(stext) <= d then return "0" end
        -- Inline keys: K+ must prove local before K- loses the record (see the header).
        if inline then redis.call("EXISTS", adds) end
        redis.call("ZREM", rems, m)
        redis.call("ZADD", adds, stext, m)
        return "1"
      end
      if floor and tonumber(stext) <= floor then -- the floor judges a member without a record: is it in K+?
        local i = num(redis.call("ZSCORE", adds, m))
        if not i or tonumber(stext) <= i then return "0" end
      end
    end
    if redis.call("ZADD", adds, "GT", "CH", stext, m) == 1 then return "1" end
    return "0"
  end
  if not clean then
    local i = num(redis.call("ZSCORE", adds, m))
    if i then
      local s = tonumber(stext)
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
    -- No new tombstone at or below the floor (it rejects older inserts), but the floor judges only members
    -- without a record: m's older tombstone rises.
    if floor and tonumber(stext) <= floor then
      if redis.call("ZADD", rems, "XX", "GT", "CH", stext, m) == 1 then return "1" end
      return "0"
    end
  end
  if redis.call("ZADD", rems, "GT", "CH", stext, m) == 1 then return "1" end
  return "0"
end

-- The survey (see the header): absent[g] true when group g's keys that could make its tuples stale all are
-- absent, false when all are there; nil when unknown. Groups lo..hi, 1-based, declared keys only.
local absent = {}
local function look(lo, hi)
  local keys, n = {}, 0
  local other = 2 -- an insert is judged by K-, a delete by K+ (and either by the floor)
  if not insert then other = 1 end
  for g = lo, hi do
    local at = (g - 1) * stride
    n = n + 1
    keys[n] = KEYS[at + other]
    if floors then
      n = n + 1
      keys[n] = KEYS[at + 3]
    end
  end
  local found = redis.call("EXISTS", unpack(keys, 1, n))
  if found == 0 or found == n then
    for g = lo, hi do absent[g] = found == 0 end
  end
  return found == 0 or found == n
end

-- True when the whole block lo..hi is clean.
local function survey(lo, hi)
  if look(lo, hi) then return absent[lo] end
  if hi - lo < SUB then return false end
  for sub = lo, hi, SUB do look(sub, math.min(sub + SUB - 1, hi)) end
  return false
end

-- Where group keys are: the table and the index before them, and the position of the group's count in ARGV
-- (`pos`, `base`: where the group starts in ARGV, and in KEYS when they are declared).
local function keys_of(pos, base)
  if inline then return ARGV, pos - 1, pos + stride end
  return KEYS, base, pos
end

-- Applies every group in order, appending each tuple's verdict once its writes are done.
local function apply()
  local argv, call = ARGV, redis.call
  local pos, base, g, last = 5, 0, 0, #argv
  local surveyed = not inline
  local groups = #KEYS / stride
  local own = 1 -- the set a clean tuple writes: an insert's K+, a delete's K-
  if not insert then own = 2 end
  while pos <= last do
    g = g + 1
    if surveyed and floorset then surveyed = false end
    local hi = false -- the last group of a clean block of one-tuple groups starting at g
    if surveyed and g % BLOCK == 1 then
      hi = math.min(g + BLOCK - 1, groups)
      if not (survey(g, hi) and hi <= singles and bound == 0) then hi = false end
    end
    if hi then
      -- A clean block of one-tuple groups (no bound, so no floors): one ZADD GT CH each (see the header).
      for key = base + own, base + stride * (hi - g) + own, stride do
        nout = nout + 1
        if call("ZADD", KEYS[key], "GT", "CH", argv[pos], argv[pos + 1]) == 1 then
          out[nout] = "1"
        else
          out[nout] = "0"
        end
        pos = pos + 2
      end
      base = base + stride * (hi - g + 1)
      g = hi
    else
      local from, at
      from, at, pos = keys_of(pos, base)
      local adds, rems = from[at + 1], from[at + 2]
      -- tonumber() costs as much as a third of a command: a group of spread keys mostly holds one tuple
      local count, first = 1, pos
      if g > singles then
        if argv[pos] ~= "1" then count = tonumber(argv[pos]) end
        first = pos + 1
      end
      local floorkey, floor, clean = nil, false, false
      if floors then floorkey = from[at + 3] end
      if surveyed and absent[g] ~= nil then
        clean = absent[g]
      elseif insert and (floors or count > 1) then
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
        bounded(adds, rems, floorkey, floor, first, count, clean)
      elseif clean then
        -- No record and no floor to judge by: each tuple is one ZADD GT CH of its own set, in order, however
        -- many (measured: cheaper than reading a group's scores at once and writing the winners, even at 300
        -- tuples a set, as Lua tables cost about as much as a command per few entries).
        local target = rems
        if insert then target = adds end
        for j = first, first + 2 * count - 1, 2 do
          nout = nout + 1
          if call("ZADD", target, "GT", "CH", argv[j], argv[j + 1]) == 1 then
            out[nout] = "1"
          else
            out[nout] = "0"
          end
        end
      else
        for j = first, first + 2 * count - 1, 2 do
          nout = nout + 1
          out[nout] = single(adds, rems, floor, argv[j], argv[j + 1], clean)
        end
      end
      pos, base = first + 2 * count, base + stride
    end
  end
end

-- Writes one record of the call again as it is, for the wait after it (see "Waits" in the header): the first
-- found of its tuples' members in either set of its group (moved to another score and back), else the first
-- floor of its groups (set again to its own value). A key that is absent, of another kind (an aggregate's
-- hash) or not served here is passed over: any write of the master moves the connection's offset past all
-- earlier ones, so any record does.
local function rewrite()
  local argv, pos, base, g = ARGV, 5, 0, 0
  local floorkeys = {}
  while pos <= #argv do
    local from, at
    from, at, pos = keys_of(pos, base)
    g = g + 1
    local first, count = pos, 1
    if g > singles then first, count = pos + 1, tonumber(argv[pos]) end
    local stop = first + 2 * count - 1 -- the group's last member
    for set = at + 1, at + 2 do
      for j = first + 1, stop, 2 do
        local found, stored = pcall(redis.call, "ZSCORE", from[set], argv[j])
        if found and stored then
          -- Moved away and back, never removed: a set of one member would be deleted, and lose its TTL.
          local away = "0"
          if tonumber(stored) == 0 then away = "1" end
          redis.call("ZADD", from[set], "XX", away, argv[j])
          redis.call("ZADD", from[set], "XX", stored, argv[j])
          return
        end
      end
    end
    if floors then floorkeys[#floorkeys + 1] = from[at + 3] end
    pos, base = stop + 1, base + stride
  end
  for _, key in ipairs(floorkeys) do
    local found, floor = pcall(redis.call, "GET", key)
    if found and floor then
      redis.call("SET", key, floor, "KEEPTTL")
      return
    end
  end
end

-- A call stopped early (NOTLOCAL, WRONGTYPE) is rewritten too: its wait covers the tuples it did.
local done, err = pcall(apply)
if waited and not string.find(table.concat(out), "1", 1, true) then rewrite() end
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
