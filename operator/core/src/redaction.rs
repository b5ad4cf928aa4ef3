//! Credential redaction: known secret shapes (and a policy's extra patterns) are replaced before an entry is persisted.

use std::borrow::Cow;

use regex::{Regex, RegexSet};

/// A kind of secret the redactor recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretKind {
    /// An AWS access key id (AKIA…, ASIA…).
    AwsAccessKeyId,
    /// An AWS secret access key assigned to a recognisable name.
    AwsSecretAccessKey,
    /// A PEM-encoded private key block.
    PemPrivateKey,
    /// An HTTP bearer token.
    BearerToken,
    /// A provider API key with a known prefix (OpenAI, Anthropic, GitHub, Slack, Google, Stripe).
    ApiKey,
    /// A value assigned to a key named like `api_key`, `secret`, `token` or `password`.
    AssignedSecret,
    /// A match of one of the policy's `redaction.extraPatterns`.
    Custom,
}

impl SecretKind {
    /// The label written into the replacement, e.g. `[REDACTED:bearer_token]`.
    pub fn label(self) -> &'static str {
        match self {
            SecretKind::AwsAccessKeyId => "aws_access_key_id",
            SecretKind::AwsSecretAccessKey => "aws_secret_access_key",
            SecretKind::PemPrivateKey => "private_key",
            SecretKind::BearerToken => "bearer_token",
            SecretKind::ApiKey => "api_key",
            SecretKind::AssignedSecret => "secret",
            SecretKind::Custom => "custom",
        }
    }
}

/// An extra pattern that is not a valid regular expression.
#[derive(Debug, thiserror::Error)]
#[error("redaction.extraPatterns[{index}] {pattern:?} is not a valid regular expression: {source}")]
pub struct PatternError {
    /// Position in the policy's list.
    pub index: usize,
    /// The pattern.
    pub pattern: String,
    /// The regex error.
    pub source: regex::Error,
}

/// One rule: a pattern, and which capture group holds the secret (0 = the whole match).
#[derive(Clone)]
struct Rule {
    kind: SecretKind,
    regex: Regex,
    group: usize,
}

/// One redacted span of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was found.
    pub kind: SecretKind,
    /// Byte offset in the original text.
    pub start: usize,
    /// Byte length in the original text.
    pub len: usize,
}

/// The result of redacting a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redacted<'a> {
    /// The text with every secret replaced; borrowed when nothing was found.
    pub text: Cow<'a, str>,
    /// What was replaced, in text order.
    pub findings: Vec<Finding>,
}

/// Redacts credentials; build once per policy and reuse.
#[derive(Clone)]
pub struct Redactor {
    rules: Vec<Rule>,
    /// Every rule's pattern in one set, so a text with no secret (nearly every text) is scanned
    /// once, and only the rules that match are run for their capture groups. `None` when the
    /// patterns together exceed the regex engine's size limit (each compiles alone): then every rule
    /// runs on every text, as without the set.
    any: Option<RegexSet>,
}

/// The built-in shapes: (kind, pattern, capture group holding the secret).
const BUILTIN: &[(SecretKind, &str, usize)] = &[
    (
        SecretKind::PemPrivateKey,
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
        0,
    ),
    (SecretKind::AwsAccessKeyId, r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b", 0),
    (
        SecretKind::AwsSecretAccessKey,
        r#"(?i)aws_?secret_?access_?key["']?\s*[:=]\s*["']?([A-Za-z0-9/+=]{40})\b"#,
        1,
    ),
    (SecretKind::BearerToken, r"(?i)\bbearer\s+([A-Za-z0-9\-._~+/]{16,}=*)", 1),
    (SecretKind::ApiKey, r"\bsk-ant-[A-Za-z0-9_\-]{20,}", 0),
    (SecretKind::ApiKey, r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}", 0),
    (SecretKind::ApiKey, r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}\b", 0),
    (SecretKind::ApiKey, r"\bgithub_pat_[A-Za-z0-9_]{22,}\b", 0),
    (SecretKind::ApiKey, r"\bxox[abprs]-[A-Za-z0-9\-]{10,}", 0),
    (SecretKind::ApiKey, r"\bAIza[0-9A-Za-z_\-]{35}\b", 0),
    (SecretKind::ApiKey, r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}\b", 0),
    (
        SecretKind::AssignedSecret,
        r#"(?i)\b(?:api[_-]?key|secret[_-]?key|access[_-]?token|auth[_-]?token|password|passwd)["']?\s*[:=]\s*["']?([^\s"',;]{12,})"#,
        1,
    ),
];

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("rules", &self.rules.len()).finish()
    }
}

impl Redactor {
    /// A redactor for the built-in shapes plus `extra_patterns`; `None` when redaction is disabled.
    pub fn new(enabled: bool, extra_patterns: &[String]) -> Result<Option<Self>, PatternError> {
        if !enabled {
            return Ok(None);
        }
        let mut rules = Vec::with_capacity(BUILTIN.len() + extra_patterns.len());
        for (kind, pattern, group) in BUILTIN {
            // The built-in patterns are constants covered by tests; a failure here is a programming error
            // surfaced as a PatternError rather than a panic.
            let regex = Regex::new(pattern).map_err(|source| PatternError {
                index: usize::MAX,
                pattern: (*pattern).to_string(),
                source,
            })?;
            rules.push(Rule { kind: *kind, regex, group: *group });
        }
        for (index, pattern) in extra_patterns.iter().enumerate() {
            let regex = Regex::new(pattern).map_err(|source| PatternError {
                index,
                pattern: pattern.clone(),
                source,
            })?;
            rules.push(Rule { kind: SecretKind::Custom, regex, group: 0 });
        }
        let any = RegexSet::new(rules.iter().map(|rule| rule.regex.as_str())).ok();
        Ok(Some(Redactor { rules, any }))
    }

    /// Replace every secret in `text` with `[REDACTED:<kind>]`. Overlapping findings merge.
    pub fn redact<'a>(&self, text: &'a str) -> Redacted<'a> {
        let mut spans: Vec<Finding> = Vec::new();
        let matching: Vec<&Rule> = match &self.any {
            Some(set) => set.matches(text).iter().map(|index| &self.rules[index]).collect(),
            None => self.rules.iter().collect(),
        };
        for rule in matching {
            for captures in rule.regex.captures_iter(text) {
                if let Some(secret) = captures.get(rule.group).filter(|m| !m.is_empty()) {
                    spans.push(Finding { kind: rule.kind, start: secret.start(), len: secret.len() });
                }
            }
        }
        if spans.is_empty() {
            return Redacted { text: Cow::Borrowed(text), findings: spans };
        }
        spans.sort_by_key(|f| (f.start, std::cmp::Reverse(f.len)));
        let mut merged: Vec<Finding> = Vec::with_capacity(spans.len());
        for span in spans {
            match merged.last_mut() {
                Some(last) if span.start < last.start + last.len => {
                    let end = (last.start + last.len).max(span.start + span.len);
                    last.len = end - last.start;
                }
                _ => merged.push(span),
            }
        }
        let mut out = String::with_capacity(text.len());
        let mut cursor = 0;
        for finding in &merged {
            out.push_str(&text[cursor..finding.start]);
            out.push_str("[REDACTED:");
            out.push_str(finding.kind.label());
            out.push(']');
            cursor = finding.start + finding.len;
        }
        out.push_str(&text[cursor..]);
        Redacted { text: Cow::Owned(out), findings: merged }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn redactor(extra: &[&str]) -> Redactor {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Redactor::new(true, &extra).unwrap().unwrap()
    }

    fn assert_redacts(input: &str, secret: &str, kind: SecretKind) {
        let result = redactor(&[]).redact(input);
        assert!(!result.text.contains(secret), "{input:?} kept the secret: {}", result.text);
        assert!(result.text.contains(&format!("[REDACTED:{}]", kind.label())), "{input:?} → {}", result.text);
    }

    #[test]
    fn known_shapes_are_redacted() {
        assert_redacts(
            "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
            "AKIAIOSFODNN7EXAMPLE",
            SecretKind::AwsAccessKeyId,
        );
        assert_redacts(
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            SecretKind::AwsSecretAccessKey,
        );
        assert_redacts(
            "curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc123def456'",
            "eyJhbGciOiJIUzI1NiJ9",
            SecretKind::BearerToken,
        );
        assert_redacts(
            "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012345",
            "sk-proj-abcdef",
            SecretKind::ApiKey,
        );
        assert_redacts("key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "sk-ant-api03", SecretKind::ApiKey);
        assert_redacts("token ghp_abcdefghijklmnopqrstuvwxyz0123456789AB", "ghp_abcdef", SecretKind::ApiKey);
        assert_redacts("slack xoxb-123456789012-abcdefghij", "xoxb-1234", SecretKind::ApiKey);
        assert_redacts("stripe sk_live_abcdefghijklmnop1234", "sk_live_", SecretKind::ApiKey);
        assert_redacts(
            "{\"password\": \"correct-horse-battery\"}",
            "correct-horse-battery",
            SecretKind::AssignedSecret,
        );
    }

    #[test]
    fn the_set_prefilter_finds_what_running_every_rule_finds() {
        let with_set = redactor(&[r"internal-[0-9]{6}"]);
        assert!(with_set.any.is_some());
        let without_set = Redactor { rules: with_set.rules.clone(), any: None };
        for text in [
            "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE and password=correct-horse-battery",
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc123def456, ticket internal-123456",
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
            "nothing secret here, just a sha 3f2a9c1e8b7d6f5a4c3b2a1908f7e6d5c4b3a291",
        ] {
            let (fast, slow) = (with_set.redact(text), without_set.redact(text));
            assert_eq!(fast.text, slow.text, "{text:?}");
            assert_eq!(fast.findings, slow.findings, "{text:?}");
        }
    }

    #[test]
    fn pem_blocks_are_redacted_whole() {
        let text = "config:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nabc\n-----END RSA PRIVATE KEY-----\ndone";
        let result = redactor(&[]).redact(text);
        assert_eq!(result.text, "config:\n[REDACTED:private_key]\ndone");
        assert_eq!(result.findings.len(), 1);
    }

    #[test]
    fn ordinary_text_is_untouched_and_borrowed() {
        let text = "fn skip_whitespace() { let sha = \"3f2a9c1e8b7d6f5a4c3b2a1908f7e6d5c4b3a291\"; // the bearer of bad news\n}";
        let result = redactor(&[]).redact(text);
        assert!(matches!(result.text, Cow::Borrowed(_)), "{}", result.text);
        assert!(result.findings.is_empty());
    }

    #[test]
    fn extra_patterns_apply_and_bad_ones_are_named() {
        let result = redactor(&[r"\bEMP-[0-9]{6}\b"]).redact("employee EMP-123456 joined");
        assert_eq!(result.text, "employee [REDACTED:custom] joined");
        let error = Redactor::new(true, &["ok".to_string(), "(unclosed".to_string()]).err().unwrap();
        assert_eq!(error.index, 1);
        assert!(error.to_string().contains("redaction.extraPatterns[1]"));
    }

    #[test]
    fn disabled_redaction_builds_nothing() {
        assert!(Redactor::new(false, &[]).unwrap().is_none());
    }

    #[test]
    fn overlapping_findings_merge_into_one_replacement() {
        let result = redactor(&[]).redact("Authorization: Bearer sk-proj-abcdefghijklmnopqrstuvwxyz0123 end");
        assert_eq!(result.findings.len(), 1, "{result:?}");
        assert!(result.text.ends_with(" end"));
    }
}
