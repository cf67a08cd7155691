local function int(n)  -- a number as a command argument: whole, never in e-notation
  return string.format('%d', n)
end

local function now_us()  -- the server's clock: one order for every replica
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function field(fields, name)  -- a stream entry's field (fields: {k1, v1, k2, v2, ...})
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return ''
end
