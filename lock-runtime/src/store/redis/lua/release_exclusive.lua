-- KEYS: lock. ARGV: token, and a linger in ms only when there is one.
-- Returns 1 when the caller's exclusive lease is released (or shortened to
-- the linger), 0 when the key is not its (expired, taken, or now held by
-- shares: a `WRONGTYPE` from `GET`, caught). A lease's own release: one
-- key, no writer's mark to clear (a writer clears its mark when granted).
-- The release is published on the lock's `:released` channel only when a
-- waiter marked the key (see `waited.lua`). The common call, a release
-- nobody waited for, sends only the key and the token.
local held = redis.pcall('GET', KEYS[1])
local waited = false
if held ~= ARGV[1] then
  if held ~= ARGV[1] .. '~' then return 0 end
  waited = true
end
if ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
if waited then redis.call('PUBLISH', KEYS[1] .. ':released', '') end
return 1
