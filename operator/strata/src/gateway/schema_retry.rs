//! A streamed round held back whole because the model called a tool it saw only summarised before
//! the client saw anything of the round: the gateway loads the schema and repeats the round, and
//! the client never sees the first attempt (the non-streaming path does the same with the whole
//! answer in hand).

/// Per-round state of one stream translator.
#[derive(Debug, Default)]
pub struct SchemaRetryHold {
    /// Client tools this round's call showed only summarised.
    summarised: Vec<String>,
    /// Whether anything of the round (text or a client tool call) reached the client.
    shown: bool,
    /// Whether the round is held back for a repeat.
    held: bool,
}

impl SchemaRetryHold {
    /// Starts a round whose call showed `summarised` tools only as summaries (empty: no repeat).
    pub fn arm(&mut self, summarised: Vec<String>) {
        self.summarised = summarised;
    }

    /// Something of the round reached the client: it can no longer be repeated invisibly.
    pub fn shown(&mut self) {
        self.shown = true;
    }

    /// Whether a client tool call named `name` is kept from the client: every call once the round
    /// is held, and a call to a summarised tool before anything was shown (which holds the round).
    pub fn withholds(&mut self, name: &str) -> bool {
        if !self.held && !self.shown && self.summarised.iter().any(|tool| tool == name) {
            self.held = true;
        }
        self.held
    }

    /// Whether the round is held back for a repeat.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Ends the round.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summarised_call_before_anything_shown_holds_the_round_and_every_later_call() {
        let mut hold = SchemaRetryHold::default();
        hold.arm(vec!["deploy".into()]);
        assert!(!hold.withholds("read_file"), "a fully described tool is shown");
        let mut hold = SchemaRetryHold::default();
        hold.arm(vec!["deploy".into()]);
        assert!(hold.withholds("deploy"));
        assert!(hold.withholds("read_file"), "the held round shows nothing more");
        assert!(hold.is_held());
        hold.reset();
        assert!(!hold.is_held() && !hold.withholds("deploy"), "a new round is not armed");
    }

    #[test]
    fn once_the_client_saw_part_of_the_round_it_is_not_held() {
        let mut hold = SchemaRetryHold::default();
        hold.arm(vec!["deploy".into()]);
        hold.shown();
        assert!(!hold.withholds("deploy"));
        assert!(!hold.is_held());
    }
}
