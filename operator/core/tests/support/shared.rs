//! Locating the read-only inputs beside the checkout (`../shared`), or skipping a test without them.

use std::path::{Path, PathBuf};

/// The environment variable that turns a skip for a missing `../shared` into a failure (CI sets it).
pub const REQUIRE_SHARED: &str = "STRATA_REQUIRE_SHARED";

/// `../shared/<relative>` beside the checkout when it exists. When it does not, prints that `test`
/// was skipped and why and returns `None`; with STRATA_REQUIRE_SHARED=1 it panics instead.
pub fn shared_path(test: &str, relative: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let checkout = root.ancestors().find(|dir| dir.join("Cargo.lock").is_file()).unwrap_or(root);
    let path = checkout.join("../shared").join(relative);
    if path.exists() {
        return Some(path);
    }
    let why = format!("{test}: needs {} (the shared test inputs beside the checkout)", path.display());
    if std::env::var(REQUIRE_SHARED).is_ok_and(|v| v == "1") {
        panic!("{why}; {REQUIRE_SHARED}=1 makes this skip a failure");
    }
    eprintln!("skipped {why}; it is absent. Set {REQUIRE_SHARED}=1 to make this an error.");
    None
}
