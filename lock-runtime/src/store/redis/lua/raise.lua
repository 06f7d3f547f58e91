-- KEYS: counter. ARGV: floor, life ms. Raises the counter to at least the
-- floor, for at least `life` (Redlock: every node learns the token just
-- handed out).
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local life = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
redis.call('SET', KEYS[1], string.format('%.0f', math.max(current, tonumber(ARGV[1]))), 'PX', life)
return 1
