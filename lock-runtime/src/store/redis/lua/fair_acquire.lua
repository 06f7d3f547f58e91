-- Fair mode. KEYS: lock, counter, queue, waiters (kind, tokens). ARGV:
-- token, ttl ms, the counter's life in ms (0: no fencing), 1 if the
-- caller waits, the grant timeout in ms. Returns {1, fencing} when
-- acquired: the key was free and nobody live queued ahead, or a release
-- granted it to this token (then this claims it for the full ttl).
-- Otherwise {0, pttl}, or {0, -3} when the key is free but it is another
-- waiter's turn; a caller that waits is queued (or keeps its place), its
-- deadline moved to a grant timeout from now. Idempotent, as acquire.lua
-- is. Held by shares (a sorted set), the key is held; by a semaphore's
-- permits, the answer is {2, kind}: a mismatch (the claim rule,
-- `Claim::meets` in the crate), answered at once.
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' then
  local served = redis.call('GET', KEYS[5])
  if served and served ~= 'shared' then return {2, served} end
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, last_token(KEYS[2])}
end
if not holder then
  local first = head(KEYS[3], KEYS[4])
  if not first or first == ARGV[1] then
    if first then
      redis.call('LPOP', KEYS[3])
      redis.call('HDEL', KEYS[4], first)
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    if ARGV[3] == '0' then return {1, 0} end
    return {1, fence(KEYS[2], ARGV[3], ARGV[1])}
  end
end
if ARGV[4] == '1' then enqueue(ARGV[1], ARGV[3], tonumber(ARGV[5])) end
if not holder then return {0, -3} end
return {0, redis.call('PTTL', KEYS[1])}
