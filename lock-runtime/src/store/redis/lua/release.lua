-- KEYS: lock, tokens, writer. ARGV: token, linger ms, channel. Returns 1
-- when released (or shortened to the linger): the lock's token, or one
-- member of its sorted set of shares or permits. A caller that gives up
-- waiting takes its mark off the key. A lock's release is published when
-- a waiter marked it; a share's or permit's always.
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' then
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not ends or tonumber(ends) <= now then return 0 end
  if tonumber(ARGV[2]) > 0 then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  else
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('HDEL', KEYS[2], ARGV[1])
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now) end
  redis.call('PUBLISH', ARGV[3], '')
  return 1
end
if not holds(held, ARGV[1]) then
  if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('DEL', KEYS[3]) end
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
if held ~= ARGV[1] then redis.call('PUBLISH', ARGV[3], '') end
return 1
