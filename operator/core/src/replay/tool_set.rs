//! A synthetic large tool set for replays of sessions whose logs kept no tool schemas (the
//! corpus's Claude Code sessions record the calls, never the schemas). It names the tools those
//! sessions call (so calls land on offered tools) and pads with MCP-style connector tools up to a
//! token target. Every description and parameter was written for Strata; none is copied from a
//! real harness, so the set stands for a harness's tool block by its size and shape, not its text.

use serde_json::{Map, Value, json};

use crate::tokens::TokenCounter;

/// A parameter: name, JSON type, description.
type Parameter = (&'static str, &'static str, &'static str);

/// A tool: name, description, parameters.
type ToolSpec = (&'static str, &'static str, &'static [Parameter]);

/// The tools the corpus's coding-agent sessions call, each with its purpose and parameters.
const CORE_TOOLS: &[ToolSpec] = &[
    (
        "Bash",
        "Run a shell command in a persistent session and return its standard output and error. \
      Use it for builds, tests, git and package managers; prefer the dedicated file tools for reading \
      and editing files. Long-running commands can run in the background.",
        &[
            ("command", "string", "The command line to run."),
            ("timeout", "integer", "Milliseconds before the command is stopped (at most ten minutes)."),
            ("description", "string", "Five to ten words saying what the command does."),
            ("run_in_background", "boolean", "Start the command and return at once; read its output later."),
        ],
    ),
    (
        "Read",
        "Read a file from the local filesystem with line numbers. Reads the whole file by default; \
      give an offset and a limit for long files. Images and notebooks are rendered.",
        &[
            ("file_path", "string", "Absolute path of the file."),
            ("offset", "integer", "First line to read."),
            ("limit", "integer", "Number of lines to read."),
        ],
    ),
    (
        "Edit",
        "Replace an exact string in a file with another. The old string must occur once unless \
      replace_all is set; read the file before editing it.",
        &[
            ("file_path", "string", "Absolute path of the file to change."),
            ("old_string", "string", "The exact text to replace."),
            ("new_string", "string", "The text to put in its place."),
            ("replace_all", "boolean", "Replace every occurrence."),
        ],
    ),
    (
        "Write",
        "Write a file, replacing it if it exists. Prefer Edit for changes to existing files.",
        &[
            ("file_path", "string", "Absolute path of the file."),
            ("content", "string", "The full content to write."),
        ],
    ),
    (
        "Glob",
        "Find files whose paths match a glob pattern, newest first.",
        &[
            ("pattern", "string", "Glob such as src/**/*.rs."),
            ("path", "string", "Directory to search; the working directory by default."),
        ],
    ),
    (
        "Grep",
        "Search file contents with a regular expression and list matching files, lines or counts.",
        &[
            ("pattern", "string", "Regular expression."),
            ("path", "string", "File or directory to search."),
            ("glob", "string", "Only files matching this glob."),
            ("output_mode", "string", "content, files_with_matches or count."),
            ("context", "integer", "Lines of context around each match."),
            ("case_insensitive", "boolean", "Ignore case."),
        ],
    ),
    (
        "Task",
        "Start a sub-agent that works on a self-contained task with its own context and returns \
      one final report. Give it a complete brief: it sees nothing of this conversation.",
        &[
            ("description", "string", "Three to five words naming the task."),
            ("prompt", "string", "The full brief for the sub-agent."),
            ("subagent_type", "string", "Which kind of sub-agent to start."),
        ],
    ),
    (
        "TodoWrite",
        "Create and update the structured task list of the current work: each item has a \
      status of pending, in_progress or completed.",
        &[("todos", "array", "The whole list, each item with content, status and an active form.")],
    ),
    (
        "WebSearch",
        "Search the web and return result titles, links and snippets.",
        &[
            ("query", "string", "The search query."),
            ("allowed_domains", "array", "Only results from these domains."),
            ("blocked_domains", "array", "Never results from these domains."),
        ],
    ),
    (
        "WebFetch",
        "Fetch a URL, convert the page to markdown and answer a prompt about it.",
        &[("url", "string", "The page to fetch."), ("prompt", "string", "What to extract from the page.")],
    ),
    (
        "AskUserQuestion",
        "Ask the user one to four multiple-choice questions when a decision needs them.",
        &[(
            "questions",
            "array",
            "Questions, each with a header, options and whether several may be chosen.",
        )],
    ),
    (
        "Skill",
        "Run a named skill: a packaged set of instructions and scripts for a recurring task.",
        &[("command", "string", "The skill's name.")],
    ),
    (
        "NotebookEdit",
        "Replace, insert or delete one cell of a Jupyter notebook.",
        &[
            ("notebook_path", "string", "Absolute path of the notebook."),
            ("cell_id", "string", "The cell to change."),
            ("new_source", "string", "The cell's new source."),
            ("edit_mode", "string", "replace, insert or delete."),
        ],
    ),
    (
        "mcp__claude-in-chrome__tabs_context_mcp",
        "List the browser tabs of the current window with their \
      titles and URLs.",
        &[],
    ),
    (
        "mcp__claude-in-chrome__navigate",
        "Open a URL in the current browser tab and wait for it to load.",
        &[
            ("url", "string", "The address to open."),
            ("tab_id", "integer", "The tab; the active one by default."),
        ],
    ),
    (
        "mcp__claude-in-chrome__computer",
        "Act on the browser page: click, type, scroll or take a screenshot.",
        &[
            ("action", "string", "click, type, scroll, key or screenshot."),
            ("coordinate", "array", "x and y in page pixels."),
            ("text", "string", "Text to type or key to press."),
        ],
    ),
];

/// Connector families for padding: (server, objects, verbs).
const CONNECTORS: &[(&str, &[&str], &[&str])] = &[
    (
        "github",
        &["issue", "pull_request", "branch", "release", "workflow_run"],
        &["create", "get", "list", "update"],
    ),
    ("jira", &["ticket", "sprint", "comment"], &["create", "get", "search", "transition"]),
    ("slack", &["message", "channel", "thread"], &["post", "list", "search"]),
    ("postgres", &["query", "table", "schema"], &["run", "describe", "list"]),
    ("kubernetes", &["pod", "deployment", "log", "event"], &["get", "list", "describe", "restart"]),
    ("sentry", &["issue", "event", "release"], &["get", "list", "resolve"]),
    ("linear", &["issue", "project", "cycle"], &["create", "get", "list", "update"]),
    ("notion", &["page", "database", "block"], &["create", "get", "query", "update"]),
];

fn parameter_schema(parameters: &[(&str, &str, &str)]) -> Value {
    let mut properties = Map::new();
    for (name, kind, description) in parameters {
        let mut property = json!({"type": kind, "description": description});
        if *kind == "array" {
            property["items"] = json!({"type": "object"});
        }
        properties.insert((*name).to_owned(), property);
    }
    let required: Vec<&str> = parameters.iter().take(1).map(|(name, _, _)| *name).collect();
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn connector_tool(server: &str, object: &str, verb: &str) -> Value {
    let readable = object.replace('_', " ");
    let description = format!(
        "{verb_title} a {server} {readable}. Acts with the connector's configured credentials and only within \
         the projects the connector was granted. Results are returned as JSON with the {readable}'s \
         identifier, its URL and the fields the {server} API reports; lists are paginated, so pass the \
         returned cursor to read further pages. Errors from the {server} API are returned verbatim with their \
         status code. Use the narrowest filters that answer the question: broad listings are slow and large.",
        verb_title = capitalised(verb),
    );
    let parameters: Vec<(String, &str, String)> = vec![
        ("project".into(), "string", format!("The {server} project, workspace or namespace.")),
        (
            format!("{object}_id"),
            "string",
            format!("Identifier of the {readable}; omit it to {verb} by filters."),
        ),
        ("filters".into(), "object", format!("Field filters for the {readable}, e.g. state, owner, labels.")),
        ("fields".into(), "array", format!("Fields of the {readable} to return; all by default.")),
        ("cursor".into(), "string", "Pagination cursor returned by a previous call.".into()),
        ("limit".into(), "integer", "Most items to return (1 to 100).".into()),
        ("body".into(), "string", format!("Text content when the call writes a {readable}.")),
        ("dry_run".into(), "boolean", "Validate the call without changing anything.".into()),
    ];
    let borrowed: Vec<(&str, &str, &str)> =
        parameters.iter().map(|(name, kind, text)| (name.as_str(), *kind, text.as_str())).collect();
    json!({
        "name": format!("mcp__{server}__{verb}_{object}"),
        "description": description,
        "input_schema": parameter_schema(&borrowed),
    })
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// The synthetic tool set in the Anthropic/MCP shape: the coding-agent tools first, then
/// connector tools until the set reaches `target_tokens` (counted with `counter` over each
/// schema's JSON), or every connector tool is in.
pub fn synthetic_tool_set(target_tokens: u64, counter: &TokenCounter) -> Vec<Value> {
    let mut tools: Vec<Value> = CORE_TOOLS
        .iter()
        .map(|(name, description, parameters)| {
            json!({"name": name, "description": description, "input_schema": parameter_schema(parameters)})
        })
        .collect();
    let mut tokens: u64 = tools.iter().map(|tool| u64::from(counter.count(&tool.to_string()))).sum();
    'families: for (server, objects, verbs) in CONNECTORS {
        for object in *objects {
            for verb in *verbs {
                if tokens >= target_tokens {
                    break 'families;
                }
                let tool = connector_tool(server, object, verb);
                tokens += u64::from(counter.count(&tool.to_string()));
                tools.push(tool);
            }
        }
    }
    tools
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tokens::TokenizerKind;

    #[test]
    fn the_set_reaches_its_target_with_unique_names() {
        let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        let tools = synthetic_tool_set(20_000, &counter);
        let tokens: u64 = tools.iter().map(|tool| u64::from(counter.count(&tool.to_string()))).sum();
        assert!((20_000..21_000).contains(&tokens), "{tokens}");
        let mut names: Vec<&str> = tools.iter().filter_map(|tool| tool["name"].as_str()).collect();
        let before = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), before);
        assert!(names.contains(&"Bash") && names.contains(&"Task"));
    }
}
