-- Shares and permits. A key they hold is a sorted set of the holders'
-- tokens scored by the server-clock millisecond their lease ends, beside
-- `kind` (the claim it serves: 'shared', or the semaphore's limit) and
-- `tokens` (each holder's fencing token); these helpers take the three.
local function drop_expired(lock, tokens, now)
  local gone = redis.call('ZRANGEBYSCORE', lock, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', lock, '-inf', now)
    redis.call('HDEL', tokens, unpack(gone))
  end
end
-- The three keys live as long as the last holder; `claim`, when given, is
-- written as the key's kind.
local function stretch(lock, kind, tokens, now, claim)
  local last = redis.call('ZRANGE', lock, -1, -1, 'WITHSCORES')
  local left = tonumber(last[2]) - now
  redis.call('PEXPIRE', lock, left)
  if claim then
    redis.call('SET', kind, claim, 'PX', left)
  else
    redis.call('PEXPIRE', kind, left)
  end
  redis.call('PEXPIRE', tokens, left)
end
-- `token` holds the key until `ends`, with `fencing`.
local function add_holder(lock, tokens, token, ends, fencing)
  redis.call('ZADD', lock, ends, token)
  redis.call('HSET', tokens, token, fencing)
end
-- On a key held by shares or permits, expired holders dropped first:
-- {1, fencing} when `token` holds it already (an attempt run again), its
-- lease renewed to `ttl`; {2, kind} when the key serves another claim
-- than `claim`; nil otherwise.
local function held_already(lock, kind, tokens, token, now, ttl, claim)
  drop_expired(lock, tokens, now)
  local mine = redis.call('HGET', tokens, token)
  if mine and redis.call('ZSCORE', lock, token) then
    redis.call('ZADD', lock, now + ttl, token)
    stretch(lock, kind, tokens, now)
    return {1, mine}
  end
  local served = redis.call('GET', kind)
  if served and served ~= claim and redis.call('ZCARD', lock) > 0 then return {2, served} end
  return nil
end
