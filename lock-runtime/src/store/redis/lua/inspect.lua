-- KEYS: lock, counter. Returns {token, pttl, last fencing token}; an empty
-- token when the lock is free. Reads only.
local token = redis.call('GET', KEYS[1])
if not token then return {'', -2, '0'} end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0'}
