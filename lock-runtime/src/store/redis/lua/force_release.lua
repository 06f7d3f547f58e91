-- KEYS: lock, writer. ARGV: channel. Deletes the lock whoever holds it
-- (every share or permit of a sorted set), and a waiting writer's mark,
-- and wakes waiters; returns 1 when there was one.
redis.call('DEL', KEYS[2])
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[1], '')
return 1
