-- ARGV: prefix, owner, id. 1 if the owner's file was deleted, 0 if there was none.
local id = ARGV[3]
if redis.call('HGET', file_key(id), 'owner') ~= F.owner then return 0 end
return drop_file(id)
