-- ARGV[7]: the conversation object (JSON); ARGV[8..]: items (id, json pairs)
local c = conv()
local old = redis.call('HGET', c.meta, 'owner')
if old then
  for _, item in ipairs(redis.call('LRANGE', c.ids, 0, -1)) do
    unindex_item(c.prefix, old, item, 'c:' .. c.id)
  end
end
redis.call('DEL', c.meta, c.ids, c.items)
redis.call('HSET', c.meta, 'owner', c.owner, 'object', ARGV[7], 'bytes', int(#ARGV[7]))
add(c, 8)
used(c)
return 1
