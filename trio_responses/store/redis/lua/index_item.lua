-- Index item `id` of `owner` as held by `source` (now), keeping the newest sources.
local function index_item(prefix, owner, id, source, ttl_ms)
  local key = prefix .. 'item:' .. owner .. ':' .. id
  local t = redis.call('TIME')
  redis.call('ZADD', key, tonumber(t[1]) * 1000000 + tonumber(t[2]), source)
  redis.call('ZREMRANGEBYRANK', key, 0, -(ITEM_SOURCES + 1))
  redis.call('PEXPIRE', key, ttl_ms)
end

-- Forget that `source` holds item `id` of `owner`.
local function unindex_item(prefix, owner, id, source)
  redis.call('ZREM', prefix .. 'item:' .. owner .. ':' .. id, source)
end
