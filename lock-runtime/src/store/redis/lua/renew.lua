-- KEYS: lock, kind, tokens. ARGV: token, ttl ms. Returns 1 when renewed:
-- the lock's token, or one member of its sorted set of shares or permits
-- (whose kind and fencing tokens then live as long as the set).
local held = redis.pcall('GET', KEYS[1])
if holds(held, ARGV[1]) then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if type(held) ~= 'table' then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local life = tonumber(last[2]) - now
redis.call('PEXPIRE', KEYS[1], life)
redis.call('PEXPIRE', KEYS[2], life)
redis.call('PEXPIRE', KEYS[3], life)
return 1
