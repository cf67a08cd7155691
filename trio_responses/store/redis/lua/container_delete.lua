-- ARGV: prefix, owner, id. 1 if the owner's container (and its files) was deleted.
local id = ARGV[3]
if redis.call('HGET', container_key(id), 'owner') ~= F.owner then return 0 end
return drop_container(id)
