-- Fair mode. KEYS: lock, counter, queue, waiters. ARGV: token, linger ms,
-- channel, grant timeout ms. Returns 1 when released (or shortened to the
-- linger). A release grants the lock to the first live waiter: the key
-- becomes its token's for the grant timeout (the waiter's next attempt
-- claims it for its ttl), its fencing token is issued now, and the channel
-- gets the granted token. Called by a token that does not hold the key (a
-- waiter giving up), it takes the token out of the queue.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('HDEL', KEYS[4], ARGV[1]) == 1 then
    redis.call('LREM', KEYS[3], 1, ARGV[1])
  end
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local first, life = head(KEYS[3], KEYS[4])
if not first then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], '')
  return 1
end
grant(first, life, ARGV[4], ARGV[3])
return 1
