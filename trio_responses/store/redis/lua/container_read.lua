-- ARGV: prefix, owner, 'one' and a container id, or 'all'. {status, object} of the
-- container (or of each of the owner's, oldest first); nothing for another owner's.
local ids = {ARGV[4]}
if ARGV[3] == 'all' then ids = redis.call('ZRANGE', containers_key(F.owner), 0, -1) end
local found = {}
for _, each in ipairs(ids) do
  local c = redis.call('HMGET', container_key(each), 'owner', 'status', 'object')
  if c[1] == F.owner then
    found[#found + 1] = c[2]
    found[#found + 1] = c[3]
  end
end
return found
