-- KEYS: record, running, then the record's index (index, total, sizes, owners).
-- ARGV: json, id, replica, size, running ('1' or ''), then the index's bounds
-- (suffix, ttl_ms, max, max_bytes, prefix), then, when the write ends a background
-- response, its webhook event (id, type, owner ('' without one), JSON, now): its
-- deliveries are written with the final state, by the first write of it only.
local x = records(3, 6)
if redis.call('ZSCORE', x.index, ARGV[2]) then
  -- A finished record is final: this is a retried write, or a replica that stalled
  -- past its lease writing over the recovery of its response.
  return 0
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', int(x.ttl_ms))
  redis.call('HDEL', KEYS[2], ARGV[2])
  finished_record(x, ARGV[2], tonumber(ARGV[4]))
  if ARGV[11] then
    enqueue(x.prefix, ARGV[13], ARGV[11], ARGV[12], ARGV[14], ARGV[15])
  end
end
return 1
