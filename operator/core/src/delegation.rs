//! Delegation results as bounded expert digests (GCS §17.13, seed 000's result envelope): a
//! delegate's result is checked against the digest schema (objective, findings with evidence
//! references, decisions, open questions, artifacts), a free-text result is digested
//! extractively, and the rendering is held to the parent-return token budget.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::artifacts::ArtifactRef;

/// Which tools are delegations, and how much of their result the parent sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelegationPolicy {
    /// Tool names whose results come from a delegate (a sub-agent).
    pub tools: Vec<String>,
    /// Tokens the rendered digest may take in the parent's context.
    pub return_tokens: u64,
}

impl Default for DelegationPolicy {
    fn default() -> Self {
        DelegationPolicy {
            tools: vec!["Task".into(), "task".into(), "delegate_task".into()],
            return_tokens: 2_000,
        }
    }
}

impl DelegationPolicy {
    /// Whether `tool` is a delegation.
    pub fn is_delegation(&self, tool: &str) -> bool {
        self.tools.iter().any(|name| name == tool)
    }
}

/// How a digest was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DigestSource {
    /// The delegate returned a result that matches the digest schema.
    Structured,
    /// The delegate returned free text; the digest was extracted from its lines.
    Extractive,
}

impl DigestSource {
    /// Label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            DigestSource::Structured => "structured",
            DigestSource::Extractive => "extractive",
        }
    }
}

/// One finding with the references that support it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// The claim.
    pub claim: String,
    /// Evidence references (files, URLs, data_refs) the claim rests on.
    pub evidence_refs: Vec<String>,
}

/// The parent-facing result of a delegation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpertDigest {
    /// The delegation tool that produced it.
    pub tool: String,
    /// Structured or extractive.
    pub source: DigestSource,
    /// What the delegate was asked to do, or its summary of what it did.
    pub objective: String,
    /// Completion status as the delegate reported it (`completed`, `failed`, …), if it did.
    pub status: Option<String>,
    /// Conclusions, each with its evidence references.
    pub findings: Vec<Finding>,
    /// Decisions and actions taken.
    pub decisions: Vec<String>,
    /// Unresolved questions and warnings (kept apart from the conclusions).
    pub open_questions: Vec<String>,
    /// Artifacts the delegate produced or touched.
    pub artifacts: Vec<String>,
}

/// A digest rendered for the parent's context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedDigest {
    /// The text the parent sees.
    pub text: String,
    /// Items left out to meet the budget (they stay in the full result).
    pub omitted_items: usize,
}

fn strings(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(text)) if !text.trim().is_empty() => vec![text.trim().to_owned()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text.trim().to_owned()),
                Value::Object(map) => {
                    ["text", "question", "decision", "action", "path", "name", "ref", "summary"]
                        .iter()
                        .find_map(|key| map.get(*key).and_then(Value::as_str))
                        .map(|text| text.trim().to_owned())
                }
                Value::Null => None,
                other => Some(other.to_string()),
            })
            .filter(|text| !text.is_empty())
            .collect(),
        _ => Vec::new(),
    }
}

fn first_string(map: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|key| map.get(*key).and_then(Value::as_str))
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty())
}

fn finding(value: &Value) -> Option<Finding> {
    match value {
        Value::String(text) if !text.trim().is_empty() => {
            Some(Finding { claim: text.trim().to_owned(), evidence_refs: Vec::new() })
        }
        Value::Object(map) => {
            let claim = first_string(map, &["claim", "finding", "text", "summary"])?;
            let mut evidence_refs = strings(map.get("evidence_refs").or_else(|| map.get("evidenceRefs")));
            evidence_refs.extend(strings(map.get("evidence")));
            Some(Finding { claim, evidence_refs })
        }
        _ => None,
    }
}

impl ExpertDigest {
    /// The digest of a delegate's result: structured when the result is a JSON object of the
    /// digest schema (its own field names or seed 000's envelope), extractive otherwise.
    pub fn of_result(tool: &str, output: &str) -> ExpertDigest {
        Self::structured(tool, output).unwrap_or_else(|| Self::extractive(tool, output))
    }

    /// The digest schema check: a JSON object with an objective or summary and at least one of
    /// findings, decisions, open questions or artifacts.
    fn structured(tool: &str, output: &str) -> Option<ExpertDigest> {
        let value: Value = serde_json::from_str(output.trim()).ok()?;
        let map = value.as_object()?;
        let objective = first_string(map, &["objective", "summary", "task"])?;
        let findings: Vec<Finding> =
            map.get("findings").and_then(Value::as_array).into_iter().flatten().filter_map(finding).collect();
        let mut decisions = strings(map.get("decisions"));
        decisions.extend(strings(map.get("actions_taken").or_else(|| map.get("actionsTaken"))));
        let mut open_questions = strings(map.get("open_questions").or_else(|| map.get("openQuestions")));
        open_questions.extend(strings(map.get("warnings")));
        let artifacts = strings(map.get("artifacts").or_else(|| map.get("artifact_refs")));
        let has_body = !findings.is_empty()
            || !decisions.is_empty()
            || !open_questions.is_empty()
            || !artifacts.is_empty()
            || map.contains_key("findings");
        has_body.then(|| ExpertDigest {
            tool: tool.to_owned(),
            source: DigestSource::Structured,
            objective,
            status: first_string(map, &["status"]),
            findings,
            decisions,
            open_questions,
            artifacts,
        })
    }

    /// The extractive digest of free text: the first paragraph as the objective, list items as
    /// findings, lines that state a decision as decisions, questions and to-dos as open
    /// questions, and file paths and URLs as artifacts; every item is a line of the result.
    fn extractive(tool: &str, output: &str) -> ExpertDigest {
        let mut lines = output.lines().map(str::trim).filter(|line| !line.is_empty());
        let objective = lines.next().map(|line| clip(line, 400)).unwrap_or_default();
        let mut digest = ExpertDigest {
            tool: tool.to_owned(),
            source: DigestSource::Extractive,
            objective,
            status: None,
            findings: Vec::new(),
            decisions: Vec::new(),
            open_questions: Vec::new(),
            artifacts: Vec::new(),
        };
        for line in lines {
            let lower = line.to_lowercase();
            let item = clip(line.trim_start_matches(['-', '*', '•', ' ']), 400);
            for word in line.split_whitespace() {
                let word = word.trim_matches(|c: char| "`'\"()[]<>,;".contains(c));
                if looks_like_artifact(word) && !digest.artifacts.iter().any(|a| a == word) {
                    digest.artifacts.push(word.to_owned());
                }
            }
            if line.ends_with('?')
                || ["todo", "unresolved", "open question", "unclear", "not sure"]
                    .iter()
                    .any(|marker| lower.contains(marker))
            {
                digest.open_questions.push(item);
            } else if ["decided", "decision", "chose", "will use", "changed", "created", "fixed", "updated"]
                .iter()
                .any(|marker| lower.contains(marker))
            {
                digest.decisions.push(item);
            } else if is_list_item(line) || line.starts_with('#') {
                digest.findings.push(Finding { claim: item, evidence_refs: Vec::new() });
            }
        }
        digest
    }

    /// Renders the digest for the parent within `budget` tokens (`count` counts a text's tokens):
    /// each list keeps its leading items while they fit, open questions first, then decisions,
    /// findings and artifacts; the header names the full result's `data_ref` and how many items
    /// were left out.
    pub fn render(
        &self,
        full_ref: &ArtifactRef,
        full_tokens: u64,
        budget: u64,
        count: impl Fn(&str) -> u64,
    ) -> RenderedDigest {
        let total =
            self.findings.len() + self.decisions.len() + self.open_questions.len() + self.artifacts.len();
        let mut digest = ExpertDigest {
            findings: Vec::new(),
            decisions: Vec::new(),
            open_questions: Vec::new(),
            artifacts: Vec::new(),
            ..self.clone()
        };
        // Room for the line that says how many items were left out.
        let mut used = count(&digest.text(full_ref, full_tokens, budget, total)) + 8;
        let mut fits = |line: &str| {
            let tokens = count(line) + 1;
            (used + tokens <= budget).then(|| used += tokens).is_some()
        };
        digest.open_questions = self.open_questions.iter().take_while(|q| fits(q)).cloned().collect();
        digest.decisions = self.decisions.iter().take_while(|d| fits(d)).cloned().collect();
        digest.findings = self
            .findings
            .iter()
            .take_while(|f| fits(&format!("{} (evidence: {})", f.claim, f.evidence_refs.join(", "))))
            .cloned()
            .collect();
        digest.artifacts = self.artifacts.iter().take_while(|a| fits(a)).cloned().collect();
        loop {
            let omitted = total - digest.item_count();
            let text = digest.text(full_ref, full_tokens, budget, omitted);
            if count(&text) <= budget || !digest.drop_one() {
                return RenderedDigest { text, omitted_items: omitted };
            }
        }
    }

    fn item_count(&self) -> usize {
        self.findings.len() + self.decisions.len() + self.open_questions.len() + self.artifacts.len()
    }

    fn drop_one(&mut self) -> bool {
        if self.artifacts.pop().is_some() || self.findings.pop().is_some() || self.decisions.pop().is_some() {
            return true;
        }
        if self.open_questions.pop().is_some() {
            return true;
        }
        if self.objective.chars().count() > 80 {
            self.objective = clip(&self.objective, 80);
            return true;
        }
        false
    }

    fn text(&self, full_ref: &ArtifactRef, full_tokens: u64, budget: u64, omitted: usize) -> String {
        let source = match self.source {
            DigestSource::Structured => "structured",
            DigestSource::Extractive => "extractive (free-text result)",
        };
        let mut text = format!(
            "[delegation digest of {}: {source}; the full result ({full_tokens} tokens) is data_ref {full_ref}, \
             readable with strata_read_output]\nObjective: {}\n",
            self.tool, self.objective
        );
        if let Some(status) = &self.status {
            text.push_str(&format!("Status: {status}\n"));
        }
        if !self.findings.is_empty() {
            text.push_str("Findings:\n");
            for finding in &self.findings {
                text.push_str(&format!("- {}", finding.claim));
                if !finding.evidence_refs.is_empty() {
                    text.push_str(&format!(" (evidence: {})", finding.evidence_refs.join(", ")));
                }
                text.push('\n');
            }
        }
        for (title, items) in [
            ("Decisions", &self.decisions),
            ("Open questions", &self.open_questions),
            ("Artifacts", &self.artifacts),
        ] {
            if !items.is_empty() {
                text.push_str(&format!("{title}:\n"));
                for item in items {
                    text.push_str(&format!("- {item}\n"));
                }
            }
        }
        if omitted > 0 {
            text.push_str(&format!(
                "[{omitted} items left out to fit the {budget}-token parent-return budget; they are in the full result]\n"
            ));
        }
        text
    }
}

fn is_list_item(line: &str) -> bool {
    line.starts_with("- ")
        || line.starts_with("* ")
        || line.starts_with("• ")
        || line
            .split_once(". ")
            .is_some_and(|(number, _)| !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()))
}

fn looks_like_artifact(word: &str) -> bool {
    if word.starts_with("http://") || word.starts_with("https://") || word.starts_with("art:sha256:") {
        return true;
    }
    let Some((stem, extension)) = word.rsplit_once('.') else { return false };
    (word.contains('/') || word.starts_with("./"))
        && !stem.is_empty()
        && (1..=5).contains(&extension.len())
        && extension.chars().all(|c| c.is_ascii_alphanumeric())
}

fn clip(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    clipped.push('…');
    clipped
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn words(text: &str) -> u64 {
        text.split_whitespace().count() as u64
    }

    #[test]
    fn a_seed_000_envelope_is_structured() {
        let output = r#"{"status":"completed","summary":"Found the timeout","findings":[{"finding":"retry loop never backs off","evidence":"auth/retry.py:42"}],"actions_taken":["patched retry.py"],"open_questions":["is 30s the right cap?"],"artifacts":["auth/retry.py"]}"#;
        let digest = ExpertDigest::of_result("task", output);
        assert_eq!(digest.source, DigestSource::Structured);
        assert_eq!(digest.objective, "Found the timeout");
        assert_eq!(digest.findings[0].evidence_refs, vec!["auth/retry.py".to_owned() + ":42"]);
        assert_eq!(digest.decisions, vec!["patched retry.py"]);
        assert_eq!(digest.open_questions, vec!["is 30s the right cap?"]);
    }

    #[test]
    fn free_text_is_extractive_and_keeps_questions_apart() {
        let output = "Looked into the flaky test.\n- The fixture leaks a socket in tests/net_test.py\nI decided to pin the port.\nShould CI run it serially?\n";
        let digest = ExpertDigest::of_result("task", output);
        assert_eq!(digest.source, DigestSource::Extractive);
        assert_eq!(digest.objective, "Looked into the flaky test.");
        assert_eq!(digest.findings.len(), 1);
        assert_eq!(digest.decisions, vec!["I decided to pin the port."]);
        assert_eq!(digest.open_questions, vec!["Should CI run it serially?"]);
        assert_eq!(digest.artifacts, vec!["tests/net_test.py"]);
    }

    #[test]
    fn rendering_is_held_to_the_budget_and_says_what_it_left_out() {
        let findings: Vec<String> = (0..200)
            .map(|i| format!(r#"{{"claim":"finding number {i} about the module","evidence":"src/m{i}.rs"}}"#))
            .collect();
        let output = format!(r#"{{"objective":"audit","findings":[{}]}}"#, findings.join(","));
        let digest = ExpertDigest::of_result("task", &output);
        let full = ArtifactRef::for_bytes(output.as_bytes());
        let rendered = digest.render(&full, 5_000, 300, words);
        assert!(words(&rendered.text) <= 300, "{}", rendered.text);
        assert!(rendered.omitted_items > 100);
        assert!(rendered.text.contains(&full.to_string()));
        assert!(rendered.text.contains("finding number 0 "));
        assert!(!rendered.text.contains("finding number 199 "));
    }
}
