local c = conv()
if not mine(c) then return 0 end
for _, item in ipairs(redis.call('LRANGE', c.ids, 0, -1)) do
  unindex_item(c.prefix, c.owner, item, 'c:' .. c.id)
end
redis.call('DEL', c.meta, c.ids, c.items)
if redis.call('ZREM', c.index, c.id) == 1 then
  redis.call('DECRBY', c.total, int(tonumber(redis.call('HGET', c.sizes, c.id) or '0')))
  redis.call('HDEL', c.sizes, c.id)
end
return 1
