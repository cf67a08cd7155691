-- ARGV: prefix, owner ('' without one), id ('' for all of the owner's). The stored
-- endpoints (JSON): the one, or all, newest first (ties: by id, descending).
local p, owner, id = ARGV[1], ARGV[2], ARGV[3]
local ids = {id}
if id == '' then ids = redis.call('ZREVRANGE', webhooks_key(p, owner), 0, -1) end
local objects = {}
for _, each in ipairs(ids) do
  local object = redis.call('HGET', webhook_key(p, owner, each), 'object')
  if object then objects[#objects + 1] = object end
end
return objects
