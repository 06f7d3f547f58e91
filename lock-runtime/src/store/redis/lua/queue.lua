-- Fair mode's queue of waiters. The queue is a list of tokens in arrival
-- order; a hash gives each queued token "deadline life [claim]" (its
-- deadline in server ms, its fencing counter's life, and for a share or a
-- permit its claim: 'shared' or the semaphore's limit). `head` drops
-- waiters whose deadline passed on its way to the first live one; `grant`
-- gives the lock to that waiter for `timeout` ms, and `grant_heads` gives
-- what a release freed to the waiters at the head (KEYS: lock, counter,
-- queue, waiters, kind, tokens).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function head(queue, waiters)
  local now
  while true do
    local first = redis.call('LINDEX', queue, 0)
    if not first then return nil end
    now = now or now_ms()
    local entry = redis.call('HGET', waiters, first)
    if entry then
      local deadline, life, claim = string.match(entry, '^(%d+) (%d+) ?(%S*)$')
      if deadline and tonumber(deadline) >= now then return first, life, claim end
      redis.call('HDEL', waiters, first)
    end
    redis.call('LPOP', queue)
  end
end
-- Queues `token` (or keeps its place) with its entry's rest (`life`, or
-- `life claim`), its deadline `grant` ms from now.
local function enqueue(token, rest, grant)
  local entry = string.format('%.0f', now_ms() + grant) .. ' ' .. rest
  if redis.call('HSET', KEYS[4], token, entry) == 1 then
    redis.call('RPUSH', KEYS[3], token)
  end
  redis.call('PEXPIRE', KEYS[3], 3 * grant)
  redis.call('PEXPIRE', KEYS[4], 3 * grant)
end
local function grant(first, life, timeout, channel)
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], first)
  redis.call('SET', KEYS[1], first, 'PX', timeout)
  if life ~= '0' then fence(KEYS[2], life, first) end
  redis.call('PUBLISH', channel, first)
end
-- After a release: the free key to an exclusive waiter at the head, or
-- the run of waiters of one share claim at the head (up to a semaphore's
-- limit) added to the key's holders. Each granted token holds for
-- `timeout` ms and gets the channel's message; its next attempt claims
-- the full ttl. Returns whether anyone was granted.
local function grant_heads(timeout, channel)
  local first, life, claim = head(KEYS[3], KEYS[4])
  if not first then return false end
  local held = redis.call('TYPE', KEYS[1]).ok
  if claim == '' then
    if held ~= 'none' then return false end
    grant(first, life, timeout, channel)
    return true
  end
  if held ~= 'none' and held ~= 'zset' then return false end
  local now = now_ms()
  local limit = tonumber(claim)
  local granted = false
  while first do
    if limit and redis.call('ZCARD', KEYS[1]) >= limit then break end
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], first)
    local fencing = '0'
    if life ~= '0' then fencing = fence(KEYS[2], life, first) end
    add_holder(KEYS[1], KEYS[6], first, now + tonumber(timeout), fencing)
    redis.call('PUBLISH', channel, first)
    granted = true
    local next_claim
    first, life, next_claim = head(KEYS[3], KEYS[4])
    if next_claim ~= claim then break end
  end
  if granted then stretch(KEYS[1], KEYS[5], KEYS[6], now, claim) end
  return granted
end
