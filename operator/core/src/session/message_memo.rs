//! What the last transparent request's messages were read as, by digests of their exact bytes: a
//! client resends its whole history on every call, so the messages it resends unchanged are neither
//! parsed nor chain-hashed again, and the body's opening it resends unchanged is not even split
//! again.
//!
//! A message is reused only when its bytes equal those of the message at the same position in the
//! last request, and so do the bytes of every message before it. Its reading (the system text or
//! turns it gave) and the chain values of those turns are then the ones computed last time, since
//! both depend on nothing but those bytes.
//!
//! Bytes are compared by a 128-bit XXH3 digest with a seed drawn at start-up, not kept: the memo
//! holds about a hundred bytes a message instead of the last body (1.4 MB at a 200k-token history),
//! and hashing the new body once is quicker than comparing it with the old one. Two different
//! messages are taken for equal only if their digests collide; by chance that is a 2^-128 event,
//! and a client that could make it happen on purpose (without knowing the seed) would only
//! mislead its own session, which its own messages can do anyway.
//!
//! The memo also keeps one digest of the last body's bytes up to the end of its last message. A
//! client that resent every message unchanged sends a body opening with exactly those bytes, so one
//! digest over them, not one per message, finds every message known; that digest is continued over
//! the new messages to become the next request's, and names the request
//! ([`Recollection::body_digest`]). Only when it differs (an edit, a rewind) are the messages
//! compared one by one, to reuse those before the change.
//!
//! The memo holds the last request's turns, which the request takes over and hands back once the
//! engine is done. Of their content it keeps only the latest user turn with text, and of the others
//! only their roles: the engine journals only new turns, and of the old ones it reads only the
//! latest user text (it ranks lazy tools by it). So a reused turn's content is wanted only when the
//! journal lost turns the client had sent before and the request must be journaled whole (a rewind
//! by another conversation's request, a rollback, or an edit of a turn a compaction summarised).
//! The engine then says so
//! ([`ChatRequest::hollow_turns`](super::turn::ChatRequest::hollow_turns)) and the request is read
//! again without the memo. A request that resends the messages before the kept user turn but not
//! that turn unchanged (an edit or a retry of it) is read without the memo too, since its latest
//! user text may be one the memo no longer holds.

use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::{Map, Value};
use twox_hash::XxHash3_128;

use super::request_body::{BodyError, KnownOpening, SplitBody, split_body_after, split_body_known};
use super::transparent::ChainHash;
use super::turn::{Api, Turn};
use crate::entry::{Content, Role};

/// What one message was read as.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reading {
    /// System text (an OpenAI system or developer message).
    pub system: Option<String>,
    /// The turns it holds (one, or several for an Anthropic message mixing tool results and text).
    pub turns: Vec<Turn>,
}

/// One message of a remembered request (where its bytes lay is in the memo's `places`).
#[derive(Debug, Clone)]
struct Remembered {
    /// The digest of the bytes between the previous message's end (or the body's start) and this
    /// message's start: the body's opening, or a separator.
    lead: u128,
    /// The digest of its bytes.
    bytes: u128,
    system: Option<String>,
    /// How many turns it gave.
    turns: usize,
}

/// The digest of a body's bytes from its start to the end of its last message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefix {
    /// Where its last message ends.
    end: usize,
    digest: u128,
}

/// Where a body came from, as the caller that read it says: its number, and how many of its
/// leading bytes it shares with an earlier body. The gateway numbers the bodies it reads into the
/// one buffer it keeps between requests, and compares each with the one the buffer held before
/// (see [`MessageMemo::set_origin`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyOrigin {
    /// The body's number, unique within the process.
    pub id: u64,
    /// The number of an earlier body and how many leading bytes this one has equal to it, byte for
    /// byte.
    pub shares_opening_with: Option<(u64, usize)>,
}

/// The body a memo was read from, by its number, with the digest of its prefix still open.
#[derive(Debug, Clone)]
struct NumberedBody {
    id: u64,
    prefix: OpenDigest,
}

/// A body's opening: its fields before `messages` ([`SplitBody::opening`]) and where its `tools`
/// lay among them ([`SplitBody::opening_tools`]).
#[derive(Debug, Clone)]
struct Opening {
    fields: Map<String, Value>,
    tools: Option<Range<usize>>,
}

/// The last transparent request's messages and turns, with their chain values.
#[derive(Debug, Default)]
pub struct MessageMemo {
    api: Option<Api>,
    /// The body's opening.
    opening: Option<Opening>,
    messages: Vec<Remembered>,
    /// Where each of `messages` lay in the body: the split's own vector, kept.
    places: Vec<Range<usize>>,
    /// An emptied vector of places, the one before `places`: the next split's places are
    /// written into it, so a long history's places are not allocated and freed on every request.
    spare_places: Vec<Range<usize>>,
    turns: Vec<Turn>,
    /// The chain value after each of `turns`.
    chains: Vec<ChainHash>,
    /// The index in `turns` of the one user turn kept whole: the latest with text.
    whole_user: Option<usize>,
    /// The remembered body's bytes up to the end of its last message, digested: a body that opens
    /// with the same bytes resends every remembered message unchanged.
    prefix: Option<Prefix>,
    /// The digest of the new body's bytes that [`Self::split`] found equal to the remembered
    /// prefix, still open: [`Self::read`] continues it to the end of the new body's messages.
    resumed: Option<OpenDigest>,
    /// The remembered body's number, when its reader gave one, and its prefix's digest open.
    numbered: Option<NumberedBody>,
    /// Where the body about to be split came from, when its reader said.
    origin: Option<BodyOrigin>,
}

/// A digest of a body's bytes up to `end`, open to more.
#[derive(Clone)]
struct OpenDigest {
    end: usize,
    hasher: XxHash3_128,
}

impl std::fmt::Debug for OpenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenDigest").field("end", &self.end).finish_non_exhaustive()
    }
}

/// A request's messages, read with the memo's help.
#[derive(Debug)]
pub struct ReadMessages {
    /// System texts in order.
    pub system: Vec<String>,
    /// Every turn in order.
    pub turns: Vec<Turn>,
    /// The chain values of the leading turns that were reused (`known_chains[i]` is the value
    /// after `turns[i]`).
    pub known_chains: Vec<ChainHash>,
    /// How many leading turns were reused: they come without their content, except the latest
    /// user turn with text among them.
    pub hollow_turns: usize,
    /// How many messages were reused rather than parsed.
    pub reused_messages: usize,
    /// What to remember of this request once its turns are chain-hashed.
    pub recollection: Recollection,
}

/// A request's messages, to be remembered with their turns and chain values
/// ([`Recollection::remember`]).
#[derive(Debug, Default)]
pub struct Recollection {
    api: Option<Api>,
    opening: Option<Opening>,
    messages: Vec<Remembered>,
    places: Vec<Range<usize>>,
    spare_places: Vec<Range<usize>>,
    /// The body's bytes up to the end of its last message, digested; none without messages.
    prefix: Option<Prefix>,
    /// The body's number, when its reader gave one, with that digest still open.
    numbered: Option<NumberedBody>,
    /// How many leading turns came from the memo, hollow but for `kept_whole`.
    hollow_turns: usize,
    /// The one turn among those that the memo kept whole, if any.
    kept_whole: Option<usize>,
}

/// Elements a kept vector may always hold, however little of it a request uses.
const KEPT_ELEMENTS_FLOOR: usize = 256;

/// Whether a vector with room for `capacity` elements is worth keeping for a request that used
/// `len` of them: at most four times that, or [`KEPT_ELEMENTS_FLOOR`]. So a history that shrank
/// (a new conversation, a rollback) does not hold the longest one's room for the sidecar's life.
pub(crate) fn worth_keeping(capacity: usize, len: usize) -> bool {
    capacity <= len.max(KEPT_ELEMENTS_FLOOR).saturating_mul(4)
}

/// The seed of every digest here, drawn once per process.
fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    // The standard library seeds its hash maps from the operating system's randomness.
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0x5354_5241_5441_u64))
}

/// The digest of `bytes`, seeded once per process.
fn digest(bytes: &[u8]) -> u128 {
    XxHash3_128::oneshot_with_seed(process_seed(), bytes)
}

impl MessageMemo {
    /// Says where the body the next [`Self::split`] is given came from, if its reader said. A
    /// caller that claims a shared opening must have compared the bytes: the memo takes them as
    /// equal.
    pub fn set_origin(&mut self, origin: Option<BodyOrigin>) {
        self.origin = origin;
    }

    /// Splits `body` (on `api`) at its top level; when it opens with the same bytes as the
    /// remembered body, only what follows the shared messages is read. `known_tools`, the last
    /// request's tool block, is read around where the body carries it unchanged.
    pub fn split(
        &mut self,
        api: Api,
        body: &[u8],
        known_tools: Option<&[u8]>,
    ) -> Result<SplitBody, BodyError> {
        self.resumed = None;
        if self.api == Some(api) && self.opening.is_some() {
            let known = if self.resumes_prefix(body) {
                self.messages.len().min(self.places.len())
            } else {
                // Something before the last remembered message changed: the messages before it
                // are still reused, found one by one.
                let mut start = 0;
                self.messages
                    .iter()
                    .zip(&self.places)
                    .take_while(|(message, place)| {
                        let same = body
                            .get(start..place.start)
                            .is_some_and(|lead| digest(lead) == message.lead)
                            && body.get((*place).clone()).is_some_and(|bytes| digest(bytes) == message.bytes);
                        start = place.end;
                        same
                    })
                    .count()
            };
            if known > 0
                && let Some(opening) = &self.opening
            {
                let spans = &self.places[..known];
                let known = KnownOpening {
                    end: spans[known - 1].end,
                    spans,
                    fields: &opening.fields,
                    tools: opening.tools.clone(),
                };
                return split_body_after(body, &known, known_tools, &mut self.spare_places);
            }
        }
        split_body_known(body, known_tools)
    }

    /// Whether `body` opens with the remembered body's bytes up to the end of its last message,
    /// compared by one digest; if so, that digest is kept open for [`Self::read`].
    fn resumes_prefix(&mut self, body: &[u8]) -> bool {
        let Some(prefix) = self.prefix else { return false };
        let Some(opening) = body.get(..prefix.end) else { return false };
        if let (Some(numbered), Some(origin)) = (&self.numbered, self.origin)
            && numbered.prefix.end == prefix.end
            && origin
                .shares_opening_with
                .is_some_and(|(id, shared)| id == numbered.id && shared >= prefix.end)
        {
            // The reader compared these bytes with the remembered body's: no digest is needed.
            self.resumed = Some(numbered.prefix.clone());
            return true;
        }
        let mut hasher = XxHash3_128::with_seed(process_seed());
        hasher.write(opening);
        let same = hasher.finish_128() == prefix.digest;
        if same {
            self.resumed = Some(OpenDigest { end: prefix.end, hasher });
        }
        same
    }

    /// Reads the messages of `body` (on `api`, as this memo's [`Self::split`] found them): the
    /// leading ones equal to the remembered request's are taken from the memo, the rest read by
    /// `read` from their bytes.
    pub fn read<E>(
        self,
        api: Api,
        body: &Bytes,
        split: SplitBody,
        mut read: impl FnMut(usize, &[u8]) -> Result<Reading, E>,
    ) -> Result<ReadMessages, E> {
        let SplitBody { messages, opening, opening_tools, known, .. } = split;
        let opening = opening.map(|fields| Opening { fields, tools: opening_tools });
        let MessageMemo {
            api: memo_api,
            messages: mut remembered,
            places: earlier_places,
            mut turns,
            mut chains,
            whole_user,
            resumed,
            origin,
            ..
        } = self;
        let bytes_of = |span: &Range<usize>| body.get(span.clone()).unwrap_or_default();
        let mut reused = 0;
        let mut reused_turns = 0;
        if memo_api == Some(api) {
            for (index, (span, earlier)) in messages.iter().zip(&remembered).enumerate() {
                // The split already found the first `known` equal, at the same places.
                if index >= known && digest(bytes_of(span)) != earlier.bytes {
                    break;
                }
                reused += 1;
                reused_turns += earlier.turns;
            }
        }
        if turns.len() < reused_turns || chains.len() < reused_turns {
            (reused, reused_turns) = (0, 0);
        }
        // The reused turns may hold the request's latest user text in a turn the memo hollowed:
        // when they leave out the one it kept whole and the new turns bring no user text.
        let user_text_hollowed = whole_user.is_some_and(|index| index >= reused_turns)
            && turns.iter().take(reused_turns).any(|turn| turn.role == Role::User);
        // Everything is reused in place: the memo's vectors become the request's.
        remembered.truncate(reused);
        turns.truncate(reused_turns);
        chains.truncate(reused_turns);
        let mut system: Vec<String> =
            remembered.iter().filter_map(|earlier| earlier.system.clone()).collect();
        remembered.reserve(messages.len() - reused);
        for (index, span) in messages.iter().enumerate().skip(reused) {
            let raw = bytes_of(span);
            let reading = read(index, raw)?;
            remembered.push(Remembered {
                lead: 0,
                bytes: digest(raw),
                system: reading.system.clone(),
                turns: reading.turns.len(),
            });
            system.extend(reading.system);
            turns.extend(reading.turns);
        }
        let mut hollow_turns = reused_turns;
        if user_text_hollowed && !turns[reused_turns..].iter().any(Turn::has_user_text) {
            // Read the reused messages again, whole; their chain values still hold.
            let mut whole = Vec::with_capacity(turns.len());
            for (index, span) in messages.iter().enumerate().take(reused) {
                whole.extend(read(index, bytes_of(span))?.turns);
            }
            whole.extend(turns.drain(reused_turns..));
            (turns, hollow_turns, reused) = (whole, 0, 0);
        }
        // Where each message is now, and what comes before it: the same as last time for the
        // first `known` when they were reused, since the split found their bytes and places equal.
        let (mut start, kept) = (0, known.min(reused));
        for (index, (message, span)) in remembered.iter_mut().zip(&messages).enumerate() {
            if index >= kept {
                message.lead = digest(body.get(start..span.start).unwrap_or_default());
            }
            start = span.end;
        }
        // The digest of the body up to its last message's end, continued from the bytes the split
        // found shared when it did.
        let mut numbered = None;
        let prefix = messages.last().map(|last| {
            let OpenDigest { end: from, mut hasher } = resumed
                .filter(|open| open.end <= last.end)
                .unwrap_or_else(|| OpenDigest { end: 0, hasher: XxHash3_128::with_seed(process_seed()) });
            hasher.write(body.get(from..last.end).unwrap_or_default());
            let digest = hasher.finish_128();
            numbered = origin
                .map(|origin| NumberedBody { id: origin.id, prefix: OpenDigest { end: last.end, hasher } });
            Prefix { end: last.end, digest }
        });
        let mut spare_places = earlier_places;
        spare_places.clear();
        if !worth_keeping(spare_places.capacity(), messages.len()) {
            spare_places = Vec::new();
        }
        Ok(ReadMessages {
            system,
            turns,
            known_chains: chains,
            hollow_turns,
            reused_messages: reused,
            recollection: Recollection {
                api: Some(api),
                opening,
                messages: remembered,
                places: messages,
                spare_places,
                prefix,
                numbered,
                hollow_turns,
                kept_whole: whole_user.filter(|&index| index < hollow_turns),
            },
        })
    }

    /// How many messages are remembered.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

impl Recollection {
    /// A digest of `body`, the body these messages were read from: the digest of its bytes up to
    /// the end of its last message, which the memo takes anyway, and the bytes after it. A client
    /// that resends its whole history on every call thus has its body named without hashing it a
    /// second time. Two bodies get the same digest only if they are equal or their 128-bit digests
    /// collide. Equal bodies get equal digests within one process: the seed is drawn at start-up.
    pub fn body_digest(&self, body: &[u8]) -> u128 {
        let Some((prefix, rest)) =
            self.prefix.and_then(|prefix| body.get(prefix.end..).map(|rest| (prefix, rest)))
        else {
            return digest(body);
        };
        let mut hasher = XxHash3_128::with_seed(process_seed());
        hasher.write(&(prefix.end as u64).to_le_bytes());
        hasher.write(&prefix.digest.to_le_bytes());
        hasher.write(rest);
        hasher.finish_128()
    }

    /// The memo of this request, given its turns and the chain value after each. An empty memo
    /// when they do not match the messages read (nothing is reused then). Only the latest user
    /// turn with text is kept whole; the others keep their role.
    pub fn remember(self, mut turns: Vec<Turn>, chains: Vec<ChainHash>) -> MessageMemo {
        let expected: usize = self.messages.iter().map(|remembered| remembered.turns).sum();
        if turns.len() != expected || chains.len() != expected {
            return MessageMemo::default();
        }
        let whole_user = turns.iter().rposition(Turn::has_user_text);
        // The turns taken from the memo are hollow already, but for the one it kept whole: only
        // that one and the new turns are emptied, not a long history's every turn again.
        let hollow_from = self.hollow_turns.min(turns.len());
        let earlier_whole = self.kept_whole.filter(|&index| index < hollow_from);
        for index in earlier_whole.into_iter().chain(hollow_from..turns.len()) {
            if Some(index) != whole_user {
                turns[index].content = Content::default();
            }
        }
        MessageMemo {
            api: self.api,
            opening: self.opening,
            messages: self.messages,
            places: self.places,
            spare_places: self.spare_places,
            turns,
            chains,
            whole_user,
            prefix: self.prefix,
            resumed: None,
            numbered: self.numbered,
            origin: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::entry::{Content, Role};

    /// Reads OpenAI-like messages of `{"role", "content"}`, counting the messages parsed.
    fn read(mut memo: MessageMemo, body: &str, parsed: &mut usize) -> ReadMessages {
        let split = memo.split(Api::OpenAi, body.as_bytes(), None).unwrap();
        read_split(memo, body, split, parsed)
    }

    /// [`read`] once `memo` has split `body` into `split`.
    fn read_split(memo: MessageMemo, body: &str, split: SplitBody, parsed: &mut usize) -> ReadMessages {
        let body = Bytes::from(body.to_owned());
        memo.read(Api::OpenAi, &body, split, |_, raw| {
            *parsed += 1;
            let value: serde_json::Value = serde_json::from_slice(raw).unwrap();
            let text = value["content"].as_str().unwrap().to_owned();
            Ok::<_, String>(match value["role"].as_str().unwrap() {
                "system" => Reading { system: Some(text), turns: vec![] },
                "user" => Reading {
                    system: None,
                    turns: vec![Turn { role: Role::User, content: Content::text(text) }],
                },
                _ => Reading {
                    system: None,
                    turns: vec![Turn { role: Role::Assistant, content: Content::text(text) }],
                },
            })
        })
        .unwrap()
    }

    /// Chain values as the engine computes them.
    fn chains_of(turns: &[Turn]) -> Vec<ChainHash> {
        crate::session::transparent::TransparentIndex::in_memory().split(turns, &[]).0
    }

    /// A resumed split writes the messages' places into the vector of the split two requests
    /// back, which the memo kept emptied, with the places a fresh split finds.
    #[test]
    fn a_resumed_split_writes_its_places_into_the_vector_two_requests_back() {
        let messages = r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#;
        let body = Bytes::from(format!(r#"{{"model":"m","messages":{messages}}}"#));
        assert_places_reused(&body, None);
        // A known tool block after the messages, read around (spliced): the same.
        let description = "d".repeat(crate::session::tool_splice::SPLICED_FROM_BYTES);
        let tools =
            format!(r#"[{{"type":"function","function":{{"name":"t","description":"{description}"}}}}]"#);
        let body = Bytes::from(format!(r#"{{"model":"m","messages":{messages},"tools":{tools}}}"#));
        assert_places_reused(&body, Some(tools.as_bytes()));
    }

    /// Sends `body` four times through a memo, the last tool block being `known_tools`: each split
    /// finds the places a fresh split does, and the third and fourth write into the vectors of the
    /// first and second.
    fn assert_places_reused(body: &Bytes, known_tools: Option<&[u8]>) {
        let fresh = split_body_known(body, None).unwrap();
        let mut memo = MessageMemo::default();
        let mut addresses = Vec::new();
        for _ in 0..4 {
            let split = memo.split(Api::OpenAi, body, known_tools).unwrap();
            assert_eq!((&split.messages, &split.tools), (&fresh.messages, &fresh.tools));
            addresses.push(split.messages.as_ptr());
            let read = memo
                .read(Api::OpenAi, body, split, |_, raw| {
                    let value: serde_json::Value = serde_json::from_slice(raw).unwrap();
                    let text = value["content"].as_str().unwrap().to_owned();
                    Ok::<_, String>(Reading {
                        system: None,
                        turns: vec![Turn { role: Role::User, content: Content::text(text) }],
                    })
                })
                .unwrap();
            let chains = chains_of(&read.turns);
            memo = read.recollection.remember(read.turns, chains);
        }
        assert_eq!(addresses[2], addresses[0], "the third split reuses the first one's vector");
        assert_eq!(addresses[3], addresses[1]);
        assert_ne!(addresses[1], addresses[0]);
    }

    /// Whether `read`'s turns are `whole`'s, except that reused turns have no content: the turns
    /// after the reused ones are whole, and among the reused ones at most one, a user turn, keeps
    /// its content. The latest user text is the same as in `whole`.
    fn matches_with_hollows(read: &ReadMessages, whole: &[Turn]) -> bool {
        let hollow =
            |turn: &Turn, whole: &Turn| turn.role == whole.role && turn.content == Content::default();
        let reused = read.turns.iter().take(read.hollow_turns);
        let kept_whole: Vec<&Turn> = reused.filter(|turn| turn.content != Content::default()).collect();
        read.turns.len() == whole.len()
            && read.turns.iter().zip(whole).enumerate().all(|(index, (turn, whole))| {
                turn == whole || (index < read.hollow_turns && hollow(turn, whole))
            })
            && kept_whole.len() <= 1
            && kept_whole.iter().all(|turn| turn.role == Role::User)
            && latest_user_text(&read.turns) == latest_user_text(whole)
    }

    /// The latest user text, as the engine reads it.
    fn latest_user_text(turns: &[Turn]) -> Option<&str> {
        turns.iter().rev().find(|turn| turn.has_user_text()).map(|turn| turn.content.text.as_str())
    }

    /// The memo of `body` read fresh.
    fn memo_of(body: &str) -> MessageMemo {
        let read = read(MessageMemo::default(), body, &mut 0);
        let chains = chains_of(&read.turns);
        read.recollection.remember(read.turns, chains)
    }

    /// A body's digest is the same whether its messages were parsed or taken from the memo, and
    /// another body's differs, whichever part of it changed.
    #[test]
    fn a_body_digest_is_the_same_read_or_reused_and_differs_for_any_other_body() {
        for padding in [300, 0] {
            assert_body_digests(&"x".repeat(padding));
        }
    }

    /// [`a_body_digest_is_the_same_read_or_reused_and_differs_for_any_other_body`] with `padding`
    /// at the end of every message's content.
    fn assert_body_digests(padding: &str) {
        let base = &format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"a{padding}"}},{{"role":"assistant","content":"b{padding}"}},{{"role":"user","content":"c{padding}"}}],"stream":false}}"#
        );
        let base = base.as_str();
        let fresh = read(MessageMemo::default(), base, &mut 0).recollection.body_digest(base.as_bytes());
        assert_ne!(fresh, digest(base.as_bytes()), "digested from its prefix");
        assert_eq!(
            read(MessageMemo::default(), base, &mut 0).recollection.body_digest(base.as_bytes()),
            fresh
        );
        let shorter = &format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"a{padding}"}},{{"role":"assistant","content":"b{padding}"}}],"stream":false}}"#
        );
        let shorter = shorter.as_str();
        for (memo, reused) in [(memo_of(shorter), 2), (memo_of(base), 3)] {
            let through_memo = read(memo, base, &mut 0);
            assert_eq!(through_memo.reused_messages, reused);
            assert_eq!(through_memo.recollection.body_digest(base.as_bytes()), fresh, "{reused} reused");
        }
        let others = [
            // The opening, a separator, a message's bytes, the bytes after the last message.
            base.replace(r#""model":"m""#, r#""model":"n""#),
            base.replace(r#"},{"role":"assistant""#, r#"}, {"role":"assistant""#),
            base.replace(r#""content":"b"#, r#""content":"B"#),
            base.replace(r#""stream":false"#, r#""stream":true"#),
            base.replace("}],", "} ],"),
            shorter.to_owned(),
            r#"{"model":"m","messages":[],"stream":false}"#.to_owned(),
            r#"{"model":"n","messages":[],"stream":false}"#.to_owned(),
        ];
        let mut digests = std::collections::HashSet::from([fresh]);
        for other in &others {
            assert_ne!(other, base);
            for memo in [MessageMemo::default(), memo_of(base)] {
                let digest = read(memo, other, &mut 0).recollection.body_digest(other.as_bytes());
                assert_ne!(digest, fresh, "{other}");
            }
            assert!(
                digests.insert(
                    read(MessageMemo::default(), other, &mut 0).recollection.body_digest(other.as_bytes())
                ),
                "{other}"
            );
        }
    }

    /// A body that opens with the remembered body's messages is found so by one digest, kept open
    /// for the read; one with an earlier message changed is compared message by message, and its
    /// messages before the change are still reused.
    #[test]
    fn a_resent_history_is_recognised_by_one_digest_and_an_edited_one_message_by_message() {
        let first = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#;
        let first_end = first.rfind('}').unwrap() - 1;
        let resent = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        let mut memo = memo_of(first);
        assert_eq!(memo.prefix.map(|prefix| prefix.end), Some(first_end));
        let split = memo.split(Api::OpenAi, resent.as_bytes(), None).unwrap();
        assert_eq!(memo.resumed.as_ref().map(|open| open.end), Some(first_end));
        let read = read_split(memo, resent, split, &mut 0);
        assert_eq!(read.reused_messages, 2);
        let fresh = read_fresh_prefix(resent);
        assert_eq!(
            read.recollection.prefix, fresh,
            "continued from the split's digest: the same as hashed afresh"
        );

        let edited = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"B"},{"role":"user","content":"c"}]}"#;
        let mut memo = memo_of(first);
        let split = memo.split(Api::OpenAi, edited.as_bytes(), None).unwrap();
        assert!(memo.resumed.is_none());
        let read = read_split(memo, edited, split, &mut 0);
        assert_eq!(read.reused_messages, 1, "the message before the edit");
        assert_eq!(read.recollection.prefix, read_fresh_prefix(edited));
    }

    /// A body its reader found to open with the remembered body's bytes resumes from the digest
    /// kept open, without hashing them: the claim is taken as it is made, so a claim about a body
    /// whose opening changed shows that it was used. A claim about another body, or one shorter
    /// than the remembered prefix, is not used, and the digest finds the change.
    #[test]
    fn a_reader_s_comparison_stands_for_the_prefix_digest_only_for_the_body_remembered() {
        let first = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#;
        let first_end = first.rfind('}').unwrap() - 1;
        let resent = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        let edited = resent.replace(r#""content":"b""#, r#""content":"B""#);
        let numbered_memo = || {
            let mut memo = MessageMemo::default();
            memo.set_origin(Some(BodyOrigin { id: 1, shares_opening_with: None }));
            let read = read(memo, first, &mut 0);
            let chains = chains_of(&read.turns);
            read.recollection.remember(read.turns, chains)
        };
        assert_eq!(
            numbered_memo().numbered.map(|numbered| (numbered.id, numbered.prefix.end)),
            Some((1, first_end))
        );

        let claimed = |memo: &mut MessageMemo, earlier: u64, shared: usize| {
            memo.set_origin(Some(BodyOrigin { id: 2, shares_opening_with: Some((earlier, shared)) }));
        };
        // A true claim: resumed, with the digest a fresh read takes, and the new body numbered.
        let mut memo = numbered_memo();
        claimed(&mut memo, 1, first_end);
        let split = memo.split(Api::OpenAi, resent.as_bytes(), None).unwrap();
        assert_eq!(memo.resumed.as_ref().map(|open| open.end), Some(first_end));
        let read = read_split(memo, resent, split, &mut 0);
        assert_eq!(read.reused_messages, 2);
        assert_eq!(read.recollection.prefix, read_fresh_prefix(resent));
        assert_eq!(read.recollection.numbered.as_ref().map(|numbered| numbered.id), Some(2));

        // The same claim for the edited body is believed: no digest checked its opening.
        let mut memo = numbered_memo();
        claimed(&mut memo, 1, first_end);
        let split = memo.split(Api::OpenAi, edited.as_bytes(), None).unwrap();
        assert_eq!(read_split(memo, &edited, split, &mut 0).reused_messages, 2);

        // A claim about another body, or short of the prefix, is not used.
        for (earlier, shared) in [(7, first_end), (1, first_end - 1)] {
            let mut memo = numbered_memo();
            claimed(&mut memo, earlier, shared);
            let split = memo.split(Api::OpenAi, edited.as_bytes(), None).unwrap();
            assert!(memo.resumed.is_none(), "{earlier} {shared}");
            assert_eq!(read_split(memo, &edited, split, &mut 0).reused_messages, 1, "{earlier} {shared}");
        }
        // A memo read from a body without a number takes no claim.
        let mut memo = memo_of(first);
        claimed(&mut memo, 1, first_end);
        let split = memo.split(Api::OpenAi, edited.as_bytes(), None).unwrap();
        assert!(memo.resumed.is_none());
        assert_eq!(read_split(memo, &edited, split, &mut 0).reused_messages, 1);
    }

    /// The prefix digest of `body` read without a memo.
    fn read_fresh_prefix(body: &str) -> Option<Prefix> {
        read(MessageMemo::default(), body, &mut 0).recollection.prefix
    }

    #[test]
    fn an_unchanged_prefix_is_reused_with_its_chains_and_the_rest_is_read() {
        let mut parsed = 0;
        let first = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#;
        let read_first = read(MessageMemo::default(), first, &mut parsed);
        assert_eq!((parsed, read_first.reused_messages), (3, 0));
        let chains = chains_of(&read_first.turns);
        let memo = read_first.recollection.remember(read_first.turns, chains.clone());
        assert_eq!(memo.len(), 3);

        parsed = 0;
        // Other whitespace around the messages and another field: the messages are the same bytes.
        let second = r#"{"model":"m", "messages": [{"role":"system","content":"s"}, {"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        let read_second = read(memo, second, &mut parsed);
        assert_eq!((parsed, read_second.reused_messages), (1, 3));
        assert_eq!(read_second.system, ["s"]);
        assert_eq!(read_second.known_chains, chains);
        let fresh = read(MessageMemo::default(), second, &mut 0);
        assert_eq!(read_second.hollow_turns, 2);
        assert!(
            matches_with_hollows(&read_second, &fresh.turns),
            "reused turns are the ones a fresh read gives, the assistant's without its content: {:?}",
            read_second.turns
        );
        assert_eq!(read_second.turns[1].content, Content::default(), "the reused answer is hollow");
        assert_eq!(read_second.turns[0], fresh.turns[0], "the reused user turn is whole");
        assert_eq!(chains_of(&fresh.turns)[..2], read_second.known_chains[..]);
    }

    #[test]
    fn reuse_stops_at_the_first_changed_message_and_never_crosses_apis() {
        let mut parsed = 0;
        let first = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        let read_first = read(MessageMemo::default(), first, &mut parsed);
        let chains = chains_of(&read_first.turns);
        let memo = read_first.recollection.remember(read_first.turns, chains.clone());

        parsed = 0;
        let edited = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"B"},{"role":"user","content":"c"}]}"#;
        let read_edited = read(memo, edited, &mut parsed);
        assert_eq!(
            (parsed, read_edited.reused_messages),
            (2, 1),
            "only the message before the edit is reused"
        );
        assert_eq!(read_edited.known_chains, chains[..1]);

        let chains = chains_of(&read_edited.turns);
        let mut memo = read_edited.recollection.remember(read_edited.turns, chains);
        let body = Bytes::from(edited.to_owned());
        let split = memo.split(Api::Anthropic, &body, None).unwrap();
        let other_api =
            memo.read(Api::Anthropic, &body, split, |_, _| Ok::<_, String>(Reading::default())).unwrap();
        assert_eq!(other_api.reused_messages, 0, "a memo of the OpenAI API is not used for Anthropic");
    }

    #[test]
    fn only_the_latest_user_text_is_kept_and_an_edit_of_it_is_read_whole() {
        let first = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"},{"role":"assistant","content":"d"}]}"#;
        let read_first = read(MessageMemo::default(), first, &mut 0);
        let chains = chains_of(&read_first.turns);
        let memo = read_first.recollection.remember(read_first.turns, chains);
        assert_eq!(memo.turns[0].content, Content::default(), "an older user turn is hollow");
        assert_eq!(memo.turns[2].content.text, "c", "the latest user turn is whole");

        // A tool loop resends everything and adds no user text: the latest user text is the memo's.
        let mut parsed = 0;
        let resent = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"},{"role":"assistant","content":"d"},{"role":"assistant","content":"e"}]}"#;
        let read_resent = read(memo, resent, &mut parsed);
        assert_eq!((parsed, read_resent.hollow_turns), (1, 4));
        assert!(matches_with_hollows(&read_resent, &read(MessageMemo::default(), resent, &mut 0).turns));
        assert_eq!(latest_user_text(&read_resent.turns), Some("c"));

        // The latest user turn is edited and the answer after it dropped: the messages before it are
        // unchanged, but one of them holds the latest user text the memo hollowed. All are read.
        let chains = chains_of(&read_resent.turns);
        let memo = read_resent.recollection.remember(read_resent.turns, chains);
        parsed = 0;
        let edited = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"assistant","content":"x"}]}"#;
        let read_edited = read(memo, edited, &mut parsed);
        assert_eq!((parsed, read_edited.hollow_turns), (3, 0), "nothing is reused");
        assert_eq!(latest_user_text(&read_edited.turns), Some("a"));
    }

    /// Once a newer user text arrives, the turn the memo kept whole is emptied: the memo holds one
    /// whole turn, the latest user text, however many requests resent the history.
    #[test]
    fn the_memo_keeps_one_whole_turn_as_new_user_texts_arrive() {
        let mut memo = MessageMemo::default();
        let mut messages = Vec::new();
        for round in 0..6 {
            messages.push(format!(r#"{{"role":"user","content":"u{round}"}}"#));
            messages.push(format!(r#"{{"role":"assistant","content":"a{round}"}}"#));
            let body = format!(r#"{{"messages":[{}]}}"#, messages.join(","));
            let read = read(memo, &body, &mut 0);
            assert_eq!(read.hollow_turns, 2 * round, "round {round}");
            let chains = chains_of(&read.turns);
            memo = read.recollection.remember(read.turns, chains);
            let whole: Vec<usize> = (0..memo.turns.len())
                .filter(|&index| memo.turns[index].content != Content::default())
                .collect();
            assert_eq!(whole, vec![2 * round], "round {round}");
        }
    }

    #[test]
    fn a_memo_given_the_wrong_number_of_turns_or_chains_remembers_nothing() {
        let body = r#"{"messages":[{"role":"user","content":"a"}]}"#;
        let read_once = read(MessageMemo::default(), body, &mut 0);
        let turns = read_once.turns.clone();
        assert!(read_once.recollection.remember(turns.clone(), vec![]).is_empty());
        let read_again = read(MessageMemo::default(), body, &mut 0);
        assert!(read_again.recollection.remember(vec![], vec![]).is_empty());
        let read_third = read(MessageMemo::default(), body, &mut 0);
        let chains = chains_of(&turns);
        assert_eq!(read_third.recollection.remember(turns, chains).len(), 1);
    }

    /// A body of `{"role","content"}` messages, each written compactly or with spaces.
    fn body_of(messages: &[(u8, String, bool)]) -> String {
        let roles = ["system", "user", "assistant"];
        let written: Vec<String> = messages
            .iter()
            .map(|(role, text, spaced)| {
                let (role, text) = (roles[usize::from(*role % 3)], serde_json::to_string(text).unwrap());
                if *spaced {
                    format!(r#"{{ "role": "{role}", "content": {text} }}"#)
                } else {
                    format!(r#"{{"role":"{role}","content":{text}}}"#)
                }
            })
            .collect();
        format!(r#"{{"messages":[{}]}}"#, written.join(","))
    }

    proptest::proptest! {
        /// Whatever the client changes between two requests (messages edited, dropped, added, or
        /// written with other bytes), reading with the memo gives the turns, system texts and chain
        /// values a fresh read gives.
        #[test]
        fn reading_with_the_memo_equals_reading_afresh(
            first in proptest::collection::vec((0u8..3, "[a-c]{0,3}", proptest::bool::ANY), 0..8),
            second in proptest::collection::vec((0u8..3, "[a-c]{0,3}", proptest::bool::ANY), 0..8),
            shared in 0usize..8,
        ) {
            // The second request starts with some of the first's messages, as a resent history does.
            let mut next: Vec<_> = first.iter().take(shared).cloned().collect();
            next.extend(second);
            let read_first = read(MessageMemo::default(), &body_of(&first), &mut 0);
            let chains = chains_of(&read_first.turns);
            let memo = read_first.recollection.remember(read_first.turns, chains);

            let with_memo = read(memo, &body_of(&next), &mut 0);
            let fresh = read(MessageMemo::default(), &body_of(&next), &mut 0);
            proptest::prop_assert!(matches_with_hollows(&with_memo, &fresh.turns));
            proptest::prop_assert!(with_memo.hollow_turns == 0 || with_memo.hollow_turns == with_memo.known_chains.len());
            proptest::prop_assert_eq!(&with_memo.system, &fresh.system);
            let all_chains = chains_of(&fresh.turns);
            proptest::prop_assert_eq!(&all_chains[..with_memo.known_chains.len()], &with_memo.known_chains[..]);
            let index = crate::session::transparent::TransparentIndex::in_memory();
            // Hollow turns are never hashed: their chain values are the known ones.
            proptest::prop_assert_eq!(index.split(&with_memo.turns, &with_memo.known_chains).0, all_chains);
        }
    }

    #[test]
    fn a_failed_read_is_returned_as_is() {
        let body = Bytes::from_static(br#"{"messages":[{"role":"user","content":"a"}]}"#);
        let split = MessageMemo::default().split(Api::OpenAi, &body, None).unwrap();
        let failed = MessageMemo::default().read(Api::OpenAi, &body, split, |index, _| {
            Err::<Reading, _>(format!("messages[{index}]: refused"))
        });
        assert_eq!(failed.unwrap_err(), "messages[0]: refused");
    }
}
