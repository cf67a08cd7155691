-- KEYS: record, running, then the record's index (index, total, sizes, owners).
-- ARGV: id, then the index's bounds (suffix, ttl_ms, max, max_bytes, prefix)
redis.call('HDEL', KEYS[2], ARGV[1])
unindex(records(3, 2), ARGV[1])
return redis.call('DEL', KEYS[1])
