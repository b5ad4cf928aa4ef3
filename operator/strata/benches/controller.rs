//! Controller benchmarks: the pure half of a no-op Agent reconcile (validate, build, diff against
//! the child index) for a 10k-Agent fleet, and the resident memory of the caches per 1k Agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use kube::runtime::reflector::store;
use kube::runtime::watcher;
use serde_json::Value;
use strata::controller::agent::apply::stale_children;
use strata::controller::agent::build::build;
use strata::controller::agent::dereference::{AgentInputs, Fetched, NamespaceInfo, PolicyLookup};
use strata::controller::agent::validate::{Validation, validate};
use strata::controller::child_index::ChildIndex;
use strata::controller::context::Settings;
use strata::controller::prefix_cache::PrefixCache;
use strata_api::{Agent, ClusterContextPolicy, ContextPolicy};
use strata_core::cache_key::MasterKey;

const FLEET: usize = 10_000;

fn documents(path: &str) -> Vec<Value> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&std::fs::read_to_string(full).unwrap()).unwrap()
}

fn first<K: serde::de::DeserializeOwned>(path: &str, kind: &str) -> K {
    serde_json::from_value(documents(path).into_iter().find(|d| d["kind"] == kind).unwrap()).unwrap()
}

fn fleet(size: usize) -> Vec<Agent> {
    let builder: Agent = first("config/samples/strata_v1alpha1_agent.yaml", "Agent");
    (0..size)
        .map(|i| {
            let mut agent = builder.clone();
            agent.metadata.name = Some(format!("agent-{i:05}"));
            agent.metadata.namespace = Some(format!("tenant-{:03}", i % 100));
            agent.metadata.uid = Some(format!("00000000-0000-4000-8000-{i:012}"));
            agent.metadata.resource_version = Some(i.to_string());
            agent.metadata.generation = Some(1);
            agent
        })
        .collect()
}

fn inputs(agent: &Agent) -> AgentInputs {
    let references = documents("operator/strata/tests/golden/fleet-references.yaml");
    let text = |name: &str, key: &str| {
        let cm = references.iter().find(|d| d["metadata"]["name"] == name).unwrap();
        Fetched::Text(cm["data"][key].as_str().unwrap().to_string())
    };
    let mut policy: ContextPolicy =
        first("config/samples/strata_v1alpha1_contextpolicy.yaml", "ContextPolicy");
    policy.metadata.namespace = agent.metadata.namespace.clone();
    let cluster: ClusterContextPolicy =
        first("config/samples/strata_v1alpha1_clustercontextpolicy.yaml", "ClusterContextPolicy");
    let namespace = agent.metadata.namespace.clone().unwrap();
    AgentInputs {
        namespace: NamespaceInfo {
            uid: format!("uid-{namespace}"),
            labels: [("strata.dev/fleet".to_string(), "always-on".to_string())].into(),
            cache_epoch: Some("1".into()),
            name: namespace,
        },
        cluster_policies: vec![cluster],
        context_policy: PolicyLookup::Found(Box::new(policy)),
        system_prompt: Some(text("builder-prompt", "system.md")),
        tools: Some(text("fleet-tools", "tools.json")),
        trusted_authorities: None,
        pod: None,
    }
}

/// One no-op reconcile minus its IO: validate, build, and find nothing stale.
fn noop_pass(
    agent: &Agent,
    inputs: &AgentInputs,
    prefixes: &PrefixCache,
    key: &MasterKey,
    index: &ChildIndex,
) -> usize {
    let Validation::Valid(valid) = validate(agent, inputs, prefixes, key).unwrap() else { panic!("invalid") };
    let children = build(agent, &valid, &Settings::new("img", "img", "strata-system")).unwrap();
    let observed = index
        .children_of(agent.metadata.namespace.as_deref().unwrap(), agent.metadata.name.as_deref().unwrap());
    stale_children(&children.desired(), &observed).len()
}

fn bench_build_and_diff(c: &mut Criterion) {
    let agents = fleet(FLEET);
    let all_inputs: Vec<AgentInputs> = agents.iter().map(inputs).collect();
    let prefixes = PrefixCache::default();
    let key = MasterKey::new(vec![7; 32]).unwrap();
    let index = ChildIndex::new_synced();
    for (agent, inputs) in agents.iter().zip(&all_inputs) {
        let Validation::Valid(valid) = validate(agent, inputs, &prefixes, &key).unwrap() else { panic!() };
        let children = build(agent, &valid, &Settings::new("img", "img", "strata-system")).unwrap();
        for child in children.desired() {
            index.record(
                child.kind,
                agent.metadata.namespace.as_deref().unwrap(),
                agent.metadata.name.as_deref().unwrap(),
                &child.name,
                Some(child.spec_hash),
            );
        }
    }
    let mut group = c.benchmark_group("controller");
    group.sample_size(10);
    group.bench_function("noop_build_and_diff_10k_agents", |b| {
        b.iter(|| {
            let stale: usize = agents
                .iter()
                .zip(&all_inputs)
                .map(|(agent, inputs)| noop_pass(agent, inputs, &prefixes, &key, &index))
                .sum();
            assert_eq!(stale, 0, "an unchanged fleet has nothing to apply");
            black_box(stale)
        })
    });
    group.finish();
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// RSS growth from holding `FLEET` Agents in a reflector store plus their 7 children in the index.
fn report_cache_memory(_c: &mut Criterion) {
    let agents = fleet(FLEET);
    let json: Vec<Value> = agents.iter().map(|a| serde_json::to_value(a).unwrap()).collect();
    drop(agents);
    let before = resident_bytes();
    let (reader, mut writer) = store::<Agent>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for value in &json {
        let agent: Agent = serde_json::from_value(value.clone()).unwrap();
        writer.apply_watcher_event(&watcher::Event::InitApply(agent));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let index = ChildIndex::new_synced();
    for agent in reader.state() {
        let (namespace, name) =
            (agent.metadata.namespace.clone().unwrap(), agent.metadata.name.clone().unwrap());
        for kind in strata::controller::child_index::ChildKind::ALL {
            index.record(kind, &namespace, &name, &name, Some("f".repeat(64)));
        }
    }
    let after = resident_bytes();
    let grown = after.saturating_sub(before) as f64 / (1024.0 * 1024.0);
    println!(
        "cache memory: {FLEET} Agents in a reflector store + {} indexed children: RSS +{grown:.1} MiB ({:.2} MiB per 1k Agents)",
        index.len(),
        grown / (FLEET as f64 / 1000.0)
    );
    black_box((reader.len(), index.len()));
}

criterion_group!(benches, report_cache_memory, bench_build_and_diff);
criterion_main!(benches);
