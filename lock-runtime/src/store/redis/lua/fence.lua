-- The counter that remembers a key's last fencing token holds its digits
-- and, after a space, the token of the lease it was issued to, so that
-- `inspect` tells the holder's own token from an earlier holder's (a
-- holder whose token is issued on demand has none until it reads one).
-- `last_token` is the digits alone ('0' for no counter).
local function last_token(counter)
  local last = redis.call('GET', counter)
  return last and string.match(last, '^%d+') or '0'
end
-- Issues a fencing token to `holder`: the server's clock in microseconds,
-- or one more than the key's last token if that is not smaller (two
-- grants in one microsecond, a clock stepped back a little). The counter
-- lives `life` ms. The clock's digits are swapped into the counter by
-- SET .. GET and compared with the old ones as digit strings (longer is
-- larger; equal lengths compare by bytes).
local function fence(counter, life, holder)
  local t = redis.call('TIME')
  local token = t[1] .. string.sub('00000' .. t[2], -6)
  local last = redis.call('SET', counter, token .. ' ' .. holder, 'PX', life, 'GET')
  last = last and string.match(last, '^%d+')
  if last and (#last > #token or (#last == #token and last >= token)) then
    token = string.format('%.0f', tonumber(last) + 1)
    redis.call('SET', counter, token .. ' ' .. holder, 'PX', life)
  end
  return token
end
