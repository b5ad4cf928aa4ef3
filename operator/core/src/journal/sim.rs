//! An in-memory [`Storage`] that models durability, injects faults and simulates crashes.
//!
//! Model: every file (inode) has its current bytes and its durable bytes; `sync_file` (or an append
//! handle's `sync`) copies current to durable. The namespace (which path names which inode or
//! directory) exists twice as well: the live one, and the durable one that `sync_dir(d)` updates
//! for the direct children of `d`. At [`SimStorage::crash`], each directory independently keeps
//! either its durable children (the conservative outcome) or, with a small probability, its live
//! children (metadata that happened to reach the disk). Each surviving file falls back to its
//! durable bytes, except that an append-only file may keep a random prefix of its unsynced tail,
//! which models a torn write. Entries whose parent directory did not survive disappear.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::storage::{AppendHandle, LockOutcome, SharedSync, Storage};

/// The kinds of mutating operation a fault can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `write_file`, `append`, `truncate` and lock-file writes.
    Write,
    /// `sync_file` and append-handle `sync`.
    Fsync,
    /// `sync_dir`.
    DirFsync,
    /// `rename`.
    Rename,
    /// `remove_file`, `remove_dir`.
    Remove,
    /// `create_dir_all`.
    CreateDir,
}

/// When to fail and what happens afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Operation kind to count; `None` counts every mutating operation.
    pub kind: Option<OpKind>,
    /// Fail the operation with this 1-based index among the counted ones.
    pub nth: u64,
    /// Whether the process "dies": every later operation fails until [`SimStorage::crash`].
    pub then_crash: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File(u64),
}

#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    live: BTreeMap<PathBuf, Node>,
    durable: BTreeMap<PathBuf, Node>,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    locks: HashMap<PathBuf, u64>,
    lock_epoch: u64,
    counted_ops: u64,
    fault: Option<Fault>,
    dead: bool,
}

/// Simulated storage; cheap to clone (clones share state).
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
}

fn err(kind: io::ErrorKind, message: String) -> io::Error {
    io::Error::new(kind, message)
}

fn not_found(path: &Path) -> io::Error {
    err(io::ErrorKind::NotFound, format!("{} not found", path.display()))
}

fn parent_of(path: &Path) -> Option<&Path> {
    path.parent().filter(|p| !p.as_os_str().is_empty())
}

/// A small deterministic generator (xorshift64*), enough for crash choices.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// Seeds the generator; any seed is fine.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next pseudo-random value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }
}

impl State {
    fn is_dir(&self, path: &Path) -> bool {
        path == Path::new("/") || matches!(self.live.get(path), Some(Node::Dir))
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        match self.live.get(path) {
            Some(Node::File(inode)) => Ok(*inode),
            Some(Node::Dir) => {
                Err(err(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display())))
            }
            None => Err(not_found(path)),
        }
    }

    fn inode_mut(&mut self, inode: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&inode)
            .ok_or_else(|| err(io::ErrorKind::NotFound, format!("inode {inode} vanished")))
    }

    fn require_parent(&self, path: &Path) -> io::Result<()> {
        match parent_of(path) {
            Some(parent) if self.is_dir(parent) => Ok(()),
            Some(parent) => Err(not_found(parent)),
            None => Ok(()),
        }
    }

    fn alive(&self) -> io::Result<()> {
        if self.dead {
            return Err(err(io::ErrorKind::Other, "simulated crash: process is down".into()));
        }
        Ok(())
    }

    fn count(&mut self, kind: OpKind) -> io::Result<()> {
        self.alive()?;
        let Some(fault) = self.fault else {
            return Ok(());
        };
        if fault.kind.is_some_and(|k| k != kind) {
            return Ok(());
        }
        self.counted_ops += 1;
        if self.counted_ops == fault.nth {
            if fault.then_crash {
                self.dead = true;
            }
            return Err(err(
                io::ErrorKind::Other,
                format!("injected {kind:?} failure at counted operation {}", fault.nth),
            ));
        }
        Ok(())
    }

    fn create_file(&mut self, path: &Path) -> io::Result<u64> {
        self.require_parent(path)?;
        if let Some(Node::File(inode)) = self.live.get(path) {
            return Ok(*inode);
        }
        if self.is_dir(path) {
            return Err(err(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display())));
        }
        self.next_inode += 1;
        let inode = self.next_inode;
        self.inodes.insert(inode, Inode::default());
        self.live.insert(path.to_path_buf(), Node::File(inode));
        Ok(inode)
    }
}

impl SimStorage {
    /// An empty file system containing only `/`.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Arms a fault (replacing any previous one) and resets the operation counter.
    pub fn set_fault(&self, fault: Option<Fault>) {
        let mut state = self.lock();
        state.fault = fault;
        state.counted_ops = 0;
    }

    /// How many operations the current fault has counted so far.
    pub fn counted_ops(&self) -> u64 {
        self.lock().counted_ops
    }

    /// Whether an injected crash has taken the "process" down.
    pub fn is_down(&self) -> bool {
        self.lock().dead
    }

    /// Simulates power loss and restart: drops non-durable state as described in the module docs,
    /// releases all locks and clears any fault. `seed` drives the random choices.
    pub fn crash(&self, seed: u64) {
        let mut rng = SimRng::new(seed);
        let mut state = self.lock();
        let mut dirs: Vec<PathBuf> = vec![PathBuf::from("/")];
        dirs.extend(
            state
                .live
                .iter()
                .chain(state.durable.iter())
                .filter(|(_, node)| **node == Node::Dir)
                .map(|(path, _)| path.clone()),
        );
        dirs.sort();
        dirs.dedup();
        let mut chosen: BTreeMap<PathBuf, Node> = BTreeMap::new();
        for dir in &dirs {
            let keep_live = rng.below(8) == 0;
            let source = if keep_live { &state.live } else { &state.durable };
            for (path, node) in source {
                if parent_of(path) == Some(dir.as_path()) {
                    chosen.insert(path.clone(), *node);
                }
            }
        }
        let mut survivors: BTreeMap<PathBuf, Node> = BTreeMap::new();
        for (path, node) in chosen {
            let parent_ok = match parent_of(&path) {
                None => true,
                Some(parent) => parent == Path::new("/") || survivors.get(parent) == Some(&Node::Dir),
            };
            if parent_ok {
                survivors.insert(path, node);
            }
        }
        let live_inodes: Vec<u64> = survivors
            .values()
            .filter_map(|node| match node {
                Node::File(inode) => Some(*inode),
                Node::Dir => None,
            })
            .collect();
        state.inodes.retain(|inode, _| live_inodes.contains(inode));
        for inode in state.inodes.values_mut() {
            let appended_only =
                inode.data.len() > inode.durable.len() && inode.data.starts_with(&inode.durable);
            if appended_only && rng.below(3) == 0 {
                let extra = (inode.data.len() - inode.durable.len()) as u64;
                let keep = inode.durable.len() + rng.below(extra + 1) as usize;
                inode.data.truncate(keep);
            } else {
                inode.data = inode.durable.clone();
            }
            inode.durable = inode.data.clone();
        }
        state.live = survivors.clone();
        state.durable = survivors;
        state.locks.clear();
        state.lock_epoch += 1;
        state.fault = None;
        state.counted_ops = 0;
        state.dead = false;
    }

    /// Makes an open file's bytes durable (a counted fsync).
    fn sync_inode(&self, inode: u64) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Fsync)?;
        let node = state.inode_mut(inode)?;
        node.durable = node.data.clone();
        Ok(())
    }

    /// Flips one bit of a file's current and durable bytes (for corruption tests).
    pub fn flip_bit(&self, path: &Path, bit: u64) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.file(path)?;
        let node = state.inode_mut(inode)?;
        let byte = usize::try_from(bit / 8).map_err(|_| not_found(path))?;
        let mask = 1u8 << (bit % 8);
        for bytes in [&mut node.data, &mut node.durable] {
            let slot = bytes.get_mut(byte).ok_or_else(|| {
                err(io::ErrorKind::InvalidInput, format!("bit {bit} beyond end of {}", path.display()))
            })?;
            *slot ^= mask;
        }
        Ok(())
    }
}

struct SimAppendHandle {
    storage: SimStorage,
    inode: u64,
}

impl AppendHandle for SimAppendHandle {
    fn append(&mut self, data: &[u8]) -> io::Result<()> {
        let mut state = self.storage.lock();
        state.count(OpKind::Write)?;
        state.inode_mut(self.inode)?.data.extend_from_slice(data);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.storage.sync_inode(self.inode)
    }

    fn shared_sync(&self) -> Option<Arc<dyn SharedSync>> {
        Some(Arc::new(SimSharedSync { storage: self.storage.clone(), inode: self.inode }))
    }
}

/// The simulated counterpart of a duplicated descriptor: syncs the same inode.
struct SimSharedSync {
    storage: SimStorage,
    inode: u64,
}

impl SharedSync for SimSharedSync {
    fn sync(&self) -> io::Result<()> {
        self.storage.sync_inode(self.inode)
    }
}

struct SimLockGuard {
    storage: SimStorage,
    path: PathBuf,
    epoch: u64,
}

impl Drop for SimLockGuard {
    fn drop(&mut self) {
        let mut state = self.storage.lock();
        if state.locks.get(&self.path) == Some(&self.epoch) {
            state.locks.remove(&self.path);
        }
    }
}

impl Storage for SimStorage {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.lock();
        state.alive()?;
        let inode = state.file(path)?;
        Ok(state.inode_mut(inode)?.data.clone())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let state = self.lock();
        state.alive()?;
        Ok(state.is_dir(path) || state.live.contains_key(path))
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let state = self.lock();
        state.alive()?;
        if !state.is_dir(path) {
            return Err(not_found(path));
        }
        Ok(state
            .live
            .keys()
            .filter(|child| parent_of(child) == Some(path))
            .filter_map(|child| child.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        let mut state = self.lock();
        state.alive()?;
        if state.is_dir(path) {
            return Ok(None);
        }
        let inode = state.file(path)?;
        Ok(Some(state.inode_mut(inode)?.data.len() as u64))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::CreateDir)?;
        let mut missing = Vec::new();
        let mut cursor = Some(path);
        while let Some(dir) = cursor {
            if state.is_dir(dir) {
                break;
            }
            if state.live.contains_key(dir) {
                return Err(err(io::ErrorKind::AlreadyExists, format!("{} is a file", dir.display())));
            }
            missing.push(dir.to_path_buf());
            cursor = parent_of(dir);
        }
        for dir in missing {
            state.live.insert(dir, Node::Dir);
        }
        Ok(())
    }

    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Write)?;
        let inode = state.create_file(path)?;
        state.inode_mut(inode)?.data = data.to_vec();
        Ok(())
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendHandle>> {
        let mut state = self.lock();
        state.alive()?;
        let inode = match state.file(path) {
            Ok(inode) => inode,
            Err(_) => {
                state.count(OpKind::Write)?;
                state.create_file(path)?
            }
        };
        Ok(Box::new(SimAppendHandle { storage: self.clone(), inode }))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Write)?;
        let inode = state.file(path)?;
        let len = usize::try_from(len).map_err(|_| not_found(path))?;
        state.inode_mut(inode)?.data.truncate(len);
        Ok(())
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Fsync)?;
        let inode = state.file(path)?;
        let node = state.inode_mut(inode)?;
        node.durable = node.data.clone();
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::DirFsync)?;
        if !state.is_dir(path) {
            return Err(not_found(path));
        }
        let is_child = |child: &PathBuf| parent_of(child) == Some(path);
        state.durable.retain(|child, _| !is_child(child));
        let children: Vec<(PathBuf, Node)> = state
            .live
            .iter()
            .filter(|(child, _)| is_child(child))
            .map(|(child, node)| (child.clone(), *node))
            .collect();
        state.durable.extend(children);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Rename)?;
        let inode = state.file(from)?;
        state.require_parent(to)?;
        if state.is_dir(to) {
            return Err(err(io::ErrorKind::IsADirectory, format!("{} is a directory", to.display())));
        }
        state.live.remove(from);
        state.live.insert(to.to_path_buf(), Node::File(inode));
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Remove)?;
        state.file(path)?;
        state.live.remove(path);
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.count(OpKind::Remove)?;
        if !matches!(state.live.get(path), Some(Node::Dir)) {
            return Err(not_found(path));
        }
        if state.live.keys().any(|child| parent_of(child) == Some(path)) {
            return Err(err(io::ErrorKind::DirectoryNotEmpty, format!("{} is not empty", path.display())));
        }
        state.live.remove(path);
        Ok(())
    }

    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockOutcome> {
        let mut state = self.lock();
        state.alive()?;
        if state.locks.contains_key(path) {
            let inode = state.file(path)?;
            let text = String::from_utf8_lossy(&state.inode_mut(inode)?.data).into_owned();
            return Ok(LockOutcome::HeldBy(text));
        }
        state.count(OpKind::Write)?;
        let inode = state.create_file(path)?;
        state.inode_mut(inode)?.data = holder.as_bytes().to_vec();
        let epoch = state.lock_epoch;
        state.locks.insert(path.to_path_buf(), epoch);
        drop(state);
        Ok(LockOutcome::Acquired(Box::new(SimLockGuard {
            storage: self.clone(),
            path: path.to_path_buf(),
            epoch,
        })))
    }
}
