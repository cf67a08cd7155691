-- KEYS: log, meta. Returns {owner, next, done, first sequence number of the oldest entry}
-- (the oldest entry is read here, not sent: it may be large).
local meta = redis.call('HMGET', KEYS[2], 'owner', 'next', 'done')
local head = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
return {meta[1], meta[2], meta[3], head and field(head[2], 'f') or false}
