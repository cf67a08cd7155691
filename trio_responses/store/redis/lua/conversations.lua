-- One conversation and its tenant's index: c = {meta, ids, items, index, total, sizes,
-- id, owner, ttl_ms, max, max_bytes, prefix}, from KEYS[1..6] and ARGV[1..6].
local function conv()
  return {meta = KEYS[1], ids = KEYS[2], items = KEYS[3], index = KEYS[4], total = KEYS[5],
          sizes = KEYS[6], id = ARGV[1], owner = ARGV[2], ttl_ms = tonumber(ARGV[3]),
          max = tonumber(ARGV[4]), max_bytes = tonumber(ARGV[5]), prefix = ARGV[6]}
end

local function mine(c)  -- the conversation exists and is the caller's
  local owner = redis.call('HGET', c.meta, 'owner')
  return owner and owner == c.owner
end

-- The conversation was used: refresh its TTLs and its place in the index, forget the
-- members the TTL removed, evict the least recently used beyond the bounds (never it).
local function used(c)
  local now = now_us()
  forget_stale(c.index, c.total, c.sizes, int(now - c.ttl_ms * 1000))
  local size = tonumber(redis.call('HGET', c.meta, 'bytes') or '0')
  local before = tonumber(redis.call('HGET', c.sizes, c.id) or '0')
  redis.call('ZADD', c.index, int(now), c.id)
  redis.call('HSET', c.sizes, c.id, int(size))
  local sum = tonumber(redis.call('INCRBY', c.total, int(size - before)))
  for _, key in ipairs({c.meta, c.ids, c.items}) do
    redis.call('PEXPIRE', key, int(c.ttl_ms))
  end
  local count = redis.call('ZCARD', c.index)
  while count > c.max or (count > 1 and sum > c.max_bytes) do
    local oldest = redis.call('ZRANGE', c.index, 0, 0)[1]
    if oldest == c.id then break end
    redis.call('ZREM', c.index, oldest)
    sum = sum - tonumber(redis.call('HGET', c.sizes, oldest) or '0')
    redis.call('HDEL', c.sizes, oldest)
    local key = c.prefix .. 'conversation:' .. oldest
    local owner = redis.call('HGET', key, 'owner')
    if owner then
      for _, item in ipairs(redis.call('LRANGE', key .. ':ids', 0, -1)) do
        unindex_item(c.prefix, owner, item, 'c:' .. oldest)
      end
    end
    redis.call('DEL', key, key .. ':ids', key .. ':items')
    count = count - 1
  end
  if sum < 0 then sum = 0 end
  redis.call('SET', c.total, int(sum))
end

-- Append items (ARGV[from..]: id, json pairs) not held yet; returns their ids.
local function add(c, from)
  local added = {}
  for i = from, #ARGV, 2 do
    if redis.call('HSETNX', c.items, ARGV[i], ARGV[i + 1]) == 1 then
      redis.call('RPUSH', c.ids, ARGV[i])
      redis.call('HINCRBY', c.meta, 'bytes', #ARGV[i + 1])
      index_item(c.prefix, c.owner, ARGV[i], 'c:' .. c.id, int(c.ttl_ms))
      added[#added + 1] = ARGV[i]
    end
  end
  return added
end
