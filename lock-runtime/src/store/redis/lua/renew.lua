-- KEYS: lock. ARGV: token, ttl ms. Returns 1 when renewed.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
