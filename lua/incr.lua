-- zcluster fenced increments: sums (a sorted set of totals) and exact counters (a hash of int64 totals),
-- each applied once per (key, source, position) however often it is sent.
--
-- KEYS, per group: K+ (the totals) and K-. A key's fences (per source, "c:m:j:n": the position of the last
-- increment applied from that source and n, how many of that source's increments the key holds; a farm
-- compares replicas by both, and n tells a replica that lost increments from one that has them all) are
-- kept:
-- * sums: in K-, a hash source -> fence (two keys: a sorted set of totals cannot hold them);
-- * counters: in K+ itself, field FENCE .. source (FENCE = "\0zc|", a prefix the client refuses in a
--   counter's field), one key per counters aggregate. A counters key made before this layout keeps its
--   fences in a K- hash and keeps working: a source without a fence field in K+ reads K-, and a key whose
--   K- is a hash keeps its fences there (no migration).
-- Kinds refuse each other's writes before touching anything: a 2P-set's K+ and K- are sorted sets (or
-- absent), so HGET of a counters fence in its K+ answers WRONGTYPE, and a K- that is not a hash is a
-- 2P-set's; the 2P-set write script's first command on a counters key's K+ (a hash) answers WRONGTYPE, and
-- it reads K- (a sums key's fences: a hash) before it writes K+.
-- ARGV[1] = "s" (sums: K+ is a sorted set, member -> total, deltas are doubles) or "c" (counters: K+ is a
-- hash, field -> total, deltas are integers); ARGV[2] = seconds to live set on the key when this call
-- creates it ("0": none); then per group: the source, the increment count n, and n quintuples:
-- position (three non-negative integers c, m, j below 2^53, compared in that order), member, delta.
-- Within a group positions must strictly increase (the client sends a source's increments of a key in order,
-- and a position names one increment of its source).
--
-- Returns one character per increment, in ARGV order: "1" applied, "0" at or below the source's fence
-- (applied before: a resend, a replay, a zombie), "k" the key is of another kind (nothing of its group
-- applied; at or below the fence too, where no total's command tells the kind, so TYPE does), "o" the total would overflow (counters) or stop being a finite number (sums): not applied, and
-- "s" after an "o" of its group: not sent to the server's totals, so that no later increment of a source
-- is ever applied before an earlier one. The fence always ends at the last increment applied; a group with a
-- "0" and nothing applied writes its fence again as it is (see below: a write, for the caller's WAIT). Any other
-- error of a total's command (NOREPLICAS, OOM: refused at a script's first write, so before anything was
-- written) fails the whole call, which the client resends.
local sums = ARGV[1] == "s"
local ttl = tonumber(ARGV[2])
local out = {}
local HUGE = 2 ^ 970
local FENCE = "\0zc|"

-- The key's kind ("new", "mine" or "other": not an aggregate of this call's kind, as far as the fences
-- tell), the source's fence, and where the key keeps it: the hash and field. A 2P-set's K- is a sorted set
-- (HGET answers WRONGTYPE) or absent (then K+ tells); the kind of an aggregate key (sums or counters) is
-- checked by the first total's command (WRONGTYPE).
local function fence_in(totals, fences, source)
  local f = redis.pcall("HGET", fences, source)
  if type(f) == "table" and f.err then return "other" end
  if not f then
    -- 0: a new key; 2: another source's aggregate; 1: totals without fences, a 2P-set without tombstones
    -- (an aggregate's two keys are made, and expire, together)
    local held = redis.call("EXISTS", fences, totals)
    if held == 0 then return "new", -1, -1, -1, 0 end
    if held == 2 then return "mine", -1, -1, -1, 0 end
    return "other"
  end
  local c, m, j, n = string.match(f, "^(%d+):(%d+):(%d+):?(%d*)$")
  return "mine", tonumber(c), tonumber(m), tonumber(j), tonumber(n) or 0, f
end

local function fence_of(totals, fences, source)
  if sums then return fences, source, fence_in(totals, fences, source) end
  local field = FENCE .. source
  local f = redis.pcall("HGET", totals, field)
  if type(f) == "table" and f.err then return totals, field, "other" end -- a sorted set: sums or a 2P-set
  if f then
    local c, m, j, n = string.match(f, "^(%d+):(%d+):(%d+):(%d+)$")
    return totals, field, "mine", tonumber(c), tonumber(m), tonumber(j), tonumber(n), f
  end
  -- A K- beside a hash K+ without this source's fence: the two-key layout (or a 2P-set's tombstones, which
  -- fence_in's HGET refuses: WRONGTYPE).
  if redis.call("EXISTS", fences) == 1 then return fences, source, fence_in(totals, fences, source) end
  -- One key: a new one, or another source's (its totals are a hash: HGET said so).
  if ttl > 0 and redis.call("EXISTS", totals) == 0 then return totals, field, "new", -1, -1, -1, 0 end
  return totals, field, "mine", -1, -1, -1, 0
end

local pos, g = 3, 0
while pos <= #ARGV do
  local totals, fences = KEYS[2 * g + 1], KEYS[2 * g + 2]
  local source, n = ARGV[pos], tonumber(ARGV[pos + 1])
  local first, last = pos + 2, pos + 1 + 5 * n
  -- held: the fence as stored (when there is one), written again as it is below
  local at, field, k, fc, fm, fj, fn, held = fence_of(totals, fences, source)
  if k == "other" then
    for _ = 1, n do out[#out + 1] = "k" end
  else
    -- A fence found in K+ proved it a hash: a counters key (a sums key's fences need TYPE, below).
    local moved, failed, checked, fenced = false, false, at == totals and fc >= 0, false
    for i = first, last, 5 do
      if failed then
        out[#out + 1] = "s"
      else
        local c, m, j = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
        if c < fc or (c == fc and (m < fm or (m == fm and j <= fj))) then
          if not checked and not moved then
            -- No total command proved the key's kind yet: a sums key's fences look like a counters key's,
            -- so an increment of the other kind must not pass for a resend (once per group, only here).
            checked = true
            local t = redis.call("TYPE", totals)["ok"]
            if t ~= "none" and t ~= (sums and "zset" or "hash") then
              for _ = first, last, 5 do out[#out + 1] = "k" end
              break
            end
          end
          out[#out + 1] = "0"
          fenced = true
        else
          local r
          if sums then
            local d = tonumber(ARGV[i + 4])
            if d >= HUGE or d <= -HUGE then
              -- Only a delta this large can carry a finite total past the largest double (a finite total
              -- plus less than 2^970 rounds to at most DBL_MAX): check it before, as ZINCRBY would keep inf.
              local before = redis.pcall("ZSCORE", totals, ARGV[i + 3])
              if type(before) == "table" then
                r = before -- WRONGTYPE: the other kind of aggregate, handled below
              else
                local after = tonumber(before or "0") + d
                if after == math.huge or after == -math.huge then r = {err = "ERR total would overflow"} end
              end
            end
            r = r or redis.pcall("ZINCRBY", totals, ARGV[i + 4], ARGV[i + 3])
          else
            r = redis.pcall("HINCRBY", totals, ARGV[i + 3], ARGV[i + 4])
          end
          if type(r) == "table" and r.err and string.find(r.err, "WRONGTYPE", 1, true) then
            -- The other kind of aggregate (the group's first total command: nothing of it was applied).
            for _ = #out - (i - first) / 5 + 1, #out do out[_] = "k" end
            for _ = i, last, 5 do out[#out + 1] = "k" end
            fenced = false
            break
          elseif type(r) == "table" and r.err then
            if not (string.find(r.err, "overflow", 1, true) or string.find(r.err, "not a number", 1, true)) then
              -- Not this increment's fault (NOREPLICAS, OOM: Redis refuses a script's first write, so
              -- nothing of the call was written): the call fails and is resent whole.
              if moved then redis.call("HSET", at, field, string.format("%d:%d:%d:%d", fc, fm, fj, fn)) end
              return redis.error_reply(r.err)
            end
            out[#out + 1] = "o"
            failed = true
          else
            out[#out + 1] = "1"
            fc, fm, fj, fn, moved = c, m, j, fn + 1, true
          end
        end
      end
    end
    if moved then
      redis.call("HSET", at, field, string.format("%d:%d:%d:%d", fc, fm, fj, fn))
      if k == "new" and ttl > 0 then
        redis.call("EXPIRE", totals, ttl)
        if at == fences then redis.call("EXPIRE", fences, ttl) end
      end
    elseif fenced then
      -- Found at or below the fence: applied before, maybe by a call whose WAIT fell short, on another
      -- connection (a reconnect, a retried task). On Valkey this call's WAIT covers only its connection's
      -- writes: the fence written again as it is (a write, so replicated after that call's) makes it cover
      -- those too, so the resend is confirmed only once the replicas hold what it found applied.
      redis.call("HSET", at, field, held)
    end
  end
  pos = last + 1
  g = g + 1
end
return table.concat(out)
