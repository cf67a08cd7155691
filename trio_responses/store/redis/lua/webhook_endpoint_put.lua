-- ARGV: prefix, owner ('' without one), id, created_at, event types (' t1 t2 '), the
-- stored endpoint (JSON). Returns 1 (written), -1 (a new endpoint of an owner with
-- WEBHOOK_MAX_ENDPOINTS already, the operator excepted: nothing written).
local p, owner, id = ARGV[1], ARGV[2], ARGV[3]
local key = webhook_key(p, owner, id)
if redis.call('EXISTS', key) == 0 and owner ~= WEBHOOK_OPERATOR
    and redis.call('ZCARD', webhooks_key(p, owner)) >= WEBHOOK_MAX_ENDPOINTS then
  return -1
end
redis.call('HSET', key, 'types', ARGV[5], 'object', ARGV[6])
redis.call('ZADD', webhooks_key(p, owner), ARGV[4], id)
return 1
