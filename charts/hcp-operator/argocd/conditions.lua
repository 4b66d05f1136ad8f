-- Argo CD health of a Callee, Caller or CapabilityPolicy (hcp.io/v1alpha1),
-- from the kstatus conditions the hcp-operator writes (docs/gitops.md):
--   status.observedGeneration behind metadata.generation   Progressing
--   Stalled=True                Degraded
--   Ready=True, reason ScaledToZero   Suspended (spec.harness.replicas is 0
--                               on purpose: a user, or KEDA on an empty queue)
--   Ready=True                  Healthy
--   Reconciling=True, or Ready=False from an operator without them,
--   or no status yet            Progressing
-- Argo CD runs it with only Lua's base and table libraries: no string.*.
local hs = {}
hs.status = "Progressing"
hs.message = "Waiting for the hcp-operator to report status"
if obj.status == nil then
  return hs
end
local gen = obj.metadata.generation
local observed = obj.status.observedGeneration
if gen ~= nil and observed ~= nil and observed < gen then
  hs.message = "Waiting for the hcp-operator to reconcile generation " .. gen
  return hs
end

local ready, reconciling, stalled
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Ready" then
      ready = c
    elseif c.type == "Reconciling" then
      reconciling = c
    elseif c.type == "Stalled" then
      stalled = c
    end
  end
end

local function text(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = text(stalled)
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  if ready.reason == "ScaledToZero" then
    hs.status = "Suspended"
  end
  hs.message = text(ready)
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = text(reconciling)
  return hs
end
if ready ~= nil then
  hs.message = text(ready)
end
return hs
