//! Deterministic pattern extraction from entry text: decision, constraint, question, task, blocker
//! and approval lines, file paths, shell commands and their side effects.

use std::sync::OnceLock;

use regex::{Regex, RegexSet};

use crate::entry::{Entry, Role};

/// What a line of text signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineSignal {
    /// `Objective:` / `Goal:` lines.
    Objective,
    /// Choices made: `Decision:`, "we decided", "I'll", "let's".
    Decision,
    /// Hard rules: `Constraint:`, must / never / do not (from users and system prompts).
    Constraint,
    /// `Question:` / `Open question:` / `Unresolved:` lines.
    Question,
    /// `Resolved:` / `Answered:` lines that close a question.
    Resolution,
    /// `TODO`, `FIXME`, `Next step:`, `- [ ]`.
    Todo,
    /// `Done:`, `- [x]`, "I have fixed …".
    Done,
    /// `Blocker:`, "blocked by".
    Blocker,
    /// Approvals: `Approved:`, "LGTM", "go ahead" (from users).
    Approval,
}

const ORDERED: [LineSignal; 9] = [
    LineSignal::Resolution,
    LineSignal::Question,
    LineSignal::Objective,
    LineSignal::Blocker,
    LineSignal::Approval,
    LineSignal::Done,
    LineSignal::Todo,
    LineSignal::Constraint,
    LineSignal::Decision,
];

fn patterns() -> &'static (RegexSet, Regex) {
    static PATTERNS: OnceLock<(RegexSet, Regex)> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let set = RegexSet::new([
            r"(?i)^(resolved|answered|answer)\s*:",
            r"(?i)^(open questions?|questions?|unresolved|q)\s*:",
            r"(?i)^(objective|goal|active objective)\s*:",
            r"(?i)^(blockers?|blocked)\s*:|\bblocked (by|on)\b",
            r"(?i)^(approved|approval)\s*[:.!]|\b(lgtm|go ahead|you may proceed|permission granted)\b",
            r"(?i)^(done|completed|fixed)\s*:|^\[x\]|\b(I|we) ?(have|'ve) (now )?(fixed|implemented|added|completed|finished|updated|resolved)\b",
            r"(?i)^(todo|fixme|next steps?|next)\s*:|^\[ \]|\b(TODO|FIXME)\b",
            r"(?i)^(constraints?|requirements?|rules?|policy)\s*:|\b(must|must not|mustn't|never|always|do not|don't|shall not|is not allowed|are not allowed)\b",
            r"(?i)^(decisions?|decided)\s*:|\b(we|I) (decided|have decided|chose|will|'ll|am going to|are going to)\b|\b(I'll|we'll|let's|let us|going with)\b",
        ])
        .expect("built-in patterns compile");
        let bullet = builtin(r"^(?:[-*•>]+\s*|\d+[.)]\s+|#+\s*|THOUGHT:\s*)+");
        (set, bullet)
    })
}

/// Compiles one of this module's fixed patterns; they are covered by the unit tests.
fn builtin(pattern: &str) -> Regex {
    Regex::new(pattern).expect("built-in pattern compiles")
}

/// Strips list bullets, heading marks and a `THOUGHT:` prefix from a trimmed line.
pub fn strip_bullet(line: &str) -> &str {
    let trimmed = line.trim();
    match patterns().1.find(trimmed) {
        Some(found) if found.start() == 0 => trimmed[found.end()..].trim_start(),
        _ => trimmed,
    }
}

/// Classifies one line written by `role`. Tool output never carries decisions, constraints or
/// tasks (code comments and logs would drown the real ones).
pub fn classify(role: Role, tool_output: bool, line: &str) -> Option<LineSignal> {
    let text = strip_bullet(line);
    if text.len() < 3 {
        return None;
    }
    let matches = patterns().0.matches(text);
    if !matches.matched_any() {
        return None;
    }
    ORDERED.iter().enumerate().find_map(|(index, signal)| {
        if !matches.matched(index) {
            return None;
        }
        let allowed = match signal {
            LineSignal::Constraint => !tool_output && matches!(role, Role::User | Role::System),
            LineSignal::Approval => !tool_output && role == Role::User,
            LineSignal::Decision | LineSignal::Todo | LineSignal::Done => !tool_output,
            _ => true,
        };
        allowed.then_some(*signal)
    })
}

/// Whether an entry is tool output: role `tool`, structured tool results, or a driver message that
/// reports a command's outcome (mini-swe-agent's `<returncode>` convention).
pub fn is_tool_output(entry: &Entry) -> bool {
    entry.role == Role::Tool
        || !entry.content.tool_results.is_empty()
        || (entry.role == Role::User && {
            let start = entry.content.text.trim_start();
            start.starts_with("<returncode>") || start.starts_with("<output>")
        })
}

/// File paths mentioned in `text`, in order of appearance (may repeat).
pub fn file_paths(text: &str) -> Vec<String> {
    static PATH: OnceLock<Regex> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        builtin(
            r"(?:^|[\s`'(\[=:,])((?:\.{0,2}/)?(?:[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*/)+[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*\.[A-Za-z][A-Za-z0-9]{0,7}|[A-Za-z0-9_-]+\.(?:rs|py|pyi|js|mjs|ts|tsx|jsx|go|java|kt|c|h|cc|cpp|hpp|rb|php|cs|swift|toml|yaml|yml|json|md|rst|txt|cfg|ini|sh|sql|html|css|lock|proto))\b",
        )
    });
    let mut found = Vec::new();
    for captures in path.captures_iter(text) {
        let Some(matched) = captures.get(1) else { continue };
        let candidate = matched.as_str().trim_start_matches("./");
        let candidate =
            candidate.strip_prefix("a/").or_else(|| candidate.strip_prefix("b/")).unwrap_or(candidate);
        if !candidate.is_empty() && !candidate.contains("://") {
            found.push(candidate.to_owned());
        }
    }
    found
}

/// Files named by unified-diff headers (`diff --git a/X b/X`, `+++ b/X`): the files a patch changes.
pub fn diff_files(text: &str) -> Vec<String> {
    let mut files = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("diff --git a/") {
            if let Some((file, _)) = rest.split_once(" b/") {
                files.push(file.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("+++ b/") {
            files.push(rest.trim().to_owned());
        }
    }
    files
}

/// Shell commands in fenced ```bash / ```sh blocks of `text`, one per non-empty line.
pub fn fenced_commands(text: &str) -> Vec<&str> {
    let mut commands = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(tag) = trimmed.strip_prefix("```") {
            inside = !inside && matches!(tag.trim(), "bash" | "sh" | "shell" | "console" | "");
            continue;
        }
        if inside && !trimmed.is_empty() {
            commands.push(trimmed);
        }
    }
    commands
}

/// What running a command means for the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandEffect {
    /// Changes files or the environment: a side effect not to repeat.
    SideEffect,
    /// Produces or submits the final result (a patch, a submission marker).
    Milestone,
}

/// Classifies a command (shell text or a tool call's name and arguments).
pub fn command_effect(command: &str) -> Option<CommandEffect> {
    static EFFECTS: OnceLock<(Regex, Regex)> = OnceLock::new();
    let (milestone, side_effect) = EFFECTS.get_or_init(|| {
        (
            builtin(r"COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT|MINI_SWE_AGENT_FINAL_OUTPUT|(?:^|[;&|]\s*)git diff\b"),
            builtin(
                r"(?i)\bsed\s+-i|\btee\b|(?:^|[^0-9&<>])>{1,2}\s*[A-Za-z0-9_./~-]+|\b(rm|mv|cp|mkdir|touch|chmod|patch|truncate)\s|\bgit\s+(commit|apply|am|checkout|reset|push|merge|rebase|stash|add)\b|\b(pip|pip3|npm|yarn|cargo|apt-get|apt)\s+(install|add|remove|uninstall)\b|\b(write_file|edit_file|create_file|delete_file|apply_patch|str_replace)\b",
            ),
        )
    });
    if milestone.is_match(command) {
        Some(CommandEffect::Milestone)
    } else if side_effect.is_match(command.replace("2>&1", "").replace(">/dev/null", "").as_str()) {
        Some(CommandEffect::SideEffect)
    } else {
        None
    }
}

/// Open questions carried in a structured sub-agent envelope (`"open_questions": ["…"]`, seed 000).
pub fn envelope_open_questions(text: &str) -> Vec<String> {
    let trimmed = text.trim();
    if !trimmed.starts_with('{') || !trimmed.contains("open_questions") {
        return Vec::new();
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(trimmed) else { return Vec::new() };
    value["open_questions"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().or_else(|| item["question"].as_str()))
                .map(str::to_owned)
                .filter(|q| !q.trim().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Lower-cased words of `text` (letters and digits), for tolerant matching.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

/// Whether `needle` is represented in `haystack`: its normalised text is contained, or at least
/// 80% of its distinct words appear.
pub fn represented_in(needle: &str, haystack: &str) -> bool {
    let needle_words = words(needle);
    if needle_words.is_empty() {
        return true;
    }
    let normal_needle = needle_words.join(" ");
    let hay_words = words(haystack);
    let normal_hay = hay_words.join(" ");
    if normal_hay.contains(&normal_needle) {
        return true;
    }
    let hay: std::collections::HashSet<&str> = hay_words.iter().map(String::as_str).collect();
    let distinct: std::collections::HashSet<&str> = needle_words.iter().map(String::as_str).collect();
    let present = distinct.iter().filter(|w| hay.contains(*w)).count();
    present * 5 >= distinct.len() * 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_lines_by_role() {
        assert_eq!(classify(Role::User, false, "- Open question: which region?"), Some(LineSignal::Question));
        assert_eq!(classify(Role::User, false, "You must not touch prod."), Some(LineSignal::Constraint));
        assert_eq!(classify(Role::Assistant, false, "You must not touch prod."), None);
        assert_eq!(
            classify(Role::Assistant, false, "THOUGHT: I'll patch the retry loop."),
            Some(LineSignal::Decision)
        );
        assert_eq!(classify(Role::Tool, true, "# TODO: refactor"), None);
        assert_eq!(classify(Role::Assistant, false, "TODO: add a test"), Some(LineSignal::Todo));
        assert_eq!(classify(Role::User, false, "LGTM, go ahead"), Some(LineSignal::Approval));
        assert_eq!(
            classify(Role::User, false, "Resolved: region is eu-west-1"),
            Some(LineSignal::Resolution)
        );
    }

    #[test]
    fn finds_paths_diffs_and_commands() {
        let text = "edit `src/auth.py` and ./lib/retry.rs, see https://x.io/a/b.html and setup.cfg";
        assert_eq!(file_paths(text), vec!["src/auth.py", "lib/retry.rs", "setup.cfg"]);
        assert_eq!(diff_files("diff --git a/x/y.py b/x/y.py\n+++ b/x/y.py\n"), vec!["x/y.py", "x/y.py"]);
        let message = "THOUGHT: go\n\n```bash\nsed -i 's/a/b/' f.py\n```\n";
        assert_eq!(fenced_commands(message), vec!["sed -i 's/a/b/' f.py"]);
        assert_eq!(command_effect("sed -i 's/a/b/' f.py"), Some(CommandEffect::SideEffect));
        assert_eq!(command_effect("grep -n foo f.py 2>&1"), None);
        assert_eq!(
            command_effect("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A"),
            Some(CommandEffect::Milestone)
        );
        assert!(represented_in("Which region?", "Open: which REGION should we use"));
        assert!(!represented_in("Which region?", "nothing here"));
    }
}
