//! Room kept ahead in the lists that grow with the history, so their reallocations happen between
//! requests instead of inside one.
//!
//! A list that grows by pushing doubles when it is full: it copies every element into a new
//! allocation, whose pages are fresh. For a history of a few thousand entries that is a few hundred
//! KiB and, with cold caches, 50–200 µs, paid by whichever request pushed last. The gateway asks
//! after each answer whether a list is close to full ([`is_low`]) and, when one is, grows it off the
//! request's path ([`make`]), with the same doubling a push would have made.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

/// Pushes a list must be able to take without reallocating; less room than this is low.
pub const ROOM_AHEAD: usize = 64;

/// A growable collection whose room can be read and reserved.
pub trait Room {
    /// Elements held.
    fn held(&self) -> usize;
    /// Elements it can hold without reallocating.
    fn room(&self) -> usize;
    /// Makes room for at least `additional` more elements.
    fn reserve_more(&mut self, additional: usize);
}

/// Implements [`Room`] for collections with `len`, `capacity` and `reserve`.
macro_rules! room_of {
    ($(impl[$($params:tt)*] $collection:ty;)*) => {$(
        impl<$($params)*> Room for $collection {
            fn held(&self) -> usize {
                self.len()
            }
            fn room(&self) -> usize {
                self.capacity()
            }
            fn reserve_more(&mut self, additional: usize) {
                self.reserve(additional);
            }
        }
    )*};
}

room_of! {
    impl[T] Vec<T>;
    impl[K: Eq + Hash, V, S: BuildHasher] HashMap<K, V, S>;
    impl[T: Eq + Hash, S: BuildHasher] HashSet<T, S>;
}

/// Whether `list` has room for fewer than [`ROOM_AHEAD`] more elements.
pub fn is_low(list: &impl Room) -> bool {
    list.room() - list.held() < ROOM_AHEAD
}

/// Doubles `list`'s room when it is low, to at least twice [`ROOM_AHEAD`] free places: a list is
/// low again only after [`ROOM_AHEAD`] more elements, however short it is. Returns whether it grew.
pub fn make(list: &mut impl Room) -> bool {
    let low = is_low(list);
    if low {
        list.reserve_more(list.held().max(2 * ROOM_AHEAD));
    }
    low
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_room_is_doubled_and_enough_room_is_left_alone() {
        let mut list: Vec<u64> = Vec::with_capacity(1_000);
        let capacity = list.capacity();
        list.extend(0..(capacity - ROOM_AHEAD) as u64);
        assert!(!is_low(&list), "room for exactly ROOM_AHEAD pushes is enough");
        list.push(0);
        assert!(is_low(&list), "one place fewer is low");
        assert!(make(&mut list), "low room is grown");
        assert!(list.capacity() >= 2 * (capacity - ROOM_AHEAD + 1), "doubled: {}", list.capacity());
        assert!(!is_low(&list));
        let room = list.capacity();
        assert!(!make(&mut list), "enough room is left alone");
        assert_eq!(list.capacity(), room, "enough room is not grown again");
        let before = list.as_ptr();
        list.extend(0..ROOM_AHEAD as u64);
        assert_eq!(list.as_ptr(), before, "ROOM_AHEAD pushes fit without reallocating");
    }

    #[test]
    fn a_map_gets_room_ahead_too() {
        let mut map: HashMap<u64, u64> = HashMap::new();
        assert!(is_low(&map));
        make(&mut map);
        assert!(!is_low(&map));
        let room = map.capacity();
        map.extend((0..(room - ROOM_AHEAD) as u64).map(|key| (key, key)));
        assert_eq!(map.capacity(), room, "filled to the mark without growing");
        assert!(!is_low(&map));
        map.insert(u64::MAX, 0);
        assert!(is_low(&map));
        make(&mut map);
        assert!(map.capacity() >= 2 * map.len(), "doubled: {} for {}", map.capacity(), map.len());
    }

    #[test]
    fn a_short_list_gets_room_for_more_than_room_ahead() {
        let mut list: Vec<u8> = vec![1, 2];
        assert!(is_low(&list));
        make(&mut list);
        list.extend([0; ROOM_AHEAD]);
        assert!(!is_low(&list), "a short list is low again only after ROOM_AHEAD more elements");
    }
}
