//! Embeds the commit the `rlany` binary is built from as `RLANY_BUILD_COMMIT`, so that a
//! run's `meta.json` can name the code that ran (`binary_commit`) beside the checkout's HEAD
//! when it started (`git_sha`): a binary kept across commits, as a long suite's is, would
//! otherwise record commits it does not contain. Outside a git checkout it is `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RLANY_BUILD_COMMIT={commit}");
    // Run again when HEAD moves (a commit, a checkout); nothing else changes the answer.
    match git(&["rev-parse", "--absolute-git-dir"]) {
        Some(dir) => {
            // Only paths that exist: cargo reruns a script whose watched path is missing.
            for name in ["HEAD", "refs", "packed-refs"] {
                let path = std::path::Path::new(&dir).join(name);
                if path.exists() {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
        }
        None => println!("cargo:rerun-if-changed=build.rs"),
    }
}
