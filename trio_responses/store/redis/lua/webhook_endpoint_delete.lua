-- ARGV: prefix, owner ('' without one), id. Removes the endpoint and its pending
-- deliveries; returns 1, or 0 if the owner has no such endpoint.
local p, owner, id = ARGV[1], ARGV[2], ARGV[3]
local key = webhook_key(p, owner, id)
if redis.call('EXISTS', key) == 0 then return 0 end
local pending = webhook_pending_key(p, owner, id)
for _, member in ipairs(redis.call('SMEMBERS', pending)) do
  drop_delivery(p, member)
end
redis.call('DEL', key, pending)
redis.call('ZREM', webhooks_key(p, owner), id)
return 1
