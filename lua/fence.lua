-- zcluster's migration lease and fences (zcluster/migration/_fence.py says what they are for).
--
-- KEYS[1] is always a fence: a hash with fields "lease" (an id, made when the lease is first taken) and
-- "gen" (the generation of the mover holding it); the lease itself (on the source's first shard) also has
-- "holder", "since" and "beat" (server time, seconds). ARGV[1] is the mode, ARGV[2] the lease id and
-- ARGV[3] the generation of the caller; then the mode's own arguments.
--
-- Writes ("copy", "del", "set", "cas") run only while the fence holds the caller's lease
-- and generation, checked and written in one step: a mover taken over (a newer generation) or one whose
-- migration has ended (the fence dropped) writes nothing, and gets the error "ZCFENCED <what holds it>".

local mode, lease, gen = ARGV[1], ARGV[2], ARGV[3]

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function holds()
  local f = redis.call('HMGET', KEYS[1], 'lease', 'gen')
  return f[1] == lease and f[2] == gen, f
end

if mode == 'acquire' then
  -- ARGV[4] holder, ARGV[5] a new lease id (used when none exists), ARGV[6] seconds without a beat after
  -- which the caller's lease is stale (kept as "ttl": a lease is judged by its holder's), ARGV[7] the holder this call may replace although its lease is live ("" none,
  -- "*" any). Returns {1, lease, gen, since, the holder replaced ("" none)} or, refused,
  -- {0, holder, since, beat, now, ttl}.
  local f = redis.call('HMGET', KEYS[1], 'lease', 'gen', 'holder', 'since', 'beat', 'ttl')
  local t = now()
  local holder = f[3] or ''
  local ttl = f[6] or ARGV[6]
  if holder ~= '' and t - tonumber(f[5] or '0') < tonumber(ttl) and ARGV[7] ~= '*' and ARGV[7] ~= holder then
    return {0, holder, f[4] or '0', f[5] or '0', string.format('%.3f', t), ttl}
  end
  local id = f[1] or ARGV[5]
  local g = tostring((tonumber(f[2] or '0') or 0) + 1)
  local stamp = string.format('%.3f', t)
  redis.call('HSET', KEYS[1], 'lease', id, 'gen', g, 'holder', ARGV[4], 'since', stamp, 'beat', stamp, 'ttl', ARGV[6])
  return {1, id, g, stamp, holder}
end

if mode == 'raise' then
  -- A fence of another server raised to the caller's generation; a fence of another lease is an earlier
  -- migration's (every mover verifies its lease afterwards) and is replaced. 0: a newer generation holds it.
  local f = redis.call('HMGET', KEYS[1], 'lease', 'gen')
  if f[1] == lease and tonumber(f[2] or '0') > tonumber(gen) then return 0 end
  redis.call('HSET', KEYS[1], 'lease', lease, 'gen', gen)
  return 1
end

local ok, f = holds()
if mode == 'beat' or mode == 'release' or mode == 'drop' then
  -- 1 while the caller holds the lease (beat: its beat stamped; release: its holder cleared, the lease
  -- free for the next run at once; drop: a fence of another server deleted), else 0.
  if not ok then return 0 end
  if mode == 'beat' then
    redis.call('HSET', KEYS[1], 'beat', string.format('%.3f', now()))
  elseif mode == 'release' then
    redis.call('HSET', KEYS[1], 'holder', '', 'beat', '0')
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
end

if not ok then
  if not f[1] then return redis.error_reply('ZCFENCED absent: no fence (restarted empty, or the migration ended)') end
  return redis.error_reply('ZCFENCED held by generation ' .. tostring(f[2]) .. ' of lease ' .. tostring(f[1]))
end

if mode == 'copy' then
  -- KEYS[2..]: keys copied; ARGV[2i], ARGV[2i+1]: KEYS[i]'s ttl in ms (0: none) and DUMP payload, RESTORE
  -- REPLACE; a ttl "-" deletes the key (gone from the source). How many keys.
  for i = 2, #KEYS do
    if ARGV[2 * i] == '-' then
      redis.call('UNLINK', KEYS[i])
    else
      redis.call('RESTORE', KEYS[i], ARGV[2 * i], ARGV[2 * i + 1], 'REPLACE')
    end
  end
  return #KEYS - 1
elseif mode == 'del' then
  -- KEYS[2..]: deleted; how many existed.
  local n = 0
  for i = 2, #KEYS do n = n + redis.call('UNLINK', KEYS[i]) end
  return n
elseif mode == 'set' then
  return redis.call('SET', KEYS[2], ARGV[4])
elseif mode == 'cas' then
  -- KEYS[2] set to ARGV[5] only if it holds ARGV[4]: 1, else 0.
  if redis.call('GET', KEYS[2]) ~= ARGV[4] then return 0 end
  redis.call('SET', KEYS[2], ARGV[5])
  return 1
end
return redis.error_reply('ERR fence.lua: unknown mode ' .. tostring(mode))
