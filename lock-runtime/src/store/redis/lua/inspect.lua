-- KEYS: lock, counter, kind, tokens. Returns {token, pttl, fencing token,
-- kind, holders}: the lock's holder, or for a sorted set of shares or
-- permits the one whose lease ends first; an empty token when the lock is
-- free. The fencing token is the holder's: '0' while a holder whose token
-- is issued on demand has not read one (the counter names an earlier
-- holder, see `fence.lua`). Reads only.
local held = redis.pcall('GET', KEYS[1])
if not held then return {'', -2, '0', '', 0} end
if type(held) ~= 'table' then
  -- A waiter's mark (see `waited.lua`) is not part of the token.
  if string.byte(held, -1) == 126 then held = string.sub(held, 1, -2) end -- '~'
  local fencing, by = string.match(redis.call('GET', KEYS[2]) or '', '^(%d+) (.*)$')
  if by ~= held then fencing = '0' end
  return {held, redis.call('PTTL', KEYS[1]), fencing, '', 1}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
if #live == 0 then return {'', -2, '0', '', 0} end
local fencing = redis.call('HGET', KEYS[4], live[1]) or '0'
return {live[1], tonumber(live[2]) - now, fencing, redis.call('GET', KEYS[3]) or '', #live / 2}
