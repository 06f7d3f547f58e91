-- KEYS: lock. ARGV: token, linger ms, channel. Returns 1 when released (or
-- shortened to the linger).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], '')
return 1
