-- KEYS: lock, counter, writer, kind. ARGV: token, ttl ms, the counter's
-- life in ms (0: no fencing), '1' when the caller waits ('2' when it waits
-- and marked the key before). Returns {1, fencing} when acquired (the token
-- as a string of digits), {0, pttl} when held, {2, kind} when a semaphore's
-- permits hold the key (the claim rule, `Claim::meets` in the crate: a
-- mismatch, answered at once and leaving nothing behind). Run again by the same token (a
-- retry after a dropped reply), it answers as the first run did. Held by
-- shares (a sorted set), a caller that waits marks the key so that no new
-- share joins while it waits, and says so ({0, pttl, 1}); granted, a caller
-- that marked clears its mark. The share script shortens a mark it finds
-- on a free key (see there). Held by a lease, a caller that waits marks
-- the key, so that the release wakes it (`waited.lua`).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[4] == '2' then redis.call('DEL', KEYS[3]) end
  if ARGV[3] == '0' then return {1, 0} end
  return {1, fence(KEYS[2], ARGV[3], ARGV[1])}
end
local held = redis.pcall('GET', KEYS[1])
if holds(held, ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, last_token(KEYS[2])}
end
if type(held) == 'table' then
  local served = redis.call('GET', KEYS[4])
  if served and served ~= 'shared' then return {2, served} end
end
local pttl = redis.call('PTTL', KEYS[1])
if type(held) == 'table' and ARGV[4] ~= '0' then
  -- Kept while the writer keeps asking: it asks again within 5 s.
  redis.call('SET', KEYS[3], ARGV[1], 'PX', 6000)
  return {0, pttl, 1}
end
if ARGV[4] ~= '0' then mark_waited(KEYS[1], held) end
return {0, pttl}
