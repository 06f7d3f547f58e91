-- KEYS: lock. ARGV: token, linger ms, channel. Returns 1 when the caller's
-- exclusive lease is released (or shortened to the linger), 0 when the key
-- is not its (expired, taken, or now held by shares: a `WRONGTYPE` from
-- `GET`, caught). A lease's own release: one key, no writer's mark to
-- clear (a writer clears its mark when granted).
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], '')
return 1
