-- Fair mode, a share or a permit. KEYS: lock, counter, queue, waiters,
-- kind, tokens. ARGV: token, ttl ms, the counter's life in ms (0: no
-- fencing), 1 if the caller waits, the grant timeout in ms, the claim
-- ('shared', or the semaphore's limit). As share_acquire.lua, served in
-- arrival order: granted when the key has room and nobody live is queued
-- ahead (or a release granted it to this token, which then claims the
-- full ttl); otherwise a caller that waits is queued, or keeps its place.
-- Returns {1, fencing}, {0, ms} (-3: room, but another waiter's turn), or
-- {2, kind} when the key serves another claim (the claim rule,
-- `Claim::meets` in the crate; kind '1' for a mutex or writer).
local now = now_ms()
local ttl = tonumber(ARGV[2])
local held = redis.pcall('GET', KEYS[1])
local function wait()
  if ARGV[4] == '1' then enqueue(ARGV[1], ARGV[3] .. ' ' .. ARGV[6], tonumber(ARGV[5])) end
end
if held and type(held) ~= 'table' then
  if ARGV[6] ~= 'shared' then return {2, '1'} end
  wait()
  return {0, redis.call('PTTL', KEYS[1])}
end
if held then
  local answer = held_already(KEYS[1], KEYS[5], KEYS[6], ARGV[1], now, ttl, ARGV[6])
  if answer then return answer end
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
  if ARGV[3] ~= '0' then fencing = fence(KEYS[2], ARGV[3], ARGV[1]) end
  add_holder(KEYS[1], KEYS[6], ARGV[1], now + ttl, fencing)
  stretch(KEYS[1], KEYS[5], KEYS[6], now, ARGV[6])
  return {1, fencing}
end
wait()
return {0, -3}
