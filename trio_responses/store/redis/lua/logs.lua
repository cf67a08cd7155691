-- The finished-log index: b = {index, sizes, total, retention_ms, max_streams,
-- max_bytes, prefix}, read from KEYS[k..k+2] and ARGV[a..a+3].
local function bounds(k, a)
  return {index = KEYS[k], sizes = KEYS[k + 1], total = KEYS[k + 2],
          retention_ms = tonumber(ARGV[a]), max_streams = tonumber(ARGV[a + 1]),
          max_bytes = tonumber(ARGV[a + 2]), prefix = ARGV[a + 3]}
end

-- Delete a log (gone from the index already) and its size; returns the size.
local function drop_log(b, id)
  local size = tonumber(redis.call('HGET', b.sizes, id) or '0')
  redis.call('HDEL', b.sizes, id)
  redis.call('DEL', b.prefix .. 'log:' .. id, b.prefix .. 'logmeta:' .. id)
  return size
end

-- Forget the finished logs past their retention (their TTL removed them), then
-- evict the oldest beyond the count and byte limits (the newest stays, however
-- large). Returns {forgotten, retained count, retained bytes}.
local function trim_logs(b)
  local sum = tonumber(redis.call('GET', b.total) or '0')
  local cutoff = int(now_us() - b.retention_ms * 1000)
  local stale = redis.call('ZRANGEBYSCORE', b.index, '-inf', cutoff)
  if #stale > 0 then
    redis.call('ZREMRANGEBYSCORE', b.index, '-inf', cutoff)
    for _, id in ipairs(stale) do
      sum = sum - drop_log(b, id)
    end
  end
  local count = redis.call('ZCARD', b.index)
  while count > b.max_streams or (count > 1 and sum > b.max_bytes) do
    local oldest = redis.call('ZPOPMIN', b.index)
    sum = sum - drop_log(b, oldest[1])
    count = count - 1
  end
  if sum < 0 then sum = 0 end  -- only if the index was tampered with
  redis.call('SET', b.total, int(sum))
  return {#stale, count, sum}
end

-- A log finished: index it with its bytes, then keep within the bounds.
local function retain_log(b, meta, id)
  local size = tonumber(redis.call('HGET', meta, 'bytes') or '0')
  local before = tonumber(redis.call('HGET', b.sizes, id) or '0')  -- finished twice
  redis.call('ZADD', b.index, int(now_us()), id)
  redis.call('HSET', b.sizes, id, int(size))
  redis.call('INCRBY', b.total, int(size - before))
  local kept = trim_logs(b)
  return {1, kept[2], kept[3]}
end

-- Append the terminal frame to an open log and finish it.
local function end_log(b, log, meta, id, expected, frame)
  local n = tonumber(expected)
  redis.call('XADD', log, '0-' .. tostring(n + 1), 'f', expected, 'd', frame)
  redis.call('HSET', meta, 'next', tostring(n + 1), 'done', expected)
  redis.call('HINCRBY', meta, 'bytes', int(#frame))
  redis.call('PEXPIRE', log, int(b.retention_ms))
  redis.call('PEXPIRE', meta, int(b.retention_ms))
  return retain_log(b, meta, id)
end
