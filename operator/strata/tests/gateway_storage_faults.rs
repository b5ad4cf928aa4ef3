//! Storage faults injected through `Storage` under a running gateway (ENOSPC with a torn append,
//! write errors, fsync errors): the request gets a 503 in the provider's shape, `/readyz` says why
//! the gateway is not ready, nothing is corrupted, and once writes succeed again the engine is
//! reloaded from the journal and the client's retry succeeds without a duplicated turn.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use gateway_support::{FakeUpstream, Harness, args, config, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::journal::{AppendHandle, LockOutcome, SharedSync, StdStorage, Storage};

const HEALTHY: u8 = 0;
const ENOSPC_TORN_APPEND: u8 = 1;
const EIO_WRITE: u8 = 2;
const EIO_FSYNC: u8 = 3;

/// The real file system, failing writes or fsyncs while a fault is armed.
#[derive(Clone, Default)]
struct FaultyStorage {
    mode: Arc<AtomicU8>,
    /// Fsync faults returned through a log's shared handle, the one group commits use.
    shared_fsync_faults: Arc<AtomicU32>,
}

fn os_error(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl FaultyStorage {
    fn write_fault(&self) -> Option<io::Error> {
        match self.mode.load(Ordering::SeqCst) {
            ENOSPC_TORN_APPEND => Some(os_error(28)),
            EIO_WRITE => Some(os_error(5)),
            _ => None,
        }
    }

    fn fsync_fault(&self) -> Option<io::Error> {
        (self.mode.load(Ordering::SeqCst) == EIO_FSYNC).then(|| os_error(5))
    }
}

struct FaultyHandle {
    inner: Box<dyn AppendHandle>,
    storage: FaultyStorage,
}

impl AppendHandle for FaultyHandle {
    fn append(&mut self, data: &[u8]) -> io::Result<()> {
        if let Some(error) = self.storage.write_fault() {
            if self.storage.mode.load(Ordering::SeqCst) == ENOSPC_TORN_APPEND {
                // The disk filled up mid-record: half of it reached the file.
                self.inner.append(&data[..data.len() / 2])?;
            }
            return Err(error);
        }
        self.inner.append(data)
    }

    fn sync(&mut self) -> io::Result<()> {
        match self.storage.fsync_fault() {
            Some(error) => Err(error),
            None => self.inner.sync(),
        }
    }

    /// The real file's shared handle (the one group commits use), failing while a fault is armed.
    fn shared_sync(&self) -> Option<Arc<dyn SharedSync>> {
        let inner = self.inner.shared_sync()?;
        Some(Arc::new(FaultySharedSync { inner, storage: self.storage.clone() }))
    }
}

struct FaultySharedSync {
    inner: Arc<dyn SharedSync>,
    storage: FaultyStorage,
}

impl SharedSync for FaultySharedSync {
    fn sync(&self) -> io::Result<()> {
        match self.storage.fsync_fault() {
            Some(error) => {
                self.storage.shared_fsync_faults.fetch_add(1, Ordering::SeqCst);
                Err(error)
            }
            None => self.inner.sync(),
        }
    }
}

impl Storage for FaultyStorage {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        StdStorage.read(path)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        StdStorage.exists(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        StdStorage.list_dir(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        StdStorage.create_dir_all(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        match self.write_fault() {
            Some(error) => Err(error),
            None => StdStorage.write_file(path, data),
        }
    }
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendHandle>> {
        Ok(Box::new(FaultyHandle { inner: StdStorage.open_append(path)?, storage: self.clone() }))
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        match self.write_fault() {
            Some(error) => Err(error),
            None => StdStorage.truncate(path, len),
        }
    }
    fn sync_file(&self, path: &Path) -> io::Result<()> {
        match self.fsync_fault() {
            Some(error) => Err(error),
            None => StdStorage.sync_file(path),
        }
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        match self.fsync_fault() {
            Some(error) => Err(error),
            None => StdStorage.sync_dir(path),
        }
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        StdStorage.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        StdStorage.remove_file(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        StdStorage.remove_dir(path)
    }
    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockOutcome> {
        StdStorage.try_lock(path, holder)
    }
}

const CHAT: &str = "/v1/chat/completions";

fn alternating(turns: usize) -> Vec<String> {
    (0..turns).map(|turn| if turn % 2 == 0 { "user".to_owned() } else { "assistant".to_owned() }).collect()
}

async fn roles(gateway: &Harness) -> Vec<String> {
    gateway.entries().await.iter().map(|entry| entry["role"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn storage_faults_make_the_gateway_not_ready_and_it_recovers_once_writes_succeed() {
    let fake = FakeUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("gateway.json");
    write_config(&config_path, &config(&fake, Provider::OpenAI, dir.path()));
    let data_dir = dir.path().join("data");
    let storage = FaultyStorage::default();
    let running =
        strata::gateway::start_on(&args(&config_path, &data_dir), Arc::new(storage.clone())).await.unwrap();
    let gateway = Harness { dir, config_path, data_dir, gateway: running, client: reqwest::Client::new() };

    let mut history: Vec<Value> = Vec::new();
    let mut injected: BTreeMap<&str, u32> = BTreeMap::new();
    let faults = [
        (ENOSPC_TORN_APPEND, "enospc_torn_append", "No space left on device"),
        (EIO_WRITE, "eio_write", "Input/output error"),
        (EIO_FSYNC, "eio_fsync", "Input/output error"),
    ];
    for round in 0..3 {
        for (mode, kind, needle) in faults {
            history.push(json!({"role": "user", "content": format!("{kind} round {round}")}));
            storage.mode.store(mode, Ordering::SeqCst);
            let (status, body) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
            assert_eq!(status, 503, "{kind}: {body}");
            assert_eq!(body["error"]["type"], "gateway_unavailable", "{kind}: {body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(needle) && message.contains("send the request again"),
                "{kind}: {message}"
            );
            *injected.entry(kind).or_default() += 1;

            let ready = gateway.client.get(gateway.url("/readyz")).send().await.unwrap();
            assert_eq!(ready.status(), 503, "{kind}: not ready while writes fail");
            let reason = ready.text().await.unwrap();
            assert!(reason.contains("not ready") && reason.contains(needle), "{kind}: {reason}");

            storage.mode.store(HEALTHY, Ordering::SeqCst);
            let ready = gateway.client.get(gateway.url("/readyz")).send().await.unwrap();
            assert_eq!(ready.status(), 200, "{kind}: ready again once writes succeed");
            let (status, body) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
            assert_eq!(status, 200, "{kind}: the retry succeeds: {body}");
            history.push(json!({"role": "assistant", "content": "ok"}));
            assert_eq!(
                roles(&gateway).await,
                alternating(history.len()),
                "{kind}: nothing lost or duplicated"
            );
        }
    }
    assert!(
        storage.shared_fsync_faults.load(Ordering::SeqCst) > 0,
        "the fsync faults reached the group commit's shared handle of the log"
    );
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["engineReloads"], 9, "{status}");
    assert!(status["volumeBytes"].as_u64().unwrap() > 0, "the data volume is measured: {status}");
    let total: u32 = injected.values().sum();
    eprintln!(
        "storage faults injected: {total}; by kind: {injected:?}; engine reloads: {}",
        status["engineReloads"]
    );

    let gateway = gateway.restart().await;
    assert_eq!(
        roles(&gateway).await,
        alternating(history.len()),
        "the journal verifies and replays after a restart"
    );
}
