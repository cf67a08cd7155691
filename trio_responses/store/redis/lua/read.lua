-- Every frame ends with a blank line and holds no other (SSE framing, compact JSON).
local function frame_end(data, from)  -- the last byte of the frame at `from`
  local at = string.find(data, '\n\n', from, true)
  if not at then error('a damaged event log entry') end
  return at + 1
end

-- KEYS: log, meta. ARGV: wanted (cursor + 1), budget (bytes), most entries.
-- Returns {done, meta exists (1/0), id, fields, id, fields, ...}: the frames from
-- `wanted` on, as stream entries, while within the budget (at least one frame).
-- An entry is cut to what is handed out (the frames after the cursor, those that
-- fit the budget) into one of the same form: fields f and d, id 0-{next}.
local meta = redis.call('HMGET', KEYS[2], 'owner', 'done')
local reply = {meta[2], meta[1] and 1 or 0}
local wanted, budget, left = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local start, size, largest = '(0-' .. ARGV[1], 0, 0
while left > 0 do
  -- One entry first (it may be large); then as many as the largest so far says fit.
  local count = 1
  if largest > 0 then
    count = math.max(1, math.min(left, math.floor((budget - size) / largest)))
  end
  local entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', int(count))
  for _, entry in ipairs(entries) do
    local id, fields = entry[1], entry[2]
    local data, first = field(fields, 'd'), tonumber(field(fields, 'f'))
    local from, to, cut = 1, #data, false
    while first < wanted do  -- the frames up to the cursor are not sent
      from, first, cut = frame_end(data, from) + 1, first + 1, true
    end
    if size + to - from + 1 > budget then
      if size > 0 then
        return reply
      end
      -- Over the budget alone: the frames that fit, at least one.
      local stop = frame_end(data, from)
      local ends = first + 1  -- the next sequence number after the cut
      while stop < to do
        local after = frame_end(data, stop + 1)
        if after - from + 1 > budget then break end
        stop, ends = after, ends + 1
      end
      to, cut, left = stop, true, 0
      id = '0-' .. int(ends)
    end
    if cut then
      fields = {'f', int(first), 'd', string.sub(data, from, to)}
    end
    reply[#reply + 1] = id
    reply[#reply + 1] = fields
    size = size + to - from + 1
    largest = math.max(largest, #data)
    start = '(' .. id
    left = left - 1
    if left <= 0 or size >= budget then
      return reply
    end
  end
  if #entries < count then
    break  -- the end of the log
  end
end
return reply
