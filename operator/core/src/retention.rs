//! Retention classification by policy rules, and cache-aware batched expiry of Ephemeral entries.
//!
//! **Rules.** [`RetentionRule`] is the policy API's rule (`name`, `class` as `Critical`,
//! `Working`, `Reference` or `Ephemeral`, `match: {roles, toolNames, contentRegex}`, `ttlSeconds`):
//! `strata-api` uses this type in the ContextPolicy CRD, so there is one definition. Within a rule all given
//! criteria must hold; a rule with no criteria matches everything. The first matching rule wins;
//! with none, an entry is `Working` with no TTL.
//!
//! **Expiry.** An entry is *expired* when its class is `Ephemeral`, it has a TTL and
//! `now ≥ created_at + ttl`; it is *overdue* when `now ≥ created_at + overdue_factor × ttl`.
//! Critical entries never expire, whatever TTL they are given. Removing entries rewrites the
//! cached prompt from the first removed one on (see [`crate::tool_output::elide`]), so expiry is
//! batched like elision: [`plan_expiry`] proposes removing *all* expired, not yet removed entries
//! together, and only when that batch pays (its expected saving is at least `payback_ratio` × the
//! rewrite cost, by [`RemovalEconomics`]). The TTL is a promise, so one exception bounds the
//! delay: if any candidate is overdue, the batch fires regardless of economics. An expired entry
//! therefore leaves the window at the latest at `overdue_factor × ttl`.

use std::collections::HashSet;

use regex::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::economics::{CachePricing, RemovalEconomics};
use crate::entry::{Entry, EntryId, RetentionClass, Role};

// This is also the policy API's retention rule: strata-api derives the CRD schema, with these
// validation rules, from this type.
/// One classification rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.class != 'Ephemeral' || has(self.ttlSeconds)",
    "message": "an Ephemeral retention rule needs ttlSeconds: say how long such entries stay in the window"
}]))]
pub struct RetentionRule {
    /// Unique name of the rule; layers merge rules by name.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The class given to matching entries.
    #[serde(serialize_with = "serialize_class", deserialize_with = "deserialize_class")]
    #[schemars(schema_with = "class_schema")]
    pub class: RetentionClass,
    /// Which entries the rule matches; all given criteria must hold.
    #[serde(rename = "match")]
    pub matcher: RetentionMatch,
    /// Entries of this rule leave the window after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub ttl_seconds: Option<u32>,
}

/// Criteria of a retention rule; all given criteria must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.roles) || has(self.toolNames) || has(self.contentRegex)",
    "message": "a retention rule's match needs at least one of roles, toolNames or contentRegex; an empty match would classify every entry"
}]))]
pub struct RetentionMatch {
    /// Message roles the rule applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4))]
    pub roles: Option<Vec<Role>>,
    /// Tool names whose calls and results the rule applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub tool_names: Option<Vec<String>>,
    /// RE2-style regular expression the entry's text must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub content_regex: Option<String>,
}

/// The policy spelling of a [`RetentionClass`] (the journal stores it in snake case).
fn class_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Critical", "Working", "Reference", "Ephemeral"]
    })
}

fn class_name(class: RetentionClass) -> &'static str {
    match class {
        RetentionClass::Critical => "Critical",
        RetentionClass::Working => "Working",
        RetentionClass::Reference => "Reference",
        RetentionClass::Ephemeral => "Ephemeral",
    }
}

fn serialize_class<S: Serializer>(class: &RetentionClass, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(class_name(*class))
}

fn deserialize_class<'de, D: Deserializer<'de>>(deserializer: D) -> Result<RetentionClass, D::Error> {
    let text = String::deserialize(deserializer)?;
    match text.as_str() {
        "Critical" => Ok(RetentionClass::Critical),
        "Working" => Ok(RetentionClass::Working),
        "Reference" => Ok(RetentionClass::Reference),
        "Ephemeral" => Ok(RetentionClass::Ephemeral),
        _ => Err(serde::de::Error::custom(format!(
            "unknown retention class {text:?}: expected Critical, Working, Reference or Ephemeral"
        ))),
    }
}

/// A rule set cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RetentionRuleError {
    /// The content regex does not compile.
    #[error("retention rule #{index} {name:?}: invalid contentRegex {pattern:?}: {source}")]
    BadRegex {
        /// Position of the rule.
        index: usize,
        /// Its name.
        name: String,
        /// The pattern.
        pattern: String,
        /// The regex error.
        source: regex::Error,
    },
    /// The rule is inconsistent.
    #[error("retention rule #{index} {name:?}: {problem}")]
    Invalid {
        /// Position of the rule.
        index: usize,
        /// Its name.
        name: String,
        /// What is wrong.
        problem: &'static str,
    },
}

#[derive(Debug, Clone)]
struct CompiledRule {
    rule: RetentionRule,
    regex: Option<Regex>,
}

/// Classifies entries by the first matching rule (no rules: everything is Working).
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    rules: Vec<CompiledRule>,
}

impl Classifier {
    /// Compiles `rules`, rejecting bad regexes, duplicate names, an Ephemeral rule without a TTL,
    /// a zero TTL and a TTL on a Critical rule.
    pub fn new(rules: Vec<RetentionRule>) -> Result<Self, RetentionRuleError> {
        let mut names = HashSet::new();
        let mut compiled = Vec::with_capacity(rules.len());
        for (index, rule) in rules.into_iter().enumerate() {
            let invalid =
                |problem| Err(RetentionRuleError::Invalid { index, name: rule.name.clone(), problem });
            if !names.insert(rule.name.clone()) {
                return invalid("duplicate rule name");
            }
            match (rule.class, rule.ttl_seconds) {
                (RetentionClass::Ephemeral, None) => return invalid("an Ephemeral rule needs ttlSeconds"),
                (RetentionClass::Critical, Some(_)) => return invalid("Critical entries never expire"),
                (_, Some(0)) => return invalid("ttlSeconds must be at least 1"),
                _ => {}
            }
            let regex = match &rule.matcher.content_regex {
                Some(pattern) => {
                    Some(Regex::new(pattern).map_err(|source| RetentionRuleError::BadRegex {
                        index,
                        name: rule.name.clone(),
                        pattern: pattern.clone(),
                        source,
                    })?)
                }
                None => None,
            };
            compiled.push(CompiledRule { rule, regex });
        }
        Ok(Self { rules: compiled })
    }

    /// The class and TTL (seconds) of an entry with this role, text and tool name.
    pub fn classify(&self, role: Role, text: &str, tool_name: Option<&str>) -> (RetentionClass, Option<u32>) {
        self.rules
            .iter()
            .find(|compiled| {
                let matcher = &compiled.rule.matcher;
                matcher.roles.as_ref().is_none_or(|roles| roles.contains(&role))
                    && matcher
                        .tool_names
                        .as_ref()
                        .is_none_or(|names| tool_name.is_some_and(|tool| names.iter().any(|n| n == tool)))
                    && compiled.regex.as_ref().is_none_or(|regex| regex.is_match(text))
            })
            .map_or((RetentionClass::Working, None), |compiled| {
                (compiled.rule.class, compiled.rule.ttl_seconds)
            })
    }
}

/// How expiry is batched.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExpiryPolicy {
    /// A batch fires when its expected saving is at least this multiple of its rewrite cost.
    pub payback_ratio: f64,
    /// An entry past this multiple of its TTL forces a batch.
    pub overdue_factor: u32,
}

impl Default for ExpiryPolicy {
    fn default() -> Self {
        Self { payback_ratio: 1.0, overdue_factor: 2 }
    }
}

/// Expired entries to remove together.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiryBatch {
    /// The entries to remove, in sequence order.
    pub ids: Vec<EntryId>,
    /// Tokens removed from every later call.
    pub saved_tokens: u64,
    /// Index of the first removed entry.
    pub first_changed_index: usize,
    /// The trade: saving against the cache rewrite.
    pub economics: RemovalEconomics,
    /// Whether an overdue entry forced the batch although it does not pay.
    pub forced_by_overdue: bool,
}

/// The entries [`plan_expiry`] looks at: `positions` (ascending) in `entries`. An engine that keeps
/// a [`crate::history_index::EntryIndex`] of its Ephemeral entries gives those, so it does not walk
/// its whole history on every answer.
#[derive(Debug, Clone)]
pub struct ExpiryCandidates<'a, P> {
    /// The whole history (the economics of a batch depend on everything after its first entry).
    pub entries: &'a [Entry],
    /// Ascending positions in `entries` that may be Ephemeral; the others are never expired.
    pub positions: P,
}

impl<'a> ExpiryCandidates<'a, std::ops::Range<usize>> {
    /// Every entry of `entries`.
    pub fn all(entries: &'a [Entry]) -> Self {
        ExpiryCandidates { entries, positions: 0..entries.len() }
    }
}

/// Plans removal of expired Ephemeral entries among `candidates`; `ttl_seconds_of` gives an entry's
/// TTL (e.g. from [`Classifier::classify`]). Returns `None` when nothing is expired, or when the
/// batch neither pays nor contains an overdue entry.
pub fn plan_expiry<'a, P: IntoIterator<Item = usize>>(
    candidates: ExpiryCandidates<'a, P>,
    now_ms: u64,
    already_expired: &HashSet<EntryId>,
    ttl_seconds_of: impl Fn(&Entry) -> Option<u32>,
    policy: &ExpiryPolicy,
    remaining_calls_estimate: u64,
    pricing: CachePricing,
) -> Option<ExpiryBatch> {
    let entries = candidates.entries;
    let mut ids = Vec::new();
    let mut first_changed_index = None;
    let mut saved_tokens = 0u64;
    let mut overdue = false;
    for index in candidates.positions {
        let Some(entry) = entries.get(index) else { continue };
        if entry.retention != RetentionClass::Ephemeral || already_expired.contains(&entry.id) {
            continue;
        }
        let Some(ttl_ms) = ttl_seconds_of(entry).map(|ttl| u64::from(ttl) * 1000) else {
            continue;
        };
        let age_ms = now_ms.saturating_sub(entry.created_at_ms);
        if age_ms < ttl_ms {
            continue;
        }
        overdue |= age_ms >= ttl_ms.saturating_mul(u64::from(policy.overdue_factor));
        saved_tokens += entry.tokens;
        first_changed_index.get_or_insert(index);
        ids.push(entry.id);
    }
    let first_changed_index = first_changed_index?;
    let economics = RemovalEconomics::for_batch(
        entries,
        first_changed_index,
        saved_tokens,
        remaining_calls_estimate,
        pricing,
    );
    let pays = economics.pays_by(policy.payback_ratio);
    (pays || overdue).then_some(ExpiryBatch {
        ids,
        saved_tokens,
        first_changed_index,
        economics,
        forced_by_overdue: overdue && !pays,
    })
}
