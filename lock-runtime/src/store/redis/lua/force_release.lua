-- KEYS: lock. ARGV: channel. Deletes the lock whoever holds it and wakes
-- waiters; returns 1 when there was one.
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[1], '')
return 1
