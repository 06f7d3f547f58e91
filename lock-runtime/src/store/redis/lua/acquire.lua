-- KEYS: lock, counter. ARGV: token, ttl ms, the counter's life in ms
-- (0: no fencing). Returns {1, fencing} when acquired (the token as a
-- string of digits), {0, pttl} when held. Run again by the same token (a
-- retry after a dropped reply), it answers as the first run did.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '0' then return {1, 0} end
  return {1, fence(KEYS[2], ARGV[3])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('GET', KEYS[2]) or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
