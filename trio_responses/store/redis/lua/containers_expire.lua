-- ARGV: prefix, '' (no owner), now (s). Flips every running container whose expiry is
-- before now to 'expired' and deletes its files, in one step: a container leaves the
-- expiring index here, so only one call (one replica) ever returns it. Returns
-- {owner, object} of each (the object as stored before: the caller sets its status).
local now = ARGV[3]
local found = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', EXPIRING, '-inf', '(' .. now)) do
  redis.call('ZREM', EXPIRING, id)
  local key = container_key(id)
  local c = redis.call('HMGET', key, 'owner', 'status', 'object')
  if c[1] and c[2] == 'running' then
    redis.call('HSET', key, 'status', 'expired')
    redis.call('HINCRBY', quota_key(c[1]), 'containers', -1)
    drop_files_of(id)
    found[#found + 1] = c[1]
    found[#found + 1] = c[3]
  end
end
return found
