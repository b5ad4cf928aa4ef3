#!/usr/bin/env bash
# The cluster tests (e2e/) on the real Kubernetes control plane of ../shared/k8s (etcd,
# kube-apiserver, kube-controller-manager; no kubelet). It
#   1. starts the control plane in a temporary directory (stopped again by the EXIT trap);
#   2. installs config/default with kubectl (CRDs, RBAC, namespace, Deployment) and fails on any
#      apiserver warning; the Deployment is scaled to 0, because without a kubelet its pods never run;
#   3. runs `strata controller` as a process beside it, authenticated with a token of the
#      strata-controller ServiceAccount that config/rbac ships (so authorization is real), under a
#      restart loop that plays the kubelet (a replica that loses the Lease exits and comes back);
#   4. runs `cargo test -p strata-e2e` with the STRATA_E2E_* variables the tests read, and prints
#      how many cluster tests ran.
# Without ../shared/k8s it prints that it skipped; with STRATA_REQUIRE_SHARED=1 that is a failure.
#
#   e2e/control-plane.sh                 the cluster tests
#   e2e/control-plane.sh --bench N [S]   instead: the scale bench with N Agents and an S-second quiet
#                                        window (default 75; the controller resyncs every 60 s);
#                                        prints a row for BENCHMARKS.md. STRATA_E2E_PROFILE=release
#                                        (the default for --bench) or debug picks the build.
#
# Env: STRATA_K8S (default ../shared/k8s), the control plane's *_PORT variables (see its README),
#      STRATA_E2E_METRICS_PORT (28080), STRATA_E2E_KEEP=1 keeps the work directory and logs,
#      STRATA_E2E_CONCURRENCY passes --concurrency to the controller (its default otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BENCH=
if [ "${1:-}" = --bench ]; then
  BENCH=${2:?usage: e2e/control-plane.sh --bench N [quiet-seconds]}
  QUIET=${3:-75}
fi
K8S=${STRATA_K8S:-$(cd .. && pwd)/shared/k8s}
if [ ! -x "$K8S/up" ]; then
  if [ "${STRATA_REQUIRE_SHARED:-}" = 1 ]; then
    echo "cluster tests: $K8S/up is missing and STRATA_REQUIRE_SHARED=1 makes that a failure" >&2
    exit 1
  fi
  echo "skipped the cluster tests: $K8S/up is missing (the shared control plane beside the checkout)"
  exit 0
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/strata-e2e.XXXXXX")
PLANE=$WORK/k8s
METRICS_PORT=${STRATA_E2E_METRICS_PORT:-28080}
SUPERVISOR=

cleanup() {
  local rc=$?
  touch "$WORK/stop"
  if [ -f "$WORK/controller.pid" ]; then
    pid=$(cat "$WORK/controller.pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  fi
  [ -n "$SUPERVISOR" ] && wait "$SUPERVISOR" 2>/dev/null || true
  "$K8S/down" "$PLANE" || true
  if [ "$rc" -ne 0 ]; then
    echo "--- last lines of the controller log ($WORK/controller-a.log)"
    tail -n 40 "$WORK/controller-a.log" 2>/dev/null || true
  fi
  if [ "${STRATA_E2E_KEEP:-}" = 1 ] || [ "$rc" -ne 0 ]; then
    echo "kept $WORK (logs: controller-a.log, k8s/logs/)"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT

"$K8S/up" "$PLANE"
export KUBECONFIG=$PLANE/kubeconfig

echo "installing config/default"
kubectl apply -k config/default >"$WORK/apply.out" 2>"$WORK/apply.err" || { cat "$WORK/apply.err" >&2; exit 1; }
if grep -i "warning" "$WORK/apply.err"; then
  echo "the apiserver warned while config/default was applied (see above)" >&2
  exit 1
fi
kubectl wait --for=condition=Established --timeout=60s crd --all >/dev/null
kubectl -n strata-system scale deployment strata-controller --replicas=0 >/dev/null

echo "a token for ServiceAccount strata-system/strata-controller"
TOKEN=$(kubectl -n strata-system create token strata-controller --duration=3h)
SERVER=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
CA=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
cat >"$WORK/controller.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$SERVER", certificate-authority-data: "$CA"}
users:
- name: strata-controller
  user: {token: "$TOKEN"}
contexts:
- name: test
  context: {cluster: test, user: strata-controller}
current-context: test
EOF
chmod 600 "$WORK/controller.kubeconfig"

PROFILE=${STRATA_E2E_PROFILE:-release}
if [ -n "$BENCH" ] && [ "$PROFILE" = release ]; then
  cargo build -q --release -p strata --locked
  STRATA_BIN=$ROOT/target/release/strata
  RESYNC=60 LOG=info
elif [ -n "$BENCH" ]; then
  cargo build -q -p strata --locked
  STRATA_BIN=$ROOT/target/debug/strata
  RESYNC=60 LOG=info
else
  cargo build -q -p strata --locked
  STRATA_BIN=$ROOT/target/debug/strata
  RESYNC=45 LOG=info,strata::controller::client=debug
fi

# The controller under a restart loop, as a kubelet would run it.
(
  while [ ! -f "$WORK/stop" ]; do
    KUBECONFIG=$WORK/controller.kubeconfig POD_NAME=strata-e2e-a POD_NAMESPACE=strata-system \
      RUST_LOG=$LOG \
      "$STRATA_BIN" controller --metrics-listen "127.0.0.1:$METRICS_PORT" --resync-seconds "$RESYNC" \
      ${STRATA_E2E_CONCURRENCY:+--concurrency "$STRATA_E2E_CONCURRENCY"} \
      --gateway-image strata-e2e/strata:dev >>"$WORK/controller-a.log" 2>&1 &
    echo $! >"$WORK/controller.pid"
    wait $! || true
    [ -f "$WORK/stop" ] || { echo "=== restarted $(date -u +%FT%TZ)" >>"$WORK/controller-a.log"; sleep 1; }
  done
) &
SUPERVISOR=$!
for _ in $(seq 1 60); do
  holder=$(kubectl -n strata-system get lease strata-controller-leader -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
  [ "$holder" = strata-e2e-a ] && break
  sleep 1
done
[ "$holder" = strata-e2e-a ] || { echo "the controller did not take the leader Lease" >&2; exit 1; }
echo "strata controller leads (ServiceAccount token, metrics on 127.0.0.1:$METRICS_PORT)"

export STRATA_E2E_KUBECONFIG=$KUBECONFIG
export STRATA_E2E_STRATA_BIN=$STRATA_BIN
export STRATA_E2E_CONTROLLER_KUBECONFIG=$WORK/controller.kubeconfig
export STRATA_E2E_CONTROLLER_PID_FILE=$WORK/controller.pid
export STRATA_E2E_CONTROLLER_LOG=$WORK/controller-a.log
export STRATA_E2E_CONTROLLER_METRICS=127.0.0.1:$METRICS_PORT
export STRATA_E2E_CONTROL_PLANE=$PLANE
export STRATA_E2E_K8S=$K8S
if [ -n "$BENCH" ]; then
  if [ "$PROFILE" = release ]; then
    cargo run -q --release -p strata-e2e --locked --bin fleet-bench -- "$BENCH" "$QUIET"
  else
    cargo run -q -p strata-e2e --locked --bin fleet-bench -- "$BENCH" "$QUIET"
  fi
  exit 0
fi
set +e
cargo test -p strata-e2e --locked --no-fail-fast -- --test-threads 4 2>&1 | tee "$WORK/test.log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$WORK/test.log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$WORK/test.log" | awk '{s+=$1} END {print s+0}')
ignored=$(grep -Eo '^test result: .* ([0-9]+) ignored' "$WORK/test.log" | grep -Eo '[0-9]+ ignored' | awk '{s+=$1} END {print s+0}')
echo "cluster tests on the real control plane ($("$PLANE/bin/kube-apiserver" --version)): $passed passed, $failed failed, $ignored ignored"
[ "$ignored" -eq 0 ] || { echo "cluster tests were ignored: were they built without STRATA_E2E_KUBECONFIG?" >&2; exit 1; }
exit "$status"
