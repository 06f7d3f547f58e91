-- A key held by one lease is the holder's token; a waiter refused by it
-- appends '~' (once), and the holder's release then publishes on the
-- key's channel. A release nobody waits for publishes nothing, as a plain
-- lock's. `mark_waited` marks `lock` if a lease (a string) holds it;
-- `holds` says whether `held` (a `GET`'s answer) is `token`'s, marked or
-- not.
local function mark_waited(lock, held)
  if type(held) == 'string' and string.byte(held, -1) ~= 126 then -- '~'
    redis.call('APPEND', lock, '~')
  end
end
local function holds(held, token)
  return held == token or held == token .. '~'
end
