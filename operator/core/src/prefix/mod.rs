//! The stable prefix (Tier 1): canonical system prompt, tool schemas and project constants, with a
//! manifest of per-section hashes and token counts.
//!
//! Canonicalisation `strata.canon/v1` (spec §17.8.3):
//! * text (system prompt, constant values): see [`canonicalize_text`] — NFC, LF, trailing
//!   whitespace stripped, blank-line runs collapsed to one, no leading/trailing blank lines;
//! * tool schemas: [`to_canonical_json`] (sorted keys, compact, NFC strings, nothing omitted), one
//!   schema per line, in first-seen order kept by a persisted [`ToolRegistry`];
//! * constants: one `"key":"value"` line per constant (JSON-escaped, NFC key, canonical value), in
//!   sorted key order;
//! * sections always appear in the order system, tools, constants (empty sections included in the
//!   manifest, skipped in the rendered text);
//! * policy precedence is the section order; a change to any rule changes
//!   [`CANONICALIZATION_VERSION`], which is part of the prefix hash and of the cache identity.
//!
//! Volatile material (see [`find_volatile`]) anywhere in a canonical section is an error that names
//! the section. The prefix is a pure function of its sources and the tool registry's state, so
//! identical inputs give byte-identical output; nothing outside the sources (such as the current
//! request) can influence it.

mod canon_text;
mod canonical_json;
mod tool_registry;
mod volatile;

pub use canon_text::{canonicalize_text, normalize_string};
pub use canonical_json::{CanonicalJsonError, to_canonical_json};

use canonical_json::json_string;
pub use tool_registry::{ToolOrderError, ToolRegistry, tool_name};
pub use volatile::{
    DetectorError, MAX_SNIPPET_CHARS, VolatileFinding, VolatileKind, VolatileSplit, find_volatile,
    split_volatile_lines,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::tokens::{TokenCounter, TokenizerKind};

/// Version of the canonicalisation rules; part of every prefix hash and cache identity.
pub const CANONICALIZATION_VERSION: &str = "strata.canon/v1";

/// Separator between non-empty sections in [`StablePrefix::text`].
pub const SECTION_SEPARATOR: &str = "\n\n";

/// Raw material for the stable prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StablePrefixSources {
    /// System and safety policy text.
    pub system_prompt: String,
    /// Tool schemas (Anthropic/MCP `{name, …}` or OpenAI `{type, function: {name, …}}`).
    pub tools: Vec<Value>,
    /// Project constants, rendered in sorted key order.
    pub constants: BTreeMap<String, String>,
}

/// Kind of a stable-prefix section; also fixes the section order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SectionClass {
    /// System and safety policy.
    System,
    /// Tool schemas.
    Tools,
    /// Project constants.
    Constants,
}

impl SectionClass {
    /// All classes in prefix order.
    pub const ORDER: [Self; 3] = [Self::System, Self::Tools, Self::Constants];

    /// The section id used in manifests and hashes.
    pub fn id(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Tools => "tools",
            Self::Constants => "constants",
        }
    }
}

impl std::fmt::Display for SectionClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

/// Manifest entry of one section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Section {
    /// Section id (`system`, `tools`, `constants`).
    pub id: String,
    /// Section kind.
    pub class: SectionClass,
    /// SHA-256 (hex) of the section's canonical bytes.
    pub source_hash: String,
    /// Token count of the canonical text.
    pub tokens: u32,
}

/// Traceability record of a stable prefix (spec §17.7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StablePrefixManifest {
    /// [`CANONICALIZATION_VERSION`] used to build the prefix.
    pub canonicalization_version: String,
    /// Tokenizer the token counts come from.
    pub tokenizer: TokenizerKind,
    /// Sections in prefix order.
    pub sections: Vec<Section>,
    /// SHA-256 (hex) over the version and all sections, framed (see [`prefix_hash`]).
    pub prefix_hash: String,
    /// Sum of the section token counts (separators excluded: providers render them differently).
    pub total_tokens: u32,
}

impl StablePrefixManifest {
    /// Source hash of the section of `class`.
    pub fn section_hash(&self, class: SectionClass) -> Option<&str> {
        self.sections
            .iter()
            .find(|section| section.class == class)
            .map(|section| section.source_hash.as_str())
    }
}

/// One canonical section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalSection {
    /// Section kind.
    pub class: SectionClass,
    /// Canonical text.
    pub text: String,
}

/// Failure to build a stable prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// A section contains volatile material.
    #[error("volatile material in stable-prefix section `{section}`: {}", describe_findings(findings))]
    VolatileMaterial {
        /// The offending section.
        section: SectionClass,
        /// Everything found, in order of position.
        findings: Vec<VolatileFinding>,
    },
    /// The tool list cannot be ordered.
    #[error("cannot order the tools section: {0}")]
    ToolOrder(#[from] ToolOrderError),
    /// A tool schema cannot be rendered canonically.
    #[error("tool `{name}` cannot be rendered canonically: {source}")]
    ToolSchema {
        /// Tool name.
        name: String,
        /// Rendering failure.
        source: CanonicalJsonError,
    },
    /// Two constant keys are equal after NFC normalisation.
    #[error("constants section: keys are equal after Unicode NFC normalisation: {key:?}")]
    DuplicateConstant {
        /// The normalised key.
        key: String,
    },
    /// The volatile-material detector is unavailable.
    #[error(transparent)]
    Detector(#[from] DetectorError),
}

fn describe_findings(findings: &[VolatileFinding]) -> String {
    let Some(first) = findings.first() else {
        return "no findings".to_owned();
    };
    let mut description = format!("{} {:?} at byte {}", first.kind, first.snippet, first.offset);
    if findings.len() > 1 {
        description.push_str(&format!(" (and {} more)", findings.len() - 1));
    }
    description
}

/// The canonical stable prefix and its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StablePrefix {
    sections: Vec<CanonicalSection>,
    manifest: StablePrefixManifest,
}

impl StablePrefix {
    /// Canonicalises `sources`, orders tools through `registry` and counts tokens with `counter`.
    /// The registry is only updated when the prefix is built successfully.
    pub fn build(
        sources: &StablePrefixSources,
        registry: &mut ToolRegistry,
        counter: &TokenCounter,
    ) -> Result<Self, PrefixError> {
        let mut next_registry = registry.clone();
        let texts = [
            canonicalize_text(&sources.system_prompt),
            render_tools(&sources.tools, &mut next_registry)?,
            render_constants(&sources.constants)?,
        ];
        let sections: Vec<CanonicalSection> = SectionClass::ORDER
            .into_iter()
            .zip(texts)
            .map(|(class, text)| CanonicalSection { class, text })
            .collect();
        for section in &sections {
            let findings = find_volatile(&section.text)?;
            if !findings.is_empty() {
                return Err(PrefixError::VolatileMaterial { section: section.class, findings });
            }
        }
        let manifest_sections: Vec<Section> = sections
            .iter()
            .map(|section| Section {
                id: section.class.id().to_owned(),
                class: section.class,
                source_hash: hex::encode(Sha256::digest(section.text.as_bytes())),
                tokens: counter.count(&section.text),
            })
            .collect();
        let manifest = StablePrefixManifest {
            canonicalization_version: CANONICALIZATION_VERSION.to_owned(),
            tokenizer: counter.kind(),
            total_tokens: manifest_sections
                .iter()
                .fold(0u32, |total, section| total.saturating_add(section.tokens)),
            prefix_hash: prefix_hash(&sections),
            sections: manifest_sections,
        };
        *registry = next_registry;
        Ok(Self { sections, manifest })
    }

    /// Canonical sections in prefix order.
    pub fn sections(&self) -> &[CanonicalSection] {
        &self.sections
    }

    /// The section of `class`.
    pub fn section(&self, class: SectionClass) -> Option<&CanonicalSection> {
        self.sections.iter().find(|section| section.class == class)
    }

    /// The manifest (hashes, token counts, version).
    pub fn manifest(&self) -> &StablePrefixManifest {
        &self.manifest
    }

    /// Model-visible text: non-empty sections joined by [`SECTION_SEPARATOR`].
    pub fn text(&self) -> String {
        self.sections
            .iter()
            .filter(|section| !section.text.is_empty())
            .map(|section| section.text.as_str())
            .collect::<Vec<_>>()
            .join(SECTION_SEPARATOR)
    }
}

/// SHA-256 (hex) of the framed prefix: the canonicalisation version, then for every section its
/// id, and its canonical text, each field preceded by its length as a big-endian u64. The framing
/// makes the hash unambiguous (moving text between sections changes it).
pub fn prefix_hash(sections: &[CanonicalSection]) -> String {
    let mut hasher = Sha256::new();
    let mut write_field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    write_field(CANONICALIZATION_VERSION.as_bytes());
    for section in sections {
        write_field(section.class.id().as_bytes());
        write_field(section.text.as_bytes());
    }
    hex::encode(hasher.finalize())
}

fn render_tools(tools: &[Value], registry: &mut ToolRegistry) -> Result<String, PrefixError> {
    let ordered = registry.arrange(tools)?;
    let mut lines = Vec::with_capacity(ordered.len());
    for tool in ordered {
        let line = to_canonical_json(tool).map_err(|source| PrefixError::ToolSchema {
            name: tool_name(tool).unwrap_or_default().to_owned(),
            source,
        })?;
        lines.push(line);
    }
    Ok(lines.join("\n"))
}

fn render_constants(constants: &BTreeMap<String, String>) -> Result<String, PrefixError> {
    let mut normalized: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in constants {
        let key = normalize_string(key);
        if normalized.contains_key(&key) {
            return Err(PrefixError::DuplicateConstant { key });
        }
        normalized.insert(key, canonicalize_text(value));
    }
    let lines: Vec<String> = normalized
        .iter()
        .map(|(key, value)| format!("{}:{}", json_string(key), json_string(value)))
        .collect();
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests;
