-- Fair mode. KEYS: lock, counter, queue, waiters, kind, tokens. ARGV:
-- token, linger ms, channel, grant timeout ms. Returns 1 when released (or
-- shortened to the linger): the lock's token, or one member of its sorted
-- set of shares or permits. A release grants what it freed to the live
-- waiters at the queue's head (see `grant_heads`); with nobody queued, the
-- channel gets an empty message. Called by a token that does not hold the
-- key (a waiter giving up), it takes the token out of the queue.
local function leave()
  if redis.call('HDEL', KEYS[4], ARGV[1]) == 1 then
    redis.call('LREM', KEYS[3], 1, ARGV[1])
  end
  return 0
end
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' then
  local now = now_ms()
  local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not ends or tonumber(ends) <= now then return leave() end
  if tonumber(ARGV[2]) > 0 then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  else
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('HDEL', KEYS[6], ARGV[1])
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now) end
  if tonumber(ARGV[2]) == 0 and not grant_heads(ARGV[4], ARGV[3]) then
    redis.call('PUBLISH', ARGV[3], '')
  end
  return 1
end
if held ~= ARGV[1] then return leave() end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
if not grant_heads(ARGV[4], ARGV[3]) then
  redis.call('PUBLISH', ARGV[3], '')
end
return 1
