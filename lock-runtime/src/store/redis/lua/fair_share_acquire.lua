-- Fair mode, a share or a permit. KEYS: lock, counter, queue, waiters,
-- kind, tokens. ARGV: token, ttl ms, the counter's life in ms (0: no
-- fencing), 1 if the caller waits, the grant timeout in ms, the claim
-- ('shared', or the semaphore's limit). As share_acquire.lua, served in
-- arrival order: granted when the key has room and nobody live is queued
-- ahead (or a release granted it to this token, which then claims the
-- full ttl); otherwise a caller that waits is queued, or keeps its place.
-- Returns {1, fencing}, {0, ms} (-3: room, but another waiter's turn), or
-- {2, kind} when the key serves another claim.
local now = now_ms()
local ttl = tonumber(ARGV[2])
local held = redis.pcall('GET', KEYS[1])
local function wait()
  if ARGV[4] ~= '1' then return end
  local grant = tonumber(ARGV[5])
  local entry = string.format('%.0f', now + grant) .. ' ' .. ARGV[3] .. ' ' .. ARGV[6]
  if redis.call('HSET', KEYS[4], ARGV[1], entry) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[3], 3 * grant)
  redis.call('PEXPIRE', KEYS[4], 3 * grant)
end
if held and type(held) ~= 'table' then
  wait()
  return {0, redis.call('PTTL', KEYS[1])}
end
if held then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    redis.call('HDEL', KEYS[6], unpack(gone))
  end
  local mine = redis.call('HGET', KEYS[6], ARGV[1])
  if mine and redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    local left = tonumber(last[2]) - now
    redis.call('PEXPIRE', KEYS[1], left)
    redis.call('PEXPIRE', KEYS[5], left)
    redis.call('PEXPIRE', KEYS[6], left)
    return {1, mine}
  end
  local kind = redis.call('GET', KEYS[5])
  if kind and kind ~= ARGV[6] and redis.call('ZCARD', KEYS[1]) > 0 then return {2, kind} end
end
local limit = tonumber(ARGV[6])
local first = head(KEYS[3], KEYS[4])
local room = not limit or redis.call('ZCARD', KEYS[1]) < limit
if room and (not first or first == ARGV[1]) then
  if first then
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], first)
  end
  local fencing = '0'
  if ARGV[3] ~= '0' then fencing = fence(KEYS[2], ARGV[3]) end
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[6], ARGV[1], fencing)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local left = tonumber(last[2]) - now
  redis.call('PEXPIRE', KEYS[1], left)
  redis.call('SET', KEYS[5], ARGV[6], 'PX', left)
  redis.call('PEXPIRE', KEYS[6], left)
  return {1, fencing}
end
wait()
return {0, -3}
