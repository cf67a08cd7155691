-- Webhook endpoints and the outbox of their deliveries. Keys are named from the
-- key prefix p; an owner is '' without one (WEBHOOK_OPERATOR: the operator's).
-- A delivery is named by its member, '{event id}:{endpoint id}'.
local function webhook_key(p, owner, id)  -- hash: types (' t1 t2 '), object (JSON)
  return p .. 'webhook-endpoint:' .. owner .. ':' .. id
end
local function webhook_pending_key(p, owner, id)  -- set: its pending deliveries
  return webhook_key(p, owner, id) .. ':pending'
end
local function webhooks_key(p, owner)  -- zset: the owner's endpoint ids by created_at
  return p .. 'webhook-endpoints:' .. owner
end
local function delivery_key(p, member) return p .. 'webhook-delivery:' .. member end
local function deliveries_due(p) return p .. 'webhook-due' end
local function deliveries_updated(p) return p .. 'webhook-deliveries' end
local function deliveries_settled(p) return p .. 'webhook-settled' end

-- Write an event's deliveries: one per endpoint of its owner and of the operator
-- that subscribes to its type, due now; one that exists already is kept.
local function enqueue(p, owner, event_id, event_type, event, now)
  local owners = {owner}
  if owner ~= WEBHOOK_OPERATOR then owners[2] = WEBHOOK_OPERATOR end
  for _, o in ipairs(owners) do
    for _, id in ipairs(redis.call('ZRANGE', webhooks_key(p, o), 0, -1)) do
      local types = redis.call('HGET', webhook_key(p, o, id), 'types')
      if types and string.find(types, ' ' .. event_type .. ' ', 1, true) then
        local member = event_id .. ':' .. id
        local key = delivery_key(p, member)
        if redis.call('EXISTS', key) == 0 then
          redis.call('HSET', key, 'event', event, 'endpoint', id, 'endpoint_owner', o,
            'status', 'pending', 'attempts', '0', 'next_attempt_at', now, 'updated_at', now)
          redis.call('ZADD', deliveries_due(p), now, member)
          redis.call('ZADD', deliveries_updated(p), now, member)
          redis.call('SADD', webhook_pending_key(p, o, id), member)
        end
      end
    end
  end
end

local function drop_delivery(p, member)  -- a delivery and its places in the indexes
  redis.call('DEL', delivery_key(p, member))
  redis.call('ZREM', deliveries_due(p), member)
  redis.call('ZREM', deliveries_updated(p), member)
  redis.call('ZREM', deliveries_settled(p), member)
end

-- Drop the oldest settled deliveries beyond WEBHOOK_MAX_SETTLED; returns how many.
local function bound_settled(p)
  local extra = redis.call('ZCARD', deliveries_settled(p)) - WEBHOOK_MAX_SETTLED
  if extra <= 0 then return 0 end
  for _, member in ipairs(redis.call('ZRANGE', deliveries_settled(p), 0, extra - 1)) do
    drop_delivery(p, member)
  end
  return extra
end
