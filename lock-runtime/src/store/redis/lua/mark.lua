-- KEYS: lock. After a plain attempt a waiting caller lost: marks the key
-- as waited for (`waited.lua`) if a lease holds it, and returns its PTTL.
mark_waited(KEYS[1], redis.pcall('GET', KEYS[1]))
return redis.call('PTTL', KEYS[1])
