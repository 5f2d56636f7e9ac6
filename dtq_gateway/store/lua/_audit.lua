-- _audit.lua: audit helper prepended (after _lib.lua) to the scripts that must
-- append to the audit stream atomically with a state change (see
-- dtq_gateway/store/admin_scripts.py). It builds no key: the caller passes the audit
-- stream key through KEYS.

-- XADD one audit entry {actor, action, task_id, ts (epoch ms, Redis TIME),
-- request_id, detail} with an approximate MAXLEN trim; returns the entry id.
local function audit(audit_key, maxlen, ms, actor, action, task_id, request_id, detail)
  return redis.call('XADD', audit_key, 'MAXLEN', '~', maxlen, '*', 'actor', actor,
    'action', action, 'task_id', task_id or '', 'ts', ms, 'request_id', request_id,
    'detail', detail or '')
end
