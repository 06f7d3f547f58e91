-- Fair mode. KEYS: lock, counter, queue, waiters, kind, tokens. ARGV:
-- token, ttl ms, the counter's life in ms (0: no fencing), next token,
-- channel, grant timeout ms. As hand_over.lua while nobody is queued in
-- the store; -2 when a live waiter is, after releasing the lock to the
-- waiters at the head as fair_release.lua does.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if head(KEYS[3], KEYS[4]) then
  redis.call('DEL', KEYS[1])
  grant_heads(ARGV[6], ARGV[5])
  return -2
end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
if ARGV[3] == '0' then return 0 end
return fence(KEYS[2], ARGV[3], ARGV[4])
