//! Puts the commit vigil was built from into `vigil --version` (`VIGIL_COMMIT`): `git describe`
//! of the checkout, or the `VIGIL_COMMIT` environment variable where there is no checkout (a
//! source archive), else "unknown commit".
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=VIGIL_COMMIT");
    let commit = std::env::var("VIGIL_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown commit".into());
    // A new commit changes HEAD (a detached checkout) or the branch it points to.
    // Only paths that exist: cargo reruns this script on every build for a watched path that is
    // missing (a clone without `packed-refs`), and so rebuilds the agent each time.
    let watch = |path: &str| {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    };
    for path in ["HEAD", "refs/heads", "packed-refs"] {
        watch(path);
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(&r);
    }
    println!("cargo:rustc-env=VIGIL_COMMIT={commit}");
}
