-- KEYS: lock, counter, kind, tokens, writer. ARGV: token, ttl ms, the
-- counter's life in ms (0: no fencing), the claim ('shared', or the
-- semaphore's limit). The key is then a sorted set of holders' tokens
-- scored by the server-clock millisecond their lease ends; `kind` says
-- which claim it serves, `tokens` each holder's fencing token. Returns
-- {1, fencing} when granted; {0, ms} when refused, at least that long; {2,
-- kind} when the key serves another claim. Run again by a holder's token,
-- it renews and answers as the first run did.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[2])
local held = redis.pcall('GET', KEYS[1])
if held then
  if type(held) ~= 'table' then return {0, redis.call('PTTL', KEYS[1])} end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    redis.call('HDEL', KEYS[4], unpack(gone))
  end
  local mine = redis.call('HGET', KEYS[4], ARGV[1])
  if mine and redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
    return {1, mine}
  end
  local kind = redis.call('GET', KEYS[3])
  if kind and kind ~= ARGV[4] and redis.call('ZCARD', KEYS[1]) > 0 then return {2, kind} end
end
if ARGV[4] == 'shared' then
  local writer = redis.call('PTTL', KEYS[5])
  if writer > 0 then
    -- A waiting writer's mark. On a free key the writer is on its way
    -- (woken by the last release) or was served already: it keeps the key
    -- 50 ms more at most, so a stale mark costs readers no more.
    if not held and writer > 50 then
      redis.call('PEXPIRE', KEYS[5], 50)
      writer = 50
    end
    return {0, writer}
  end
elseif redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - now}
end
local fencing = '0'
if ARGV[3] ~= '0' then fencing = fence(KEYS[2], ARGV[3]) end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], fencing)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local life = tonumber(last[2]) - now
redis.call('PEXPIRE', KEYS[1], life)
redis.call('SET', KEYS[3], ARGV[4], 'PX', life)
redis.call('PEXPIRE', KEYS[4], life)
return {1, fencing}
