//! The README's snippets and the examples build as a user's crate would:
//! a crate outside the workspace whose only dependency of ours is the
//! facade `resource-broker` with its features (not the workspace's
//! dev-dependencies, which the facade's own doc tests could see).

use std::path::Path;
use std::process::Command;

/// The user's manifest: the facade by path, and the crates the examples
/// use themselves (a user's own choices, at the workspace's versions).
fn manifest(root: &Path) -> String {
    let root = root.display();
    format!(
        r#"[package]
name = "user-app"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[lib]
path = "lib.rs"

[dependencies]
resource-broker = {{ path = "{root}", features = ["redis", "axum"] }}
axum = "0.8"
futures = "0.3"
http-body-util = "0.1"
reqwest = {{ version = "0.12", default-features = false, features = ["json"] }}
serde_json = "1"
sha2 = "0.10"
tokio = {{ version = "1.49", features = ["rt-multi-thread", "macros", "time", "net", "signal", "test-util"] }}
tower = {{ version = "0.5", features = ["limit", "util"] }}
tracing-subscriber = {{ version = "0.3", features = ["env-filter", "fmt"] }}

[[example]]
name = "quickstart"
path = "{root}/examples/quickstart.rs"

[[example]]
name = "llm_client"
path = "{root}/examples/llm_client.rs"

[[example]]
name = "shared_redis"
path = "{root}/examples/shared_redis.rs"

[[example]]
name = "webhook_server"
path = "{root}/examples/webhook_server.rs"
"#
    )
}

/// Runs `cargo <args>` in the user's crate; panics with its output on failure.
fn cargo(dir: &Path, args: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {} failed in a user's crate:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn readme_snippets_and_examples_build_with_the_facade_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("user-crate");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Cargo.toml"), manifest(root)).unwrap();
    let readme = root.join("README.md");
    let lib = format!(
        "//! The README, compiled as a user's doc tests.\n#![doc = include_str!({:?})]\n",
        readme.display().to_string()
    );
    std::fs::write(dir.join("lib.rs"), lib).unwrap();
    if !dir.join("Cargo.lock").exists() {
        std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    }
    cargo(&dir, &["build", "--examples"]);
    cargo(&dir, &["test", "--doc"]);
}
