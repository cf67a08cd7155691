-- ARGV: prefix, member, replica, status, next_attempt_at, updated_at, attempts, then the
-- attempt's optional fields as name, value pairs (last_error, status_code: those it
-- has). Writes the delivery's new state and releases its lease; returns 1, or 0
-- (nothing written) unless it is pending and leased to the replica.
local p, member, replica, status = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local key = delivery_key(p, member)
local held = redis.call('HMGET', key, 'status', 'leased_by', 'endpoint_owner', 'endpoint')
if held[1] ~= 'pending' or held[2] ~= replica then return 0 end
redis.call('HDEL', key, 'last_error', 'status_code', 'leased_by', 'lease_until')
redis.call(
  'HSET', key, 'status', status, 'next_attempt_at', ARGV[5], 'updated_at', ARGV[6],
  'attempts', ARGV[7]
)
for i = 8, #ARGV - 1, 2 do
  redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
redis.call('ZADD', deliveries_updated(p), ARGV[6], member)
if status == 'pending' then
  redis.call('ZADD', deliveries_due(p), ARGV[5], member)
else
  redis.call('ZREM', deliveries_due(p), member)
  redis.call('SREM', webhook_pending_key(p, held[3], held[4]), member)
  redis.call('ZADD', deliveries_settled(p), ARGV[6], member)
  bound_settled(p)
end
return 1
