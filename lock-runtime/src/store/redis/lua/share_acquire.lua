-- KEYS: lock, counter, kind, tokens, writer. ARGV: token, ttl ms, the
-- counter's life in ms (0: no fencing), the claim ('shared', or the
-- semaphore's limit). The key is then a sorted set of holders' tokens
-- scored by the server-clock millisecond their lease ends; `kind` says
-- which claim it serves, `tokens` each holder's fencing token. Returns
-- {1, fencing} when granted; {0, ms} when refused, at least that long; {2,
-- kind} when the key serves another claim (the claim rule, `Claim::meets`
-- in the crate; kind '1' for a mutex or writer). Run again by a holder's
-- token, it renews and answers as the first run did.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[2])
local held = redis.pcall('GET', KEYS[1])
if held then
  if type(held) ~= 'table' then
    -- Held by a mutex or writer: a share waits, a permit is a mismatch.
    if ARGV[4] ~= 'shared' then return {2, '1'} end
    -- Its release must wake this claim's waiter.
    mark_waited(KEYS[1], held)
    return {0, redis.call('PTTL', KEYS[1])}
  end
  local answer = held_already(KEYS[1], KEYS[3], KEYS[4], ARGV[1], now, ttl, ARGV[4])
  if answer then return answer end
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
if ARGV[3] ~= '0' then fencing = fence(KEYS[2], ARGV[3], ARGV[1]) end
add_holder(KEYS[1], KEYS[4], ARGV[1], now + ttl, fencing)
stretch(KEYS[1], KEYS[3], KEYS[4], now, ARGV[4])
return {1, fencing}
