//! Lazy capability schemas (GCS §17.14, seed 002 items 7–8): over a token threshold, tools the
//! session has not needed are sent as compact summaries (name and one line); a deterministic
//! lexical ranking against the request, and every tool used before, pick the tools that get their
//! full schema in the tool block. The block only grows, in rare batches (the first request, a new
//! request that wants several summarised tools at once), and the tools keep their order. A schema
//! the model needs between batches (`strata_load_tools`, or a call of a summarised tool) is
//! delivered as a tool result appended to the history, which leaves the cached prompt intact.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::prefix::tool_name;

use super::turn::Api;

/// The memory tool that loads full schemas.
pub const LOAD_TOOLS_NAME: &str = "strata_load_tools";

/// Marker ending every summarised tool's description.
const SUMMARY_MARKER: &str = "[schema summarised; strata_load_tools loads it]";

/// When tool schemas are summarised, and how many get their full schema up front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LazyToolsPolicy {
    /// Client tool schemas larger than this many tokens in total are summarised; 0 turns lazy
    /// schemas off.
    pub threshold_tokens: u64,
    /// Tools given their full schema by the ranking (besides every tool used before).
    pub full_schema_tools: usize,
    /// A new request expands the tools its ranking wants only when at least this many of them are
    /// summarised (one cache rewrite for the batch).
    pub batch_tools: usize,
}

impl Default for LazyToolsPolicy {
    fn default() -> Self {
        LazyToolsPolicy { threshold_tokens: 8_000, full_schema_tools: 6, batch_tools: 3 }
    }
}

/// The session's tool view: which tools have their full schema. Persisted with the engine state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolView {
    /// Whether the first selection ran.
    pub initialised: bool,
    /// Tools with their full schema.
    pub full: BTreeSet<String>,
    /// Summarised tools whose full schema was delivered in the history.
    #[serde(default)]
    pub delivered: BTreeSet<String>,
    /// Schemas loaded on the model's demand (`strata_load_tools` or a call of a summarised tool).
    pub loaded_on_demand: u64,
}

/// What the tool block looks like at one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolBlockStats {
    /// Whether schemas are summarised (the client's schemas are over the threshold).
    pub lazy: bool,
    /// Tools sent with their full schema.
    pub full: u64,
    /// Tools sent as a summary.
    pub summarised: u64,
    /// Tokens of the client's tools as sent.
    pub sent_tokens: u64,
    /// Tokens of the client's tools in full.
    pub full_tokens: u64,
}

/// Lower-case words of at least three characters; `snake_case`, `camelCase` and `mcp__a__b`
/// names split into their words.
fn words(text: &str) -> Vec<String> {
    let mut spaced = String::with_capacity(text.len() + 8);
    let mut previous_lower = false;
    for c in text.chars() {
        if c.is_uppercase() && previous_lower {
            spaced.push(' ');
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        spaced.push(if c.is_alphanumeric() { c } else { ' ' });
    }
    spaced.split_whitespace().map(str::to_lowercase).filter(|word| word.chars().count() >= 3).collect()
}

fn description(tool: &Value) -> &str {
    tool.get("description")
        .or_else(|| tool.get("function").and_then(|f| f.get("description")))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The first sentence or line of a description, at most 160 characters.
pub fn one_line(description: &str) -> String {
    let line = description.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or_default();
    let sentence = line.find(". ").map_or(line, |end| &line[..=end]);
    if sentence.chars().count() <= 160 {
        return sentence.to_owned();
    }
    let mut clipped: String = sentence.chars().take(159).collect();
    clipped.push('…');
    clipped
}

/// Tool names ranked against `query`, best first, then in list order: a query word in the name
/// scores 3, in the description 1 (each query word counts once per tool). Tools scoring 0 are
/// left out.
pub fn rank(tools: &[Value], query: &str) -> Vec<String> {
    ToolRanking::new(tools).rank(query)
}

/// The words of a tool list, split once and indexed by word, so that each new request is ranked
/// ([`rank`]) by looking up its own few words: a coding agent's tool block is tens of thousands
/// of tokens, and a client sends it with every request.
#[derive(Debug, Clone, Default)]
pub struct ToolRanking {
    /// The named tools' names, in list order.
    names: Vec<String>,
    /// For each word, the tools that have it and what it scores there: 3 in the name, else 1.
    postings: HashMap<String, Vec<(usize, u64)>>,
}

impl ToolRanking {
    /// Splits the names and descriptions of `tools` (tools without a name are left out).
    pub fn new(tools: &[Value]) -> Self {
        let mut ranking = ToolRanking::default();
        for tool in tools {
            let Some(name) = tool_name(tool) else { continue };
            let index = ranking.names.len();
            ranking.names.push(name.to_owned());
            let mut scores: BTreeMap<String, u64> =
                words(description(tool)).into_iter().map(|word| (word, 1)).collect();
            scores.extend(words(name).into_iter().map(|word| (word, 3)));
            for (word, score) in scores {
                ranking.postings.entry(word).or_default().push((index, score));
            }
        }
        ranking
    }

    /// The tools' names ranked against `query`, as [`rank`] ranks them.
    pub fn rank(&self, query: &str) -> Vec<String> {
        let query: BTreeSet<String> = words(query).into_iter().collect();
        let mut scores: BTreeMap<usize, u64> = BTreeMap::new();
        for postings in query.iter().filter_map(|word| self.postings.get(word)) {
            for &(index, score) in postings {
                *scores.entry(index).or_default() += score;
            }
        }
        let mut scored: Vec<(u64, usize)> = scores.into_iter().map(|(index, score)| (score, index)).collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().map(|(_, index)| self.names[index].clone()).collect()
    }
}

/// A tool's compact summary in `api`'s shape: its name, one line of description and an open
/// parameter object.
pub fn summarise(api: Api, tool: &Value) -> Value {
    let name = tool_name(tool).unwrap_or_default();
    let text = format!("{} {SUMMARY_MARKER}", one_line(description(tool)));
    let parameters = json!({"type": "object", "additionalProperties": true});
    match api {
        Api::OpenAi => json!({
            "type": "function",
            "function": {"name": name, "description": text, "parameters": parameters}
        }),
        Api::Anthropic => json!({"name": name, "description": text, "input_schema": parameters}),
    }
}

/// The `strata_load_tools` schema: (description, parameters).
pub fn load_tools_schema() -> (String, Value) {
    (
        "Load the full parameter schemas of tools listed with a one-line summary (their description ends \
         with \"schema summarised\"). Give every tool you are about to use; their full schemas are in your \
         tool list from your next call."
            .to_owned(),
        json!({
            "type": "object",
            "properties": {
                "names": {"type": "array", "items": {"type": "string"}, "description": "Tool names to load."}
            },
            "required": ["names"]
        }),
    )
}

impl ToolView {
    /// The first selection: the ranking's best `policy.full_schema_tools` against `query`, and
    /// every tool in `used`.
    pub fn initialise(
        &mut self,
        tools: &[Value],
        query: &str,
        used: impl IntoIterator<Item = String>,
        policy: &LazyToolsPolicy,
    ) {
        self.initialised = true;
        self.full.extend(rank(tools, query).into_iter().take(policy.full_schema_tools));
        let offered: BTreeSet<&str> = tools.iter().filter_map(tool_name).collect();
        self.full.extend(used.into_iter().filter(|name| offered.contains(name.as_str())));
    }

    /// A new request's batch: the best tools of `ranking` against `query` that are still
    /// summarised get their full schema when there are at least `policy.batch_tools` of them.
    /// Returns whether the view changed.
    pub fn rerank(&mut self, ranking: &ToolRanking, query: &str, policy: &LazyToolsPolicy) -> bool {
        let wanted: Vec<String> = ranking
            .rank(query)
            .into_iter()
            .take(policy.full_schema_tools)
            .filter(|name| !self.full.contains(name))
            .collect();
        if wanted.is_empty() || wanted.len() < policy.batch_tools.max(1) {
            return false;
        }
        self.full.extend(wanted);
        true
    }

    /// The full schemas of `names` (those among `tools` sent as a summary), on the model's
    /// demand, in the order asked; they count as delivered from now on.
    pub fn load<'t>(&mut self, tools: &'t [Value], names: &[String]) -> Vec<&'t Value> {
        let mut loaded = Vec::new();
        for name in names {
            if self.full.contains(name) {
                continue;
            }
            if let Some(tool) = tools.iter().find(|tool| tool_name(tool) == Some(name.as_str())) {
                if self.delivered.insert(name.clone()) {
                    self.loaded_on_demand += 1;
                }
                if !loaded.iter().any(|known: &&Value| tool_name(known) == Some(name.as_str())) {
                    loaded.push(tool);
                }
            }
        }
        loaded
    }

    /// Whether `name` is sent as a summary and its schema was never delivered.
    pub fn is_unseen(&self, tools: &[Value], name: &str) -> bool {
        self.never_delivered(name) && tools.iter().any(|tool| tool_name(tool) == Some(name))
    }

    /// The names of `tools` sent as a summary whose schema was never delivered, in order.
    pub fn unseen_names<'t>(&self, tools: &'t [Value]) -> impl Iterator<Item = &'t str> {
        tools.iter().filter_map(|tool| tool_name(tool)).filter(|name| self.never_delivered(name))
    }

    fn never_delivered(&self, name: &str) -> bool {
        !self.full.contains(name) && !self.delivered.contains(name)
    }

    /// `tools` (in their order) as sent: full schemas for the selected, summaries for the rest.
    pub fn shape(&self, api: Api, tools: &[Value]) -> Vec<Value> {
        tools
            .iter()
            .map(|tool| match tool_name(tool) {
                Some(name) if !self.full.contains(name) => summarise(api, tool),
                _ => tool.clone(),
            })
            .collect()
    }
}

/// The `strata_load_tools` answer for `loaded` (full schemas in `api`'s shape) and the names
/// asked for that are not summarised tools of the session.
pub fn load_answer(api: Api, loaded: &[&Value], skipped: &[&str]) -> String {
    let mut answer = if loaded.is_empty() {
        "No schema loaded.".to_owned()
    } else {
        let names: Vec<&str> = loaded.iter().filter_map(|tool| tool_name(tool)).collect();
        let schemas: Vec<Value> =
            loaded.iter().map(|tool| super::tool_schema::to_api_shape(api, tool)).collect();
        format!(
            "Full schemas of {} (call the tools with these parameters):\n{}",
            names.join(", "),
            Value::Array(schemas)
        )
    };
    if !skipped.is_empty() {
        answer.push_str(&format!(
            "\nNot loaded (already in full in your tool list, or not a tool of this session): {}.",
            skipped.join(", ")
        ));
    }
    answer
}

/// Names in a `strata_load_tools` call's arguments.
pub fn requested_names(arguments_json: &str) -> Result<Vec<String>, String> {
    let value: Value =
        serde_json::from_str(arguments_json).map_err(|error| format!("arguments are not JSON: {error}"))?;
    let names =
        value.get("names").and_then(Value::as_array).ok_or("`names` must be an array of tool names")?;
    Ok(names.iter().filter_map(Value::as_str).map(str::to_owned).collect())
}

/// Tokens of each tool's schema (`count` counts a text), by name.
pub fn schema_tokens(tools: &[Value], count: impl Fn(&str) -> u64) -> BTreeMap<String, u64> {
    tools.iter().filter_map(|tool| Some((tool_name(tool)?.to_owned(), count(&tool.to_string())))).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tools() -> Vec<Value> {
        vec![
            json!({"name": "Bash", "description": "Run a shell command.", "input_schema": {"type": "object"}}),
            json!({"name": "WebFetch", "description": "Fetch a web page by URL.", "input_schema": {"type": "object"}}),
            json!({"name": "mcp__github__create_issue", "description": "Create a GitHub issue.", "input_schema": {"type": "object"}}),
            json!({"name": "Read", "description": "Read a file from disk.", "input_schema": {"type": "object"}}),
        ]
    }

    #[test]
    fn ranking_is_lexical_and_deterministic() {
        assert_eq!(
            rank(&tools(), "please create an issue on github for this file"),
            ["mcp__github__create_issue", "Read"]
        );
        assert_eq!(rank(&tools(), "fetch the page"), ["WebFetch"]);
        assert!(rank(&tools(), "xy").is_empty());
    }

    proptest::proptest! {
        /// The index ranks as scoring every tool against every query word would: 3 for a word of
        /// the name, else 1 for a word of the description, best first, then in list order.
        #[test]
        fn the_index_ranks_as_scoring_every_tool_does(
            names in proptest::collection::vec("(read|write|file|grep|web)(_(read|page|file))?", 0..8),
            descriptions in proptest::collection::vec("((read|page|file|shell|web|the) ){0,5}", 8),
            query in "((read|page|file|shell|web|grep|Read|the) ){0,6}",
        ) {
            let tools: Vec<Value> = names
                .iter()
                .zip(&descriptions)
                .map(|(name, description)| json!({"name": name, "description": description}))
                .collect();
            let asked: BTreeSet<String> = words(&query).into_iter().collect();
            let mut expected: Vec<(u64, usize, String)> = Vec::new();
            for (index, (name, description)) in names.iter().zip(&descriptions).enumerate() {
                let (name_words, description_words) = (words(name), words(description));
                let score: u64 = asked
                    .iter()
                    .map(|word| if name_words.contains(word) { 3 } else { u64::from(description_words.contains(word)) })
                    .sum();
                if score > 0 {
                    expected.push((score, index, name.clone()));
                }
            }
            expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let expected: Vec<String> = expected.into_iter().map(|(_, _, name)| name).collect();
            proptest::prop_assert_eq!(rank(&tools, &query), expected);
        }
    }

    #[test]
    fn the_view_grows_in_batches_and_keeps_the_order() {
        let policy = LazyToolsPolicy { threshold_tokens: 1, full_schema_tools: 1, batch_tools: 2 };
        let mut view = ToolView::default();
        view.initialise(&tools(), "fetch the page", ["Bash".to_owned(), "Gone".to_owned()], &policy);
        assert_eq!(view.full, ["Bash", "WebFetch"].map(str::to_owned).into());
        assert!(
            !view.rerank(&ToolRanking::new(&tools()), "read a file", &policy),
            "one wanted tool is not a batch"
        );
        let shaped = view.shape(Api::Anthropic, &tools());
        let names: Vec<&str> = shaped.iter().filter_map(tool_name).collect();
        assert_eq!(names, ["Bash", "WebFetch", "mcp__github__create_issue", "Read"]);
        assert!(shaped[3]["description"].as_str().unwrap().contains("schema summarised"));
        assert_eq!(shaped[0], tools()[0]);
        assert!(view.is_unseen(&tools(), "Read"));
        let tools = tools();
        let loaded = view.load(&tools, &["Read".into(), "Nope".into(), "Bash".into()]);
        assert_eq!(loaded, [&tools[3]], "only a summarised tool is loaded");
        assert_eq!(view.loaded_on_demand, 1);
        assert!(!view.is_unseen(&tools, "Read"));
        assert_eq!(view.shape(Api::Anthropic, &tools), shaped, "loading leaves the tool block alone");
    }
}
