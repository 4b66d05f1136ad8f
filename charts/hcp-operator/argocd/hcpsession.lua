-- Argo CD health of an HCPSession (hcp.io/v1alpha1), from status.state, the
-- L2 state the callee sidecar writes (docs/gitops.md):
--   COMPLETED                       Healthy
--   FAILED, ABORTED, REJECTED       Degraded (the reason and message say why)
--   PAUSED by the harness           Suspended
--   PAUSED for a hand-over, PENDING, RUNNING, ABORTING, no status yet
--                                   Progressing (with the progress)
-- Argo CD runs it with only Lua's base and table libraries: no string.*.
local hs = {}
local st = obj.status
if st == nil or st.state == nil or st.state == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the callee sidecar to decide on the task"
  return hs
end

local function why()
  local parts = {}
  if st.reason ~= nil and st.reason ~= "" then
    table.insert(parts, st.reason)
  end
  if st.message ~= nil and st.message ~= "" then
    table.insert(parts, st.message)
  elseif st.error ~= nil and st.error.message ~= nil and st.error.message ~= "" then
    table.insert(parts, st.error.message)
  end
  return table.concat(parts, ": ")
end

local state = st.state
local detail = why()
if state == "COMPLETED" then
  hs.status = "Healthy"
  hs.message = "COMPLETED"
  if st.result ~= nil and st.result.summary ~= nil and st.result.summary ~= "" then
    hs.message = "COMPLETED: " .. st.result.summary
  end
  return hs
end
if state == "FAILED" or state == "ABORTED" or state == "REJECTED" then
  hs.status = "Degraded"
  hs.message = state
  if detail ~= "" then
    hs.message = state .. ": " .. detail
  end
  return hs
end
if state == "PAUSED" and st.reason ~= "harness_moved" and st.reason ~= "harness_restarted" then
  hs.status = "Suspended"
  hs.message = "PAUSED"
  if detail ~= "" then
    hs.message = "PAUSED: " .. detail
  end
  return hs
end
if state == "PENDING" or state == "RUNNING" or state == "PAUSED" or state == "ABORTING" then
  hs.status = "Progressing"
  local msg = state
  local p = st.progress
  if p ~= nil then
    if p.percent ~= nil then
      msg = msg .. " " .. p.percent .. "%"
    end
    if p.stage ~= nil and p.stage ~= "" then
      msg = msg .. " " .. p.stage
    end
    if p.message ~= nil and p.message ~= "" then
      msg = msg .. ": " .. p.message
    end
  elseif detail ~= "" then
    msg = msg .. ": " .. detail
  end
  hs.message = msg
  return hs
end
hs.status = "Unknown"
hs.message = "Unknown session state " .. state
return hs
