-- ARGV: prefix, owner, id, created_at, expires_at (s), status, the object (JSON),
-- max_containers. Returns 1 (stored) or -3 (a container more would take the owner
-- past max_containers that are not expired: nothing written).
local id, created, expires, status, object = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local most = tonumber(ARGV[8])
local owner, key = F.owner, container_key(id)
local old = redis.call('HMGET', key, 'owner', 'status')
if old[1] and old[1] ~= owner then  -- another owner's of the same id (ids are random)
  drop_container(id)
  old = {false, false}
end
local was_live = old[1] ~= false and old[2] ~= 'expired'
local live = status ~= 'expired'
if live and not was_live then
  if held(owner, 'containers') + 1 > most then return -3 end
  redis.call('HINCRBY', quota_key(owner), 'containers', 1)
elseif was_live and not live then
  redis.call('HINCRBY', quota_key(owner), 'containers', -1)
end
redis.call('HSET', key, 'owner', owner, 'status', status, 'object', object)
redis.call('ZADD', containers_key(owner), created, id)
if status == 'running' then
  redis.call('ZADD', EXPIRING, expires, id)
else
  redis.call('ZREM', EXPIRING, id)
end
return 1
