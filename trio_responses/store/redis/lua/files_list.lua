-- ARGV: prefix, owner, container ('' for the owner's /v1/files files). The objects
-- (JSON) of the files, oldest first (ties by id: the zset's order).
local container = ARGV[3]
if container ~= '' and redis.call('HGET', container_key(container), 'owner') ~= F.owner then
  return {}
end
local objects = {}
for _, id in ipairs(redis.call('ZRANGE', list_key(F.owner, container), 0, -1)) do
  local object = redis.call('HGET', file_key(id), 'object')
  if object then objects[#objects + 1] = object end
end
return objects
