-- Argo CD health check for strata.dev/v1alpha1 Agent.
-- Install it under resource.customizations.health.strata.dev_Agent in argocd-cm (see README, GitOps).
-- Health comes from status.phase, and a Running agent is Healthy only once its Ready condition is True.
-- operator/strata/tests/gitops.rs reads the table below and tests this logic against sample statuses.
local phase_health = {
  Pending = "Progressing",
  Running = "Healthy",
  Suspended = "Suspended",
  Degraded = "Degraded",
  Failed = "Degraded",
}

local hs = { status = "Progressing", message = "Waiting for the Strata operator to report status" }
if obj.status == nil then
  return hs
end
local status = obj.status
if obj.metadata.generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < obj.metadata.generation) then
  hs.message = "Waiting for the Strata operator to reconcile generation " .. obj.metadata.generation
  return hs
end

local ready = nil
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    end
  end
end

local health = phase_health[status.phase]
if health == nil then
  health = "Progressing"
end
if health == "Healthy" and (ready == nil or ready.status ~= "True") then
  health = "Progressing"
end
hs.status = health

if ready ~= nil and ready.message ~= nil and ready.message ~= "" then
  hs.message = ready.message
elseif ready ~= nil and ready.reason ~= nil and ready.reason ~= "" then
  hs.message = ready.reason
elseif status.phase ~= nil then
  hs.message = "Agent is " .. status.phase
end
return hs
