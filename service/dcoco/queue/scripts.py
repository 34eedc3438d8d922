"""Lua scripts that make multi-step queue operations atomic on the Redis server."""

# KEYS: requests stream. ARGV: group, max waiting, envelope JSON... -> waiting after, or -1 if full.
# Waiting = entries not yet delivered to any worker = stream length - pending (delivered, unacked).
ENQUEUE = """
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1])
if type(pending) == 'table' and pending.err then
  redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
  pending = {0}
end
local waiting = redis.call('XLEN', KEYS[1]) - pending[1]
local n = #ARGV - 2
if waiting + n > tonumber(ARGV[2]) then
  return -1
end
for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'r', ARGV[i])
end
return waiting + n
"""

# KEYS: requests stream. ARGV: group -> waiting (not yet delivered) entries.
DEPTH = """
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1])
if type(pending) == 'table' and pending.err then
  return redis.call('XLEN', KEYS[1])
end
return redis.call('XLEN', KEYS[1]) - pending[1]
"""

# Takes ownership of a request and, unless ARGV[4] is '0', tells its reader it has started
# (a "start" event); does nothing if the client has cancelled it.
# KEYS: owner, response stream, cancel flag. ARGV: worker id, owner ttl, response ttl, announce
# -> attempt number, or 0 if cancelled.
CLAIM = """
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
local current = redis.call('GET', KEYS[1])
local attempt = 1
if current then
  attempt = tonumber(string.match(current, ' (%d+)$')) + 1
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. attempt, 'EX', ARGV[2])
if ARGV[4] ~= '0' then
  redis.call('XADD', KEYS[2], '*', 'e', '{"kind":"start","seq":-1,"attempt":' .. attempt .. '}')
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return attempt
"""

# Fenced write: only the current owner may append events or finish a request, so a worker
# presumed dead that wakes up again cannot duplicate output.
# KEYS: owner, response stream, requests stream.
# ARGV: expected owner, ttl, event JSON or '', group, entry id or '' (finish: ack and delete).
APPEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '' then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
if ARGV[5] ~= '' then
  redis.pcall('XACK', KEYS[3], ARGV[4], ARGV[5])
  redis.call('XDEL', KEYS[3], ARGV[5])
end
return 1
"""

# GCRA rate limit. KEYS: state. ARGV: now ms, interval ms per request, burst (requests).
# -> {1, 0} allowed, or {0, ms to wait}.
RATE = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local allow_at = tat - interval * (tonumber(ARGV[3]) - 1)
if now < allow_at then
  return {0, allow_at - now}
end
redis.call('SET', KEYS[1], tat + interval, 'PX', math.ceil(tat + interval - now))
return {1, 0}
"""

# KEYS: active set. ARGV: now ms, limit, member, lease ms -> 1 acquired, 0 at the limit.
ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[4]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""
