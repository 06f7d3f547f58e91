-- KEYS: lock, counter. ARGV: token, ttl ms, the counter's life in ms
-- (0: no fencing), next token. Moves the lease to the next holder in this
-- process (its token, a full ttl) and returns its fencing token; -1 when
-- the lease is not the caller's.
local held = redis.call('GET', KEYS[1])
if not holds(held, ARGV[1]) then return -1 end
-- A waiter's mark stays: the next holder's release wakes it.
local next = ARGV[4]
if held ~= ARGV[1] then next = next .. '~' end
redis.call('SET', KEYS[1], next, 'PX', ARGV[2])
if ARGV[3] == '0' then return 0 end
return fence(KEYS[2], ARGV[3], ARGV[4])
