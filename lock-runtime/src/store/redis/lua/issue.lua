-- KEYS: lock, counter. ARGV: token, the counter's life in ms. Issues the
-- fencing token of the lease `token` holds on `lock` (marked by a waiter
-- or not), as `fence` does at a grant: on demand, the first time the
-- holder reads it. Returns the token as a string of digits, or nil when
-- the key is not the caller's (expired, taken, or held by shares: a
-- `WRONGTYPE` from `GET`, caught), so a holder that lost the key gets no
-- token.
local held = redis.pcall('GET', KEYS[1])
if not holds(held, ARGV[1]) then return false end
return fence(KEYS[2], ARGV[2], ARGV[1])
