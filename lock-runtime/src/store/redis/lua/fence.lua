-- Issues a fencing token: the server's clock in microseconds, or one more
-- than the key's last token if that is not smaller (two grants in one
-- microsecond, a clock stepped back a little). The counter that remembers
-- the last token lives `life` ms. The clock's digits are swapped into the
-- counter by SET .. GET and compared with the old value as digit strings
-- (longer is larger; equal lengths compare by bytes).
local function fence(counter, life)
  local t = redis.call('TIME')
  local token = t[1] .. string.sub('00000' .. t[2], -6)
  local last = redis.call('SET', counter, token, 'PX', life, 'GET')
  if last and (#last > #token or (#last == #token and last >= token)) then
    token = string.format('%.0f', tonumber(last) + 1)
    redis.call('SET', counter, token, 'PX', life)
  end
  return token
end
