-- ARGV: prefix, owner, id, what ('object' or 'bytes'). The owner's file's object or
-- bytes; nil when there is none (for this owner).
local id, what = ARGV[3], ARGV[4]
local f = redis.call('HMGET', file_key(id), 'owner', 'object')
if f[1] ~= F.owner then return false end
if what == 'object' then return f[2] end
return redis.call('GET', content_key(id))
