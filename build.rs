//! Build script: forwards what nginx-sys learned about the nginx build to the compiler and
//! tells the integration tests where the nginx binary is.

use std::env;
use std::path::PathBuf;

fn main() {
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
