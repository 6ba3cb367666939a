"""The shared router state's atomic steps in Redis, as Lua scripts (redis_store.py runs them): a report put
only if newer than the stored one, a reservation taken only if the worker's headroom less the other live
reservations still fits it (a claim is taken as it is: placement/headroom_wait.py), a reservation marked
started at its first token; and how a worker's reservations hash reads back."""

from __future__ import annotations

from zipkv.controlplane.reservations import Reservation

PUT_REPORT = """
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
if cur[1] then
  local e, s = tonumber(ARGV[1]), tonumber(ARGV[2])
  local ce, cs = tonumber(cur[1]), tonumber(cur[2])
  if e < ce or (e == ce and s <= cs) then return cur[1] .. ':' .. cur[2] end
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'seq', ARGV[2], 'recv', ARGV[3], 'free', ARGV[4],
           'data', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('SADD', KEYS[2], ARGV[7])
return ''
"""

RESERVE = """
local w = redis.call('HMGET', KEYS[1], 'free', 'recv')
if not w[1] then return -1 end
local free, recv, now = tonumber(w[1]), tonumber(w[2]), tonumber(ARGV[3])
local all = redis.call('HGETALL', KEYS[2])
local used = 0
for i = 1, #all, 2 do
  local t, st, ex = string.match(all[i + 1], '([^:]+):([^:]+):([^:]+)')
  t, st, ex = tonumber(t), tonumber(st), tonumber(ex)
  if ex <= now then
    redis.call('HDEL', KEYS[2], all[i])
  elseif all[i] ~= ARGV[1] and (st == 0 or recv < st + tonumber(ARGV[6])) then
    used = used + t
  end
end
local claim = ARGV[9] == '1'
if not claim and free - used < tonumber(ARGV[2]) then return 0 end
local placed = ARGV[3]
if claim then placed = '-1' end  -- reservations.CLAIM_PLACED_S
redis.call('HSET', KEYS[2], ARGV[1],
           ARGV[2] .. ':0:' .. ARGV[4] .. ':' .. ARGV[7] .. ':' .. ARGV[8] .. ':' .. placed)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"""

MARK_STARTED = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local t, rest = string.match(v, '^([^:]+):[^:]+:(.+)$')
redis.call('HSET', KEYS[1], ARGV[1], t .. ':' .. ARGV[2] .. ':' .. rest)
return 1
"""


def parse_reservations(raw: dict[str, str]) -> list[Reservation]:
    """A worker's reservations hash as RESERVE and MARK_STARTED write it: ``tokens:started:expires`` and, from
    routers that carry the prefill fields, ``:prefill:cached:placed`` (``-`` for no prefill count)."""
    out = []
    for value in raw.values():
        tokens, started, expires, *rest = value.split(":")
        if len(rest) == 3:
            prefill, cached, placed = rest
            out.append(
                Reservation(
                    int(tokens),
                    float(started),
                    float(expires),
                    None if prefill == "-" else int(prefill),
                    int(cached),
                    float(placed),
                )
            )
        else:  # written by a router from before the prefill fields: all of it counts, until started
            out.append(Reservation(int(tokens), float(started), float(expires)))
    return out
