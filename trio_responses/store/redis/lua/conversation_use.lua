-- ARGV[7]: what ('get', 'items', 'item', 'update', 'add', 'delete_item', 'lock'), then
-- its arguments. Returns false for an unknown conversation (or someone else's).
local c = conv()
if not mine(c) then return false end
local what = ARGV[7]
local reply = 1
if what == 'get' then
  reply = redis.call('HGET', c.meta, 'object')
elseif what == 'items' then
  local ids = redis.call('LRANGE', c.ids, 0, -1)
  reply = {}
  if #ids > 0 then reply = redis.call('HMGET', c.items, unpack(ids)) end
elseif what == 'item' then
  reply = redis.call('HGET', c.items, ARGV[8]) or ''
elseif what == 'update' then  -- ARGV[8]: the new object
  local old = redis.call('HGET', c.meta, 'object')
  redis.call('HSET', c.meta, 'object', ARGV[8])
  redis.call('HINCRBY', c.meta, 'bytes', #ARGV[8] - #old)
elseif what == 'add' then
  -- ARGV[8]: most items, ARGV[9]: most bytes ('' none), ARGV[10..]: id, json pairs
  local new, grown, seen = 0, 0, {}
  for i = 10, #ARGV, 2 do
    if not seen[ARGV[i]] and redis.call('HEXISTS', c.items, ARGV[i]) == 0 then
      seen[ARGV[i]] = true
      new = new + 1
      grown = grown + #ARGV[i + 1]
    end
  end
  local held = redis.call('LLEN', c.ids)
  if ARGV[8] ~= '' and held + new > tonumber(ARGV[8]) then return {-1, held} end
  local size = tonumber(redis.call('HGET', c.meta, 'bytes') or '0')
  if ARGV[9] ~= '' and size + grown > tonumber(ARGV[9]) then return {-2, held, size} end
  reply = add(c, 10)
  table.insert(reply, 1, 1)
elseif what == 'delete_item' then
  local item = redis.call('HGET', c.items, ARGV[8])
  if not item then
    reply = 0
  else
    redis.call('HDEL', c.items, ARGV[8])
    redis.call('LREM', c.ids, 0, ARGV[8])
    redis.call('HINCRBY', c.meta, 'bytes', -#item)
    unindex_item(c.prefix, c.owner, ARGV[8], 'c:' .. c.id)
  end
elseif what == 'lock' then  -- ARGV[8]: holder, ARGV[9]: lease in ms
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local holder = redis.call('HGET', c.meta, 'holder')
  local until_ms = tonumber(redis.call('HGET', c.meta, 'lock_until') or '0')
  if holder and holder ~= ARGV[8] and until_ms > now then
    reply = 0
  else
    redis.call('HSET', c.meta, 'holder', ARGV[8], 'lock_until', int(now + tonumber(ARGV[9])))
  end
end
used(c)
return reply
