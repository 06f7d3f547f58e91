-- Fair mode's queue of waiters. The queue is a list of tokens in arrival
-- order; a hash gives each queued token "deadline life" (its deadline in
-- server ms, and its fencing counter's life). `head` drops waiters whose
-- deadline passed on its way to the first live one; `grant` gives the lock
-- to that waiter for `timeout` ms (KEYS: lock, counter, queue, waiters).
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
      local deadline, life = string.match(entry, '^(%d+) (%d+)$')
      if deadline and tonumber(deadline) >= now then return first, life end
      redis.call('HDEL', waiters, first)
    end
    redis.call('LPOP', queue)
  end
end
local function grant(first, life, timeout, channel)
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], first)
  redis.call('SET', KEYS[1], first, 'PX', timeout)
  if life ~= '0' then fence(KEYS[2], life) end
  redis.call('PUBLISH', channel, first)
end
