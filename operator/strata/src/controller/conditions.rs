//! Status conditions: built fresh each reconcile, keeping `lastTransitionTime` when the status of
//! a condition did not change, and compared without timestamps to decide whether to write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition with `lastTransitionTime` = `now`.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(now),
    }
}

/// `desired`, with each condition's transition time taken from `existing` when its status is unchanged.
pub fn carry_transition_times(existing: &[Condition], desired: Vec<Condition>) -> Vec<Condition> {
    desired
        .into_iter()
        .map(|mut condition| {
            if let Some(previous) = existing.iter().find(|c| c.type_ == condition.type_)
                && previous.status == condition.status
            {
                condition.last_transition_time = previous.last_transition_time.clone();
            }
            condition
        })
        .collect()
}

/// Whether two condition lists say the same thing (timestamps aside).
pub fn equivalent(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.type_ == y.type_
                && x.status == y.status
                && x.reason == y.reason
                && x.message == y.message
                && x.observed_generation == y.observed_generation
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_is_kept_only_while_the_status_holds() {
        let earlier = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let later = Timestamp::from_second(2_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let existing = vec![condition("Ready", true, "Running", "", Some(1), earlier)];
        let same =
            carry_transition_times(&existing, vec![condition("Ready", true, "Running", "", Some(1), later)]);
        assert_eq!(same[0].last_transition_time, Time(earlier));
        assert!(equivalent(&existing, &same));
        let flipped =
            carry_transition_times(&existing, vec![condition("Ready", false, "Down", "", Some(1), later)]);
        assert_eq!(flipped[0].last_transition_time, Time(later));
        assert!(!equivalent(&existing, &flipped));
    }
}
