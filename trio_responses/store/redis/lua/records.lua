-- One index of finished records: x = {index, total, sizes, owners, suffix, ttl_ms,
-- max, max_bytes, prefix}, read from KEYS[k..k+3] and ARGV[a..a+4].
local function records(k, a)
  return {index = KEYS[k], total = KEYS[k + 1], sizes = KEYS[k + 2], owners = KEYS[k + 3],
          suffix = ARGV[a], ttl_ms = tonumber(ARGV[a + 1]), max = tonumber(ARGV[a + 2]),
          max_bytes = tonumber(ARGV[a + 3]), prefix = ARGV[a + 4]}
end

-- Forget the members of an index whose record its TTL removed (finished before
-- cutoff); returns how many.
local function forget_stale(index, total, sizes, cutoff)
  local stale = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff)
  if #stale == 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', index, '-inf', cutoff)
  local size = 0
  for _, id in ipairs(stale) do
    size = size + tonumber(redis.call('HGET', sizes, id) or '0')
    redis.call('HDEL', sizes, id)
  end
  redis.call('DECRBY', total, int(size))
  return #stale
end

-- Take a member out of an index (the record is deleted or running again).
local function unindex(x, id)
  if redis.call('ZREM', x.index, id) == 1 then
    redis.call('DECRBY', x.total, int(tonumber(redis.call('HGET', x.sizes, id) or '0')))
    redis.call('HDEL', x.sizes, id)
  end
end

-- A record finished: index it with its size, forget members its TTL removed, and
-- evict the oldest finished records of the index beyond its count and byte share;
-- the newest stays, however large (running records are not in the index).
local function finished_record(x, id, size)
  local now = now_us()
  forget_stale(x.index, x.total, x.sizes, int(now - x.ttl_ms * 1000))
  unindex(x, id)
  redis.call('ZADD', x.index, int(now), id)
  redis.call('HSET', x.sizes, id, int(size))
  local count = redis.call('ZCARD', x.index)
  local sum = tonumber(redis.call('INCRBY', x.total, int(size)))
  while count > x.max or (count > 1 and sum > x.max_bytes) do
    local oldest = redis.call('ZPOPMIN', x.index)[1]
    sum = sum - tonumber(redis.call('HGET', x.sizes, oldest) or '0')
    count = count - 1
    redis.call('HDEL', x.sizes, oldest)
    redis.call('DEL', x.prefix .. 'response:' .. oldest)
  end
  if sum < 0 then sum = 0 end  -- only if the index was tampered with
  redis.call('SET', x.total, int(sum))
  if x.suffix ~= '' then
    redis.call('SADD', x.owners, x.suffix)
  end
end
