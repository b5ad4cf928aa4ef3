-- Argo CD health check for strata.dev/v1alpha1 CompactionJob.
-- Install it under resource.customizations.health.strata.dev_CompactionJob in argocd-cm (see README, GitOps).
-- Health comes from status.phase; the message from status.reason, then the Ready condition.
-- operator/strata/tests/gitops.rs reads the table below and tests this logic against sample statuses.
local phase_health = {
  Pending = "Progressing",
  Running = "Progressing",
  Succeeded = "Healthy",
  Failed = "Degraded",
}

local hs = { status = "Progressing", message = "Waiting for the Strata operator to pick up the job" }
if obj.status == nil or obj.status.phase == nil then
  return hs
end
local status = obj.status

local health = phase_health[status.phase]
if health == nil then
  health = "Progressing"
end
hs.status = health

local ready = nil
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    end
  end
end

if status.reason ~= nil and status.reason ~= "" then
  hs.message = status.phase .. ": " .. status.reason
elseif ready ~= nil and ready.message ~= nil and ready.message ~= "" then
  hs.message = status.phase .. ": " .. ready.message
else
  hs.message = "CompactionJob is " .. status.phase
end
return hs
