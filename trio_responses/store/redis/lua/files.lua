-- Files, containers and their owners' totals. Every script below passes ARGV[1] =
-- the key prefix, ARGV[2] = the owner ('' without one); keys are named from them.
local F = {prefix = ARGV[1], owner = ARGV[2]}

local function suffix(owner)  -- an owner's part of a per-owner key
  if owner == '' then return '' end
  return ':' .. owner
end

local function file_key(id) return F.prefix .. 'file:' .. id end
local function content_key(id) return F.prefix .. 'file:' .. id .. ':bytes' end
local function container_key(id) return F.prefix .. 'container:' .. id end
local function quota_key(owner) return F.prefix .. 'file-quota' .. suffix(owner) end
local function containers_key(owner) return F.prefix .. 'containers' .. suffix(owner) end
local EXPIRING = F.prefix .. 'expiring-containers'

local function list_key(owner, container)  -- the index that lists a file
  if container == '' then return F.prefix .. 'files' .. suffix(owner) end
  return F.prefix .. 'container:' .. container .. ':files'
end

local function drop_file(id)  -- a file, its bytes, its place and its share of the totals
  local key = file_key(id)
  local f = redis.call('HMGET', key, 'owner', 'container', 'size')
  if not f[1] then return 0 end
  redis.call('DEL', key, content_key(id))
  redis.call('ZREM', list_key(f[1], f[2]), id)
  local quota = quota_key(f[1])
  redis.call('HINCRBY', quota, 'files', -1)
  redis.call('HINCRBY', quota, 'bytes', int(-tonumber(f[3])))
  return 1
end

local function drop_files_of(container)
  local files = list_key('', container)
  for _, id in ipairs(redis.call('ZRANGE', files, 0, -1)) do
    drop_file(id)
  end
  redis.call('DEL', files)
end

local function drop_container(id)  -- a container, its files, its place in the totals
  local key = container_key(id)
  local c = redis.call('HMGET', key, 'owner', 'status')
  if not c[1] then return 0 end
  drop_files_of(id)
  redis.call('DEL', key)
  redis.call('ZREM', containers_key(c[1]), id)
  redis.call('ZREM', EXPIRING, id)
  if c[2] ~= 'expired' then
    redis.call('HINCRBY', quota_key(c[1]), 'containers', -1)
  end
  return 1
end

local function held(owner, what)
  return tonumber(redis.call('HGET', quota_key(owner), what) or '0')
end
