//! Seeded, deterministic always-on fleet sessions shaped like seed 003's fleet.
//!
//! Each agent's session chains many tasks in one always-on conversation:
//! - a heartbeat exchange every 5 minutes;
//! - a status check every 10 minutes, with a status tool result whose counters change;
//! - tasks, each with repeated file reads, decisions, constraints and TODOs.
//!
//! Heartbeats and status checks make up most of the tokens. They carry the seed-003 shapes that the
//! default retention rules classify as Ephemeral (`HEARTBEAT`, `HEARTBEAT_OK`, `status check`).

use crate::entry::Role;
use crate::journal::sim::SimRng;

use super::transcript::{Transcript, TranscriptMessage};

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetSpec {
    /// Agents (one session each).
    pub agents: u32,
    /// Hours of activity per agent.
    pub hours: u32,
    /// Seed; the same spec always gives the same sessions.
    pub seed: u64,
}

const AGENT_NAMES: [&str; 8] = ["builder", "rivet", "scout", "herald", "ledger", "quill", "sentry", "warden"];
const FILES: [&str; 6] = [
    "src/pricing/engine.ts",
    "src/auth/session.ts",
    "docs/specs/pricing.md",
    "src/api/routes.ts",
    "infra/deploy.yaml",
    "src/billing/invoice.ts",
];
const MINUTE_MS: u64 = 60_000;
/// Rows of the status tool's worker table.
const STATUS_WORKERS: u64 = 200;

/// Generate one session per agent.
pub fn generate_fleet(spec: &FleetSpec) -> Vec<Transcript> {
    (0..spec.agents)
        .map(|agent| {
            let mut rng = SimRng::new(spec.seed.wrapping_mul(0x9e37_79b9).wrapping_add(u64::from(agent) + 1));
            let name = AGENT_NAMES[agent as usize % AGENT_NAMES.len()];
            let label = if agent as usize >= AGENT_NAMES.len() {
                format!("{name}-{agent}")
            } else {
                name.to_string()
            };
            generate_agent(&label, spec.hours, &mut rng)
        })
        .collect()
}

struct Session {
    messages: Vec<TranscriptMessage>,
}

impl Session {
    fn push(&mut self, role: Role, text: String, tool: Option<&str>, at_ms: u64) {
        let index = self.messages.len();
        self.messages.push(TranscriptMessage::plain(
            role,
            text,
            tool.map(str::to_string),
            Some(at_ms),
            index,
        ));
    }
}

fn file_body(path: &str, lines: u64) -> String {
    (1..=lines)
        .map(|n| {
            format!("{n:>4}  // {path}: export function step{n}(input) {{ return transform(input, {n}); }}\n")
        })
        .collect()
}

fn generate_agent(name: &str, hours: u32, rng: &mut SimRng) -> Transcript {
    let mut s = Session { messages: Vec::new() };
    s.push(
        Role::System,
        format!(
            "You are {name}, an always-on agent in the rateright fleet. Work through the task queue, keep decisions \
             and constraints explicit, and answer heartbeats with HEARTBEAT_OK when nothing needs attention."
        ),
        None,
        0,
    );
    let end = u64::from(hours) * 60 * MINUTE_MS;
    let mut now = MINUTE_MS;
    let mut task = 0u64;
    let mut next_task = 20 * MINUTE_MS;
    // Idle 5-minute slots alternate between a heartbeat and a status check.
    let mut slot = 1u64;
    while now < end {
        if now >= next_task {
            task += 1;
            run_task(&mut s, name, task, &mut now, rng);
            next_task = now + (30 + rng.below(60)) * MINUTE_MS;
        } else if slot.is_multiple_of(2) {
            slot += 1;
            s.push(Role::User, "status check: report queue and session status.".into(), None, now);
            s.push(Role::Assistant, "Calling session_status.".into(), Some("session_status"), now);
            let mut status = format!(
                "status check: {{\"queue\": {}, \"sessions\": {}, \"pending_reviews\": {}, \"last_deploy\": \"ok\"}}\n",
                rng.below(12),
                1 + rng.below(4),
                rng.below(5),
            );
            // The per-worker table is what made seed 003's status queries expensive.
            for worker in 0..STATUS_WORKERS {
                status.push_str(&format!(
                    "worker-{worker:03} healthy queue={} p50={}ms p99={}ms mem={}MiB restarts=0\n",
                    rng.below(9),
                    20 + rng.below(80),
                    200 + rng.below(800),
                    200 + rng.below(300)
                ));
            }
            s.push(Role::Tool, status, Some("session_status"), now);
            s.push(Role::Assistant, "HEARTBEAT_OK — status nominal.".into(), None, now);
            now += 5 * MINUTE_MS;
        } else {
            slot += 1;
            s.push(
                Role::User,
                "HEARTBEAT: check in. Reply HEARTBEAT_OK if nothing needs attention.".into(),
                None,
                now,
            );
            s.push(Role::Assistant, "HEARTBEAT_OK".into(), None, now);
            now += 5 * MINUTE_MS;
        }
    }
    Transcript::new(format!("synthetic/{name}"), s.messages, Vec::new())
}

fn run_task(s: &mut Session, name: &str, task: u64, now: &mut u64, rng: &mut SimRng) {
    let file = FILES[rng.below(FILES.len() as u64) as usize];
    let other = FILES[rng.below(FILES.len() as u64) as usize];
    s.push(
        Role::User,
        format!("Task {task} for {name}: update {file} so the pricing page shows annual discounts. Constraint: do not change the public API."),
        None,
        *now,
    );
    let rounds = 2 + rng.below(4);
    for round in 0..rounds {
        let path = if round % 2 == 0 { file } else { other };
        s.push(Role::Assistant, format!("Reading {path}."), Some("read_file"), *now);
        // Re-reading the same file gives the same bytes: the dedup case.
        s.push(Role::Tool, file_body(path, 30 + (path.len() as u64 % 5) * 10), Some("read_file"), *now);
        *now += (1 + rng.below(3)) * MINUTE_MS;
        if round == 1 {
            s.push(
                Role::Assistant,
                format!("Decision: task {task} keeps the discount logic in {file}; we will not add a new service. TODO: add a test for task {task}."),
                None,
                *now,
            );
        }
    }
    s.push(Role::Assistant, format!("Task {task} done: {file} updated, tests pass."), None, *now);
    *now += 2 * MINUTE_MS;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_fleet() {
        let spec = FleetSpec { agents: 3, hours: 2, seed: 7 };
        assert_eq!(generate_fleet(&spec), generate_fleet(&spec));
        let other = generate_fleet(&FleetSpec { seed: 8, ..spec });
        assert_ne!(generate_fleet(&spec), other);
    }

    #[test]
    fn heartbeats_and_status_checks_dominate() {
        let fleet = generate_fleet(&FleetSpec { agents: 1, hours: 24, seed: 1 });
        let session = &fleet[0];
        let chars = |f: &dyn Fn(&TranscriptMessage) -> bool| -> usize {
            session.messages.iter().filter(|m| f(m)).map(|m| m.text.len()).sum()
        };
        let routine = chars(&|m| m.text.starts_with("HEARTBEAT") || m.text.starts_with("status check"));
        let all = chars(&|_| true);
        assert!(routine * 100 / all >= 70, "routine share {}%", routine * 100 / all);
        assert!(session.calls.len() > 200, "{} calls", session.calls.len());
        assert!(session.messages.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }
}
