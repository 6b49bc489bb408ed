//! Build script: forwards what nginx-sys learned about the nginx build to the compiler, warns about
//! an nginx older than the oldest supported one, and tells the integration tests where the
//! nginx binary is.

use std::env;
use std::path::PathBuf;

/// The oldest nginx the module builds and is tested against (Debian 12's 1.22.1 in CI), as
/// nginx's `nginx_version` number: 1.22.0.
const OLDEST_NGINX_VERSION_NUMBER: u64 = 1_022_000;

fn main() {
    // Differences between supported versions are handled in a version-neutral way in the code
    // (e.g. header elements start zeroed, so `ngx_table_elt_t.next`, which exists from 1.23.0
    // on, is null without being named). Nothing older than 1.22 is built or tested here: warn
    // rather than hand out a module nobody checked without a word.
    println!("cargo::rerun-if-env-changed=DEP_NGINX_VERSION_NUMBER");
    if let Ok(number) = env::var("DEP_NGINX_VERSION_NUMBER") {
        if number.trim().parse::<u64>().unwrap_or(0) < OLDEST_NGINX_VERSION_NUMBER {
            println!(
                "cargo::warning=nginx {} (version number {number}) is older than 1.22.0, the \
                 oldest nginx this module is tested with",
                env::var("DEP_NGINX_VERSION").unwrap_or_default()
            );
        }
    }

    println!("cargo::rerun-if-env-changed=DEP_NGINX_FEATURES");
    println!(
        "cargo::rustc-check-cfg=cfg(ngx_feature, values({}))",
        env::var("DEP_NGINX_FEATURES_CHECK").unwrap_or("any()".to_string())
    );
    if let Ok(features) = env::var("DEP_NGINX_FEATURES") {
        for feature in features.split(',').map(str::trim) {
            println!("cargo::rustc-cfg=ngx_feature=\"{feature}\"");
        }
    }

    // The vendored build leaves the nginx binary next to its objects; tests start that binary.
    // NGINX_BINARY wins when set (testing against another nginx built --with-compat).
    println!("cargo::rerun-if-env-changed=DEP_NGINX_BUILD_DIR");
    println!("cargo::rerun-if-env-changed=NGINX_BINARY");
    let binary = match env::var("NGINX_BINARY") {
        Ok(path) => PathBuf::from(path),
        Err(_) => PathBuf::from(env::var("DEP_NGINX_BUILD_DIR").unwrap_or_default()).join("nginx"),
    };
    println!("cargo::rustc-env=NGINX_BINARY={}", binary.display());
}
