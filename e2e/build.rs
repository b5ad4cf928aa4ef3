//! Turns the cluster tests on when STRATA_E2E_KUBECONFIG is set at build time.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(strata_e2e)");
    println!("cargo::rerun-if-env-changed=STRATA_E2E_KUBECONFIG");
    if std::env::var_os("STRATA_E2E_KUBECONFIG").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=strata_e2e");
    }
}
