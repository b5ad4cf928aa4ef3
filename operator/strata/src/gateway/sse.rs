//! Server-sent events: an incremental parser for upstream streams and the encoder for client streams.

use bytes::Bytes;

/// One parsed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// Splits a byte stream into events; partial lines wait for the next chunk.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds `chunk` and returns every event it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.buffer[start..].iter().position(|&byte| byte == b'\n') {
            let end = start + offset;
            let mut line = &self.buffer[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.line(&line, &mut events);
        }
        self.buffer.drain(..start);
        events
    }

    /// Flushes an event left open when the stream ended without a blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut events = Vec::new();
        if !self.buffer.is_empty() {
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.buffer)).into_owned();
            self.line(rest.trim_end_matches('\r'), &mut events);
        }
        self.line("", &mut events);
        events.pop()
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if !self.data.is_empty() || self.event.is_some() {
                events.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data).join("\n"),
                });
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            _ => {}
        }
    }
}

/// Encodes one event for the client.
pub fn encode(event: Option<&str>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(event) = event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_across_chunks() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"event: ping\r\nda").is_empty());
        let events = parser.push(b"ta: {\"a\":1}\n\n: comment\ndata: x\ndata: y\n\n");
        assert_eq!(
            events,
            vec![
                SseEvent { event: Some("ping".into()), data: "{\"a\":1}".into() },
                SseEvent { event: None, data: "x\ny".into() },
            ]
        );
        assert!(parser.push(b"data: [DONE]").is_empty());
        assert_eq!(parser.finish(), Some(SseEvent { event: None, data: "[DONE]".into() }));
    }

    #[test]
    fn encodes_multi_line_data() {
        assert_eq!(
            encode(Some("message_stop"), "a\nb"),
            Bytes::from("event: message_stop\ndata: a\ndata: b\n\n")
        );
    }
}
