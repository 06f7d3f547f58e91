-- KEYS: lock, counter, kind, tokens. ARGV: token, ttl ms, the counter's
-- life in ms (0: no fencing), next token. Moves the caller's permit (its
-- member of the key's sorted set of holders) to the next holder in this
-- process, for a full ttl, and returns its fencing token; -1 when the
-- caller holds no live permit. The key stays as full as it was: nobody
-- waiting for a place is woken.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(ends) ~= 'string' or tonumber(ends) <= now then return -1 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local fencing = '0'
if ARGV[3] ~= '0' then fencing = fence(KEYS[2], ARGV[3], ARGV[4]) end
add_holder(KEYS[1], KEYS[4], ARGV[4], now + tonumber(ARGV[2]), fencing)
stretch(KEYS[1], KEYS[3], KEYS[4], now)
return fencing
