-- KEYS: counter. ARGV: floor, life ms, holder. Raises the counter to at
-- least the floor, issued to `holder`, for at least `life` (Redlock: every
-- node learns the token just handed out). A counter at or above the floor
-- is left as it is, its life stretched.
local last = redis.call('GET', KEYS[1])
local current = tonumber(last and string.match(last, '^%d+') or '0')
local life = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
if current < tonumber(ARGV[1]) then
  last = ARGV[1] .. ' ' .. ARGV[3]
end
redis.call('SET', KEYS[1], last, 'PX', life)
return 1
